package engine

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemkv/idemkv"
	"github.com/stretchr/testify/require"
)

// completeWithEffect completes key locally with a value and an event.
func (v *env) completeWithEffect(key string) idemkv.Result {
	c := v.claim(id(key), fpA, idemkv.ModeLocal)
	require.Equal(v.t, idemkv.Acquired, c.Outcome, key)
	r := idemkv.Result{Status: 201, Pointer: "/v1/payments/" + key}
	require.NoError(v.t, v.e.Complete(ctx, c.Lease, r, func(fx idemkv.Effects) error {
		if err := fx.Set([]byte("pay/"+key), []byte(key)); err != nil {
			return err
		}
		return fx.Emit(idemkv.Event{Topic: "payments.created", Key: "acct_1", Payload: []byte(key)})
	}))
	return r
}

// TestBackup: a backup taken while a writer completes operations holds
// every outcome that returned before the call, with its effect, each
// operation running meanwhile whole or not at all, the durable remote
// claim in progress; it opens as a store whose check is clean, and the
// store it was taken from goes on.
func TestBackup(t *testing.T) {
	v := newEnv(t)
	before := map[string]idemkv.Result{}
	for i := range 50 {
		k := fmt.Sprint("before-", i)
		before[k] = v.completeWithEffect(k)
	}
	remote := v.claim(id("remote"), fpA, idemkv.ModeRemote)
	require.Equal(t, idemkv.Acquired, remote.Outcome)

	var (
		wg       sync.WaitGroup
		stop     atomic.Bool
		returned atomic.Int64 // completions of live-i that returned, in order
	)
	wg.Go(func() {
		for i := 0; !stop.Load(); i++ {
			v.completeWithEffect(fmt.Sprint("live-", i))
			returned.Add(1)
		}
	})
	for i := 0; returned.Load() < 20; i++ {
		v.completeWithEffect(fmt.Sprint("main-", i)) // busy alongside, not a sleep
	}
	done := returned.Load()
	dir := filepath.Join(t.TempDir(), "backup")
	require.NoError(t, v.e.Backup(ctx, dir))
	stop.Store(true)
	wg.Wait()
	require.Error(t, v.e.Backup(ctx, dir), "a backup into an existing directory")
	v.completeWithEffect("after") // the live store goes on

	b, err := Open(dir, &Options{Clock: v.clock, NoBackgroundSweep: true})
	require.NoError(t, err)
	defer b.Close()
	rep, err := b.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%v", rep.Problems)
	replays := func(key string) bool {
		c, err := b.Claim(ctx, idemkv.ClaimRequest{ID: id(key), Fingerprint: fpA})
		require.NoError(t, err)
		if c.Outcome == idemkv.Acquired {
			require.NoError(t, b.Release(ctx, c.Lease, nil))
			return false
		}
		require.Equal(t, idemkv.Replay, c.Outcome, key)
		v, err := b.GetData(ctx, []byte("pay/"+key))
		require.NoError(t, err, "%s replays without its effect", key)
		require.Equal(t, key, string(v))
		return true
	}
	for k, r := range before {
		require.True(t, replays(k), k)
		rec, err := b.Get(ctx, id(k))
		require.NoError(t, err)
		require.Equal(t, r, rec.Result)
	}
	for i := range done {
		require.True(t, replays(fmt.Sprint("live-", i)), "live-%d returned before the backup", i)
	}
	require.False(t, replays("after"))
	rec, err := b.Get(ctx, id("remote"))
	require.NoError(t, err)
	require.Equal(t, idemkv.StateInProgress, rec.State)
	require.Equal(t, remote.Lease.Token, rec.Token)

	require.NoError(t, v.e.Close())
	require.ErrorIs(t, v.e.Backup(ctx, filepath.Join(t.TempDir(), "closed")), idemkv.ErrClosed)
	v.e = nil
}

// TestBackupRefusesTheStoresOwnDirectory: a copy inside the store's own
// directory would be copied again by every later backup; it is refused,
// and nothing is made.
func TestBackupRefusesTheStoresOwnDirectory(t *testing.T) {
	v := newEnv(t)
	link := filepath.Join(t.TempDir(), "link")
	require.NoError(t, os.Symlink(v.dir, link))
	for _, dir := range []string{v.dir, filepath.Join(v.dir, "backup"), filepath.Join(v.dir, "a", "..", "b"), filepath.Join(link, "backup")} {
		require.ErrorIs(t, v.e.Backup(ctx, dir), idemkv.ErrInvalidArgument, dir)
	}
	_, err := os.Stat(filepath.Join(v.dir, "backup"))
	require.ErrorIs(t, err, os.ErrNotExist)
	require.NoError(t, v.e.Backup(ctx, v.dir+"-copy"), "a sibling directory")
}
