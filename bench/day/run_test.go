package day

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The day run at a million records, with short phases: every figure is
// there, the large store was opened with the filter Load saved, Check
// found every record, the sweeper dropped the bucket that ended during
// the open-loop phase, the memory limit asked for held in the measured
// phases and was put back, and a second run reuses the kept store, its
// phases each in a process of its own.
func TestRunSmallDay(t *testing.T) {
	records := int64(1_000_000)
	if testing.Short() {
		records = 200_000
	}
	o := smallDay(records, t.TempDir(), t.TempDir())
	limit := debug.SetMemoryLimit(-1)
	rep, err := Run(ctx, o)
	require.NoError(t, err)
	require.EqualValues(t, 3<<30, rep.Options.MemoryLimit)
	require.Equal(t, limit, debug.SetMemoryLimit(-1), "the limit found is put back")
	require.False(t, rep.Load.Reused)
	require.Positive(t, rep.Load.PerSecond)
	require.True(t, rep.Restart.SavedFilter)
	require.EqualValues(t, records, rep.Restart.CheckRecords)
	require.Positive(t, rep.Restart.BytesPerRecord)
	require.Positive(t, rep.Restart.Memory.ClaimFilter)
	for _, m := range []Memory{rep.Restart.Memory, rep.Small.Memory, rep.Large.Memory} {
		require.Positive(t, m.GoHeapLive)
		require.LessOrEqual(t, m.GoHeapLive, m.GoHeap, "live is part of what is in use")
	}
	for _, p := range []*Phase{rep.Small, rep.Large} {
		require.NotNil(t, p)
		require.GreaterOrEqual(t, len(p.Windows), 5)
		require.Positive(t, p.Latency.P99)
		require.Positive(t, p.RecordsAfter)
		// The runtime updates its CPU figures at each collection (a short
		// phase may have none, and zeros): counts and times only grow.
		g := p.GC
		for _, v := range []float64{g.CPUSeconds, g.IdleMarkCPUSeconds, g.BusyCPUSeconds, g.AvailableCPUSeconds, g.Share, g.AvailableShare} {
			require.GreaterOrEqual(t, v, 0.0, "%+v", g)
		}
		require.LessOrEqual(t, g.CPUSeconds, g.BusyCPUSeconds, "%+v", g)
		require.LessOrEqual(t, g.BusyCPUSeconds, g.AvailableCPUSeconds, "%+v", g)
		require.LessOrEqual(t, g.Share, 1.0, "%+v", g)
	}
	// The oldest bucket ends halfway through the phase: the sweeper drops
	// the records that expired in it, in the background or in the pass at
	// the end. The large store's holds 1.5 s of the day's records (3 at
	// 200,000, 17 at a million); the small one's may hold none.
	require.Positive(t, rep.Large.Sweep.Deleted+int64(rep.Large.Sweep.FinalPassDeleted), "records swept")
	require.Positive(t, rep.meanRate("small", 8))
	require.Positive(t, rep.meanRate("large", 8))

	var table, js bytes.Buffer
	require.NoError(t, rep.WriteTable(&table))
	require.Contains(t, table.String(), "open to full speed")
	require.Contains(t, table.String(), "Go memory limit after the loads: 3072 MiB")
	require.Contains(t, table.String(), "GC share")
	require.Contains(t, table.String(), "LSM tree, large store: read amp up to")
	require.Positive(t, rep.Large.lsm().ReadAmp, "the tree was read at each window's end")
	require.NoError(t, rep.WriteJSON(&js))
	var back map[string]any
	require.NoError(t, json.Unmarshal(js.Bytes(), &back))
	require.EqualValues(t, 3<<30, back["options"].(map[string]any)["memory_limit_bytes"])
	for _, p := range back["open_loop"].([]any) {
		p := p.(map[string]any)
		require.Contains(t, p["memory"], "go_heap_live")
		for _, k := range []string{"cycles", "cpu_seconds", "idle_mark_cpu_seconds", "busy_cpu_seconds", "available_cpu_seconds", "share", "available_share"} {
			require.Contains(t, p["gc"], k)
		}
	}
	files, err := rep.Plot(t.TempDir())
	require.NoError(t, err)
	require.Len(t, files, 1)

	require.False(t, rep.Large.Memory.OwnProcess, "in the harness's process")
	var m marker
	b, err := os.ReadFile(filepath.Join(o.Store, markerFile))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &m))
	require.Equal(t, 1, m.Runs)
	require.True(t, m.Clock.After(dayStart(o.EnsureDefaults()).Add(o.Duration)), "the store's time went on with its traffic: %v", m.Clock)
	require.NotContains(t, table.String(), "a process of its own")

	// The kept store again, each phase in a process of its own: the new
	// keys of this run's traffic are new to it too (the run checks every
	// claim against the contract), and the memory is the children's.
	runInChildren(t, o)
	rep, err = Run(ctx, o)
	require.NoError(t, err)
	require.True(t, rep.Load.Reused)
	for _, m := range []Memory{rep.Restart.Memory, rep.Small.Memory, rep.Large.Memory} {
		require.True(t, m.OwnProcess)
		require.Positive(t, m.RSSPeak)
		require.GreaterOrEqual(t, m.RSSPeak, m.RSS)
	}
	require.Greater(t, int64(rep.Restart.CheckRecords), records, "the loaded records and the first run's")
	require.Positive(t, rep.meanRate("large", 8))
	table.Reset()
	require.NoError(t, rep.WriteTable(&table))
	require.Contains(t, table.String(), "each measured phase ran in a process of its own")
	o.Child = nil

	o.Duration, o.Rounds = time.Second, 1
	_, err = Run(ctx, o)
	require.Error(t, err, "another run's store (its day starts elsewhere)")
}

// A memory limit of 0 leaves the process's as it is, a negative one
// removes it, and each is put back.
func TestApplyMemoryLimit(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(5 << 30))
	restore := applyMemoryLimit(0)
	require.EqualValues(t, 5<<30, memoryLimit(), "GOMEMLIMIT's, say, left alone")
	restore()
	restore = applyMemoryLimit(-1)
	require.Zero(t, memoryLimit(), "none")
	require.EqualValues(t, int64(math.MaxInt64), debug.SetMemoryLimit(-1))
	restore()
	require.EqualValues(t, 5<<30, memoryLimit())
	restore = applyMemoryLimit(2 << 30)
	require.EqualValues(t, 2<<30, memoryLimit())
	restore()
	require.EqualValues(t, 5<<30, memoryLimit())
}

// A disk too small for the store asked for reduces it to what fits, and
// says so; one too small for the smallest useful run refuses.
func TestFitDisk(t *testing.T) {
	dir := t.TempDir()
	fit, err := fitDisk(&Options{Records: 1000, Small: 10}, dir+"/a/b")
	require.NoError(t, err)
	require.EqualValues(t, 1000, fit.Records)
	require.Positive(t, fit.AvailBytes)

	huge := int64(fit.AvailBytes/diskPerRecord) * 2
	fits := int64(fit.AvailBytes/diskPerRecord) - 1_000_000
	fit, err = fitDisk(&Options{Records: huge, Small: 1_000_000}, dir)
	if fits < minRecords {
		require.ErrorContains(t, err, "needs about")
		return
	}
	require.NoError(t, err)
	require.Equal(t, fits, fit.Records)
	require.Greater(t, fit.NeedBytes, fit.AvailBytes)
}
