package engine

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/idemkv/idemkv"
	"github.com/stretchr/testify/require"
)

// lowDiskFS reports the free space the test sets, over the real disk.
type lowDiskFS struct {
	vfs.FS
	avail atomic.Uint64
}

func (fs *lowDiskFS) GetDiskUsage(path string) (vfs.DiskUsage, error) {
	u, err := fs.FS.GetDiskUsage(path)
	u.AvailBytes = fs.avail.Load()
	return u, err
}

// TestLowDiskRefusesNewWork: while free space is below MinFreeDisk, claims
// that would start work fail with ErrNoSpace, and nothing else changes:
// replays go on, work in progress completes; once space returns, claims
// acquire again.
func TestLowDiskRefusesNewWork(t *testing.T) {
	v := newEnv(t)
	fs := &lowDiskFS{FS: vfs.Default}
	fs.avail.Store(1 << 30)
	v.opts.FS = fs
	v.opts.MinFreeDisk = 64 << 20
	v.reopen()

	done := v.claim(id("done"), fpA, idemkv.ModeLocal)
	require.NoError(t, v.e.Complete(ctx, done.Lease, idemkv.Result{Status: 201}, nil))
	held := v.claim(id("held"), fpA, idemkv.ModeRemote)
	stale := v.claim(id("stale"), fpA, idemkv.ModeLocal)

	fs.avail.Store(1 << 20) // the disk fills up
	v.clock.Advance(31 * time.Second)
	for _, key := range []string{"new", "stale"} { // a first claim, a takeover
		_, err := v.e.Claim(ctx, idemkv.ClaimRequest{ID: id(key), Fingerprint: fpA})
		require.ErrorIs(t, err, idemkv.ErrNoSpace, key)
	}
	requireRefusals(t, v.e, 2)
	c := v.claim(id("done"), fpA, idemkv.ModeLocal)
	require.Equal(t, idemkv.Replay, c.Outcome, "replays go on")
	require.NoError(t, v.e.Complete(ctx, held.Lease, idemkv.Result{Status: 202}, nil), "work in progress completes")
	_, err := v.e.Get(ctx, id("new"))
	require.ErrorIs(t, err, idemkv.ErrNotFound, "nothing was stored for the refused claim")

	fs.avail.Store(1 << 30) // space returns; the engine looks again a second later
	_, err = v.e.Claim(ctx, idemkv.ClaimRequest{ID: id("new"), Fingerprint: fpA})
	require.ErrorIs(t, err, idemkv.ErrNoSpace)
	requireRefusals(t, v.e, 3)
	v.clock.Advance(time.Second)
	require.Equal(t, idemkv.Acquired, v.claim(id("new"), fpA, idemkv.ModeLocal).Outcome)
	c = v.claim(id("stale"), fpA, idemkv.ModeLocal)
	require.Equal(t, idemkv.Acquired, c.Outcome)
	require.Greater(t, c.Lease.Token, stale.Lease.Token)
	requireRefusals(t, v.e, 3) // acquisitions, replays and completions count none
}

// requireRefusals asserts that e's disk guard has refused n claims since
// Open (Stats.DiskRefusals).
func requireRefusals(t *testing.T, e *Engine, n int64) {
	t.Helper()
	st, err := e.Stats()
	require.NoError(t, err)
	require.Equal(t, n, st.DiskRefusals)
}
