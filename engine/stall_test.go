package engine

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv"
	"github.com/stretchr/testify/require"
)

// TestWriteStallsCounted drives real Pebble into a write stall and out of
// it, and reads it back from Stats: automatic compactions are off and
// writes stop at two level-0 sublevels, so two flushes of the same key
// fill level 0 and a third flush waits (Pebble checks for a stall before
// it rotates the memtable) until a manual compaction empties level 0. A
// ConfigurePebble that replaces the engine's listener (rather than teeing
// it) would leave the counts at zero.
func TestWriteStallsCounted(t *testing.T) {
	began := make(chan string, 1)
	o := &Options{
		NoBackgroundSweep:     true,
		ClaimFilterBitsPerKey: -1,
		ConfigurePebble: func(po *pebble.Options) {
			po.DisableAutomaticCompactions = true
			po.L0CompactionThreshold = 1
			po.L0StopWritesThreshold = 2
			// Observe the stall's beginning, teed with the engine's listener.
			l := pebble.EventListener{WriteStallBegin: func(info pebble.WriteStallBeginInfo) {
				select {
				case began <- info.Reason:
				default:
				}
			}}
			l = pebble.TeeEventListener(*po.EventListener, l)
			po.EventListener = &l
		},
	}
	e, err := Open(t.TempDir(), o)
	require.NoError(t, err)
	defer e.Close()

	st, err := e.Stats()
	require.NoError(t, err)
	require.Zero(t, st.WriteStalls)
	require.Zero(t, st.WriteStallTime)

	// Two flushes of overlapping files: two level-0 sublevels.
	for i := range 2 {
		c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id("k"), Fingerprint: []byte(fmt.Sprint(i)), Mode: idemkv.ModeRemote})
		require.NoError(t, err)
		require.NoError(t, e.Release(ctx, c.Lease, nil))
		require.NoError(t, e.Flush())
	}
	require.GreaterOrEqual(t, e.db.Metrics().Levels[0].Sublevels, int32(2), "level 0 is full")

	// The memtable is empty now, so the manual compaction below need not
	// flush it (which would wait behind the stalled flush). Nothing is
	// asserted until the compaction has ended the stall: a test that
	// stopped early would leave Close waiting behind the flush.
	flushed := make(chan error, 1)
	go func() { flushed <- e.Flush() }()
	var reason string
	select {
	case reason = <-began:
	case err := <-flushed:
		flushed <- err // it did not stall; kept for below
	case <-time.After(time.Minute):
	}
	during, duringErr := e.Stats()
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	compactErr := e.Compact(cctx) // a manual compaction runs with automatic ones off
	var flushErr error
	select {
	case flushErr = <-flushed:
	case <-time.After(time.Minute):
		t.Fatal("the flush did not finish after the compaction")
	}
	after, afterErr := e.Stats()

	require.Contains(t, reason, "L0", "the third flush stalled on level 0")
	require.NoError(t, duringErr)
	require.EqualValues(t, 1, during.WriteStalls, "a stall counts when it begins")
	require.NoError(t, compactErr)
	require.NoError(t, flushErr)
	require.NoError(t, afterErr)
	require.EqualValues(t, 1, after.WriteStalls)
	require.Positive(t, after.WriteStallTime)
	require.GreaterOrEqual(t, after.WriteStallTime, during.WriteStallTime, "the stall's time counted while it lasted is kept")
}
