package httpoverhead

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv/bench"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/internal/tier"
)

func TestHTTPRun(t *testing.T) {
	tier.Require(t, "runs for a second")
	// Memtables small enough that the stores flush during the slices, so
	// that their background work is counted.
	cfg := &Options{Options: bench.Options{Tenants: 10, Dir: t.TempDir(), Engine: &engine.Options{MemTableSize: 16 << 10}},
		Rate: 1000, Clients: 4, Slice: 200 * time.Millisecond, Slices: 2}
	rep, err := Run(context.Background(), cfg)
	require.NoError(t, err)
	require.Len(t, rep.Targets, 2)
	require.Equal(t, "bare", rep.Targets[0].Name)
	require.Equal(t, "middleware", rep.Targets[1].Name)
	var flushes int64
	for _, tg := range rep.Targets {
		require.Positive(t, tg.Requests, tg.Name)
		require.Positive(t, tg.Latency.P99, tg.Name)
		require.Len(t, tg.SliceP99US, cfg.Slices, tg.Name)
		for _, p99 := range tg.SliceP99US {
			require.Positive(t, p99, tg.Name)
			require.LessOrEqual(t, p99, tg.Latency.Max, tg.Name)
		}
		require.Len(t, tg.SliceBackground, cfg.Slices, tg.Name)
		for _, bg := range tg.SliceBackground {
			flushes += bg.Flushes
			require.GreaterOrEqual(t, bg.WrittenMB, 0.0, tg.Name)
		}
		// Every request wakes goroutines, so the scheduler measured waits
		// in each target's slices.
		sl := tg.Runtime.SchedLatencyUS
		require.Positive(t, sl.P99, tg.Name)
		require.LessOrEqual(t, sl.P50, sl.P99, tg.Name)
		require.LessOrEqual(t, sl.P99, sl.P999, tg.Name)
	}
	// A few hundred protected requests fill several 16 KiB memtables;
	// which handler's slices the flushes land in depends on timing.
	t.Logf("%d flushes in the measured slices", flushes)
	require.Positive(t, flushes, "the stores flushed during the measured slices")
	require.Equal(t, rep.Targets[1].Latency.P99-rep.Targets[0].Latency.P99, rep.Overhead.P99)
	// Every protected request commits through the engine's committer; the
	// bare handler does not use it.
	require.Zero(t, rep.Targets[0].Commits)
	mw := rep.Targets[1]
	require.Positive(t, mw.Commits)
	require.GreaterOrEqual(t, mw.WritesPerCommit, 1.0)
	require.Positive(t, mw.CommitBusy)
	require.Positive(t, mw.CommitSyncWaitShare)

	var out bytes.Buffer
	require.NoError(t, rep.WriteTable(&out))
	require.Contains(t, out.String(), "overhead")
	require.Contains(t, out.String(), "p99 of each slice")
	require.Contains(t, out.String(), "middleware: commit path busy")
	require.Contains(t, out.String(), "bare: goroutines waited for a core")
	require.Contains(t, out.String(), "middleware: ")
	require.Contains(t, out.String(), "slices had a compaction running")
	out.Reset()
	require.NoError(t, rep.WriteJSON(&out))
	var back Report
	require.NoError(t, json.Unmarshal(out.Bytes(), &back))
	require.Equal(t, rep.Targets[1].Requests, back.Targets[1].Requests)
	require.Equal(t, rep.Targets[1].SliceP99US, back.Targets[1].SliceP99US)

	require.Error(t, (&Options{Rate: -1}).Validate())
	require.NoError(t, (&Options{}).Validate(), "zero means the default")
	_, err = Profile("slow")
	require.Error(t, err)
}

// runtimeDelta sums the growth of the scheduler's histogram over slices
// and reads quantiles off bucket bounds.
func TestRuntimeDeltaQuantiles(t *testing.T) {
	inf := math.Inf(1)
	buckets := []float64{math.Inf(-1), 1e-6, 10e-6, 100e-6, 1e-3, inf}
	sample := func(counts ...uint64) *runtimeSample {
		s := &runtimeSample{{Name: metricSchedLatency}, {Name: metricGCCycles}, {Name: metricGCCPU}}
		// Build the values through a real read, then overwrite the
		// histogram's counts: metrics.Value has no constructor.
		metrics.Read(s[:])
		h := s[0].Value.Float64Histogram()
		h.Buckets, h.Counts = buckets, counts
		return s
	}
	var d runtimeDelta
	// Two slices, each counted from its own start: 100 and 200 waits.
	d.add(sample(0, 0, 0, 0, 0), sample(0, 0, 50, 0, 0))
	d.add(sample(7, 7, 7, 7, 7), sample(7, 7, 47, 16, 8))
	require.Equal(t, []uint64{0, 0, 90, 9, 1}, d.counts, "the growth of both slices, not what came before")
	// Of 100 waits: 90 of 10 to 100 µs, 9 of 100 µs to 1 ms, 1 over 1 ms.
	f := d.figures(100)
	require.InDelta(t, 100, f.SchedLatencyUS.P50, 1e-9)
	require.InDelta(t, 1000, f.SchedLatencyUS.P99, 1e-9)
	require.InDelta(t, 1000, f.SchedLatencyUS.P999, 1e-9, "the unbounded bucket reports its lower bound")
	require.Zero(t, (&runtimeDelta{}).quantileUS(0.5), "no samples")
}

// A slice's background work: counters as growth over the slice, the
// compactions in progress as read at its start and at its end.
func TestBackgroundWorkMinus(t *testing.T) {
	start := BackgroundWork{Flushes: 3, Compactions: 1, WrittenMB: 10, FilterBuilds: 1, running: 1}
	end := BackgroundWork{Flushes: 5, Compactions: 1, WrittenMB: 25, FilterBuilds: 1, running: 0}
	got := end.minus(start)
	require.Equal(t, BackgroundWork{Flushes: 2, WrittenMB: 15, CompactingAtStart: 1}, got)
	require.True(t, got.compacted(), "a compaction was running when the slice began")
	require.False(t, BackgroundWork{Flushes: 2}.compacted())
	require.True(t, BackgroundWork{CompactingAtEnd: 1}.compacted())
	require.True(t, BackgroundWork{Compactions: 1}.compacted())
}
