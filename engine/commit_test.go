package engine

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
)

// TestCommitterCombines: concurrent writers share commits, every write is
// in the store when its writer returns, and a lone writer commits alone.
func TestCommitterCombines(t *testing.T) {
	db, err := pebble.Open(t.TempDir(), &pebble.Options{})
	require.NoError(t, err)
	defer db.Close()
	c := newCommitter(db)

	b := db.NewBatch()
	require.NoError(t, b.Set([]byte("alone"), []byte("1"), nil))
	require.NoError(t, c.commit(b))
	require.NoError(t, b.Close())
	require.EqualValues(t, 1, c.groups.Load())

	const writers, each = 32, 50
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				k := []byte(fmt.Sprintf("w%02d-%03d", w, i))
				b := db.NewBatch()
				_ = b.Set(k, k, nil)
				if err := c.commit(b); err != nil {
					t.Error(err)
				}
				_ = b.Close()
				// Durable and visible once commit returns.
				v, closer, err := db.Get(k)
				if err != nil {
					t.Errorf("%s missing after commit: %v", k, err)
					continue
				}
				if string(v) != string(k) {
					t.Errorf("%s = %q", k, v)
				}
				closer.Close()
			}
		})
	}
	wg.Wait()
	require.EqualValues(t, 1+writers*each, c.writes.Load())
	require.Less(t, c.groups.Load(), int64(1+writers*each), "concurrent writers should share commits")
	t.Logf("%d writes in %d commits", c.writes.Load(), c.groups.Load())
}

// TestCommitterSplitsLargeGroups: a group stops taking members at
// maxGroupBytes, and an oversized batch still commits.
func TestCommitterSplitsLargeGroups(t *testing.T) {
	db, err := pebble.Open(t.TempDir(), &pebble.Options{})
	require.NoError(t, err)
	defer db.Close()
	c := newCommitter(db)
	big := make([]byte, maxGroupBytes)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			b := db.NewBatch()
			_ = b.Set([]byte{byte(i)}, big, nil)
			require.NoError(t, c.commit(b))
			_ = b.Close()
		})
	}
	wg.Wait()
	require.EqualValues(t, 4, c.groups.Load(), "each oversized batch commits in a group of its own")
}

// TestCommitterUnsyncedRidesAlong: a batch enqueued without a sync commits
// alone without an fsync on an idle committer, and rides in the open group
// (synced with it, in queue order) when there is one.
func TestCommitterUnsyncedRidesAlong(t *testing.T) {
	var syncs atomic.Int64
	fs := errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if isLogSync(op) {
			syncs.Add(1)
		}
		return nil
	}))
	db, err := pebble.Open(t.TempDir(), &pebble.Options{FS: fs, Logger: quietLogger{}})
	require.NoError(t, err)
	defer db.Close()
	c := newCommitter(db)
	batch := func(del bool, k string) *pebble.Batch {
		b := db.NewBatch()
		if del {
			_ = b.Delete([]byte(k), nil)
		} else {
			_ = b.Set([]byte(k), []byte(k), nil)
		}
		return b
	}

	// Idle: the unsynced batch commits alone, without an fsync.
	before := syncs.Load()
	g, first, err := c.enqueue(batch(false, "idle"), false, nil)
	require.NoError(t, err)
	require.True(t, first)
	require.NoError(t, c.wait(g, first))
	require.Equal(t, before, syncs.Load())
	_, closer, err := db.Get([]byte("idle"))
	require.NoError(t, err)
	closer.Close()

	// Busy: pretend a group is running, so that a synced writer opens the
	// next group and waits for its turn; an unsynced delete and then a set
	// of the same key join that group, in that order.
	c.mu.Lock()
	c.mu.running++
	c.mu.Unlock()
	done := make(chan error)
	go func() { done <- c.commit(batch(false, "writer")) }()
	for {
		c.mu.Lock()
		n := len(c.mu.open)
		c.mu.Unlock()
		if n == 1 {
			break
		}
		runtime.Gosched()
	}
	g, first, err = c.enqueue(batch(true, "k"), false, nil)
	require.NoError(t, err)
	require.False(t, first, "the delete joins the writer's group")
	g2, first2, err := c.enqueue(batch(false, "k"), true, nil)
	require.NoError(t, err)
	require.False(t, first2)
	require.Same(t, g, g2)
	before = syncs.Load()
	c.mu.Lock()
	c.mu.running--
	c.startLocked()
	c.mu.Unlock()
	require.NoError(t, <-done)
	require.NoError(t, c.wait(g, false))
	require.Equal(t, before+1, syncs.Load(), "one fsync for the whole group")
	v, closer, err := db.Get([]byte("k"))
	require.NoError(t, err, "the set queued after the delete wins")
	require.Equal(t, "k", string(v))
	closer.Close()
}

// Stats reports the committer's work: every synced write of the engine is
// counted in a group, and the fsync wait is part of the commit time.
func TestStatsReportCommits(t *testing.T) {
	v := newEnv(t)
	st0, err := v.e.Stats()
	require.NoError(t, err)

	const n = 64
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			k := id(fmt.Sprintf("k%03d", i))
			c, err := v.e.Claim(ctx, idemkv.ClaimRequest{ID: k, Fingerprint: fpA})
			if err == nil {
				err = v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, nil)
			}
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	st, err := v.e.Stats()
	require.NoError(t, err)
	groups, writes := st.CommitGroups-st0.CommitGroups, st.CommitWrites-st0.CommitWrites
	require.EqualValues(t, n, writes, "one synced write per local completion")
	require.Positive(t, groups)
	require.LessOrEqual(t, groups, writes)
	busy, wait := st.CommitTime-st0.CommitTime, st.CommitSyncWait-st0.CommitSyncWait
	require.Positive(t, wait, "a synced commit waits for its fsync")
	require.LessOrEqual(t, wait, busy)
}
