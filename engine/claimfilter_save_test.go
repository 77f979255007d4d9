package engine

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/idemkv/idemkv"
	"github.com/stretchr/testify/require"
)

// reopenScanning closes the engine and opens it without the filter Close
// saved, so that the filter is built by the scan.
func (v *env) reopenScanning() {
	require.NoError(v.t, v.e.Close())
	err := os.Remove(filepath.Join(v.dir, filterFile))
	if !errors.Is(err, os.ErrNotExist) {
		require.NoError(v.t, err)
	}
	v.open()
}

// requireKeysFound claims every key of keys, which are stored: each must
// replay.
func (v *env) requireKeysFound(keys []string) {
	v.t.Helper()
	for _, k := range keys {
		require.Equal(v.t, idemkv.Replay, v.claim(id(k), fpA, idemkv.ModeLocal).Outcome, "key %s", k)
	}
}

func (v *env) completeAll(prefix string, n int) []string {
	var keys []string
	for i := range n {
		k := fmt.Sprintf("%s-%d", prefix, i)
		v.complete(id(k))
		keys = append(keys, k)
	}
	return keys
}

// A clean Close saves the filter and the next Open uses it at once,
// without scanning: the stored keys are in it, new keys skip Pebble.
func TestClaimFilterSavedAtCloseIsUsedAtOpen(t *testing.T) {
	fs := hookFilter(t)
	v := newEnv(t)
	fs.await(t, "built")
	v.opts.ReplayCacheSize = -1 // every replay must pass the filter
	keys := v.completeAll("stored", 50)
	v.reopen()

	select {
	case <-v.e.ClaimFilterBuilt():
	default:
		t.Fatal("the saved filter must be in use when Open returns")
	}
	st := v.stats()
	require.True(t, st.ClaimFilterSaved)
	require.EqualValues(t, 1, st.ClaimFilterBuilds)
	require.NoFileExists(t, filepath.Join(v.dir, filterFile), "Open removes the file it used")
	select {
	case stage := <-fs.reached:
		t.Fatalf("no build may run after a saved filter was loaded, got %q", stage)
	default:
	}

	v.requireKeysFound(keys)
	for i := range 500 {
		require.Equal(t, idemkv.Acquired, v.claim(id(fmt.Sprintf("new-%d", i)), fpA, idemkv.ModeLocal).Outcome)
	}
	st = v.stats()
	require.Greater(t, st.ClaimFilterSkips, int64(450))
}

// A saved filter is stale once the store has been opened without using
// it: records written by that Open (here one without a filter, as an
// older engine would be) are not in it. The next Open must see that and
// scan, or those records' retries would run their effects again.
func TestClaimFilterStaleSavedFilterIsNotUsed(t *testing.T) {
	v := newEnv(t)
	<-v.e.ClaimFilterBuilt()
	before := v.completeAll("before", 20)
	require.NoError(t, v.e.Close())
	require.FileExists(t, filepath.Join(v.dir, filterFile))
	saved, err := os.ReadFile(filepath.Join(v.dir, filterFile))
	require.NoError(t, err)

	// An Open that neither reads nor saves a filter writes more records;
	// then the file is put back, as if that Open had not removed it.
	v.opts.ClaimFilterBitsPerKey = -1
	v.open()
	after := v.completeAll("after", 20)
	require.NoError(t, v.e.Close())
	require.NoError(t, os.WriteFile(filepath.Join(v.dir, filterFile), saved, 0o600))

	v.opts.ClaimFilterBitsPerKey = 0
	v.opts.ReplayCacheSize = -1
	v.open()
	<-v.e.ClaimFilterBuilt()
	require.False(t, v.stats().ClaimFilterSaved)
	v.requireKeysFound(before)
	v.requireKeysFound(after)
}

// A save that crashes part way leaves a temporary file, which the next
// Open ignores and removes; a saved file torn or damaged afterwards fails
// its checksum; a file from another store is refused. Each time the
// filter is built by scanning, and every stored key is found.
func TestClaimFilterDamagedSaveIsNotUsed(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, dir string, other string)
	}{
		{"crash during save", func(t *testing.T, dir, _ string) {
			// The hook failed the save; a crash would also leave the
			// part written.
			require.NoError(t, os.WriteFile(filepath.Join(dir, filterFile+".tmp"), []byte(filterMagic+"partial"), 0o600))
		}},
		{"torn file", func(t *testing.T, dir, _ string) {
			name := filepath.Join(dir, filterFile)
			fi, err := os.Stat(name)
			require.NoError(t, err)
			require.NoError(t, os.Truncate(name, fi.Size()-100))
		}},
		{"flipped bit", func(t *testing.T, dir, _ string) {
			name := filepath.Join(dir, filterFile)
			b, err := os.ReadFile(name)
			require.NoError(t, err)
			b[len(b)/2] ^= 0x10
			require.NoError(t, os.WriteFile(name, b, 0o600))
		}},
		{"another store's file", func(t *testing.T, dir, other string) {
			b, err := os.ReadFile(filepath.Join(other, filterFile))
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(filepath.Join(dir, filterFile), b, 0o600))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Another store with the same epoch, saved at its Close.
			o := newEnv(t)
			<-o.e.ClaimFilterBuilt()
			require.NoError(t, o.e.Close())
			o.e = nil

			v := newEnv(t)
			<-v.e.ClaimFilterBuilt()
			keys := v.completeAll("stored", 30)
			if tc.name == "crash during save" {
				testHookFilterSave = func(n int64) error { return errors.New("crash") }
			}
			require.NoError(t, v.e.Close())
			testHookFilterSave = nil
			if tc.name == "crash during save" {
				require.NoFileExists(t, filepath.Join(v.dir, filterFile))
			}
			tc.damage(t, v.dir, o.dir)

			v.opts.ReplayCacheSize = -1
			v.open()
			<-v.e.ClaimFilterBuilt()
			require.False(t, v.stats().ClaimFilterSaved)
			require.NoFileExists(t, filepath.Join(v.dir, filterFile))
			require.NoFileExists(t, filepath.Join(v.dir, filterFile+".tmp"))
			v.requireKeysFound(keys)
		})
	}
}
