package engine

import (
	"errors"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/internal/record"
)

// failingRand is a Rand that must not be read.
type failingRand struct{}

func (failingRand) Read([]byte) (int, error) { return 0, errors.New("the secret was drawn again") }

// seeded is a Rand that gives the same bytes for the same seed.
func seeded(seed uint64) *rand.ChaCha8 {
	var s [32]byte
	s[0] = byte(seed)
	return rand.NewChaCha8(s)
}

// TestStoreSecret: a new store draws its secret from Options.Rand, so a
// seeded Rand gives a deterministic store and two seeds two secrets; it
// is drawn once, kept across reopens, and carried by a backup. A store
// in the current layout whose secret is gone is refused read-write (a
// new one would change every derived id) and reported by Check.
func TestStoreSecret(t *testing.T) {
	open := func(dir string, opts Options) *Engine {
		t.Helper()
		e, err := Open(dir, &opts)
		require.NoError(t, err)
		return e
	}
	v := &env{t: t, dir: t.TempDir(), clock: fakeclock.New(t0)}
	v.opts = Options{Clock: v.clock, Rand: seeded(1), NoBackgroundSweep: true}
	v.open()
	t.Cleanup(func() { _ = v.e.Close() })
	s1 := v.e.secret
	require.Len(t, s1, record.SecretLen)
	same := open(t.TempDir(), Options{Rand: seeded(1), NoBackgroundSweep: true})
	require.Equal(t, s1, same.secret, "a seeded Rand gives a deterministic store")
	require.NoError(t, same.Close())
	other := open(t.TempDir(), Options{Rand: seeded(2), NoBackgroundSweep: true})
	require.NotEqual(t, s1, other.secret)
	require.NoError(t, other.Close())
	_, err := Open(t.TempDir(), &Options{Rand: failingRand{}, NoBackgroundSweep: true})
	require.ErrorContains(t, err, "drawn again", "a new store needs its secret")

	v.opts.Rand = failingRand{}
	v.reopen()
	require.Equal(t, s1, v.e.secret, "kept, not drawn again")
	backup := filepath.Join(t.TempDir(), "backup")
	require.NoError(t, v.e.Backup(ctx, backup))
	b := open(backup, v.opts)
	require.Equal(t, s1, b.secret, "a backup carries the secret")
	require.NoError(t, b.Close())
	v.requireSound()

	for name, secret := range map[string][]byte{"no secret": nil, "a short secret": make([]byte, 16)} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "copy")
			require.NoError(t, v.e.Backup(ctx, dir))
			db, err := pebble.Open(dir, v.opts.EnsureDefaults().PebbleOptions())
			require.NoError(t, err)
			if secret == nil {
				require.NoError(t, db.Delete(secretKey, pebble.Sync))
			} else {
				require.NoError(t, db.Set(secretKey, secret, pebble.Sync))
			}
			require.NoError(t, db.Close())
			_, err = Open(dir, &v.opts)
			require.ErrorIs(t, err, record.ErrCorrupt)
			ro := v.opts
			ro.ReadOnly = true
			e, err := Open(dir, &ro)
			if secret != nil {
				require.ErrorIs(t, err, record.ErrCorrupt)
				return
			}
			require.NoError(t, err)
			defer e.Close()
			rep, err := e.Check(ctx)
			require.NoError(t, err)
			require.Equal(t, 1, rep.ProblemCount, "%v", rep.Problems)
			require.Contains(t, rep.Problems[0].What, "no secret")
		})
	}
}
