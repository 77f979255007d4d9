package engine

import (
	"runtime"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// yieldFS makes Pebble's flushes and compactions give way to the requests.
//
// A flush or a compaction runs on one goroutine that builds and writes its
// sstables without blocking: tens to hundreds of milliseconds of CPU. The
// Go scheduler lets a goroutine that does not block run for up to 10 ms
// before it preempts it, so on a machine with few cores a compaction holds
// a processor for long stretches while requests queue behind it. With two
// cores, that halves the capacity left for requests for as long as the
// compaction runs, and shows as latency spikes in every request of the
// process (docs/benchmarks.md, "The HTTP middleware").
//
// yieldFS wraps the files that flushes and compactions create, and a
// write to them first calls runtime.Gosched once yieldInterval has passed
// since the last: the goroutine goes to the back of the run queue and
// requests waiting for a processor run first. When nothing else is
// runnable, Gosched returns at once and costs about a hundred nanoseconds.
//
// This changes no data and no order of writes, only when the background
// work runs. While Pebble stalls writes because flushes or compactions are
// behind (its memtable and L0 stop thresholds), nothing yields: the
// background work is then what the requests wait for.
// Options.NoBackgroundYield turns the wrapper off.
//
// The same wrapper lowers the OS priority of compactions when
// Options.BackgroundNice is set (lowerPriority).
type yieldFS struct {
	vfs.FS
	stalled atomic.Bool // between Pebble's WriteStallBegin and WriteStallEnd
	// yield and now are runtime.Gosched and nanotime; tests replace them.
	yield func()
	now   func() int64

	noYield bool          // Options.NoBackgroundYield: only lower priorities
	nice    int           // Options.BackgroundNice; 0: leave priorities alone
	logger  pebble.Logger // told once if priorities cannot be lowered
	// lowered counts the sstables written at the lowered priority;
	// lowerFailed is set by the first failure to lower one.
	lowered     atomic.Int64
	lowerFailed atomic.Bool
}

func newYieldFS(fs vfs.FS) *yieldFS {
	return &yieldFS{FS: fs, yield: runtime.Gosched, now: nanotime}
}

// listen makes l keep fs's stall flag.
func (fs *yieldFS) listen(l *pebble.EventListener) {
	l.WriteStallBegin = func(pebble.WriteStallBeginInfo) { fs.stalled.Store(true) }
	l.WriteStallEnd = func() { fs.stalled.Store(false) }
}

// yieldCategories are the writes that give way: Pebble's names for the
// sstables (and blob files) of flushes and compactions. The WAL is never
// wrapped: its writes are the requests' own.
var yieldCategories = map[vfs.DiskWriteCategory]bool{
	"pebble-memtable-flush":    true,
	"pebble-compaction":        true,
	"pebble-blob-file-rewrite": true,
}

// Create implements vfs.FS.
func (fs *yieldFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, category)
	if err != nil || !yieldCategories[category] {
		return f, err
	}
	if fs.nice > 0 {
		fs.lowerPriority()
	}
	if fs.noYield {
		return f, nil
	}
	yf := &yieldFile{File: f, fs: fs}
	yf.last.Store(fs.now())
	return yf, nil
}

// yieldInterval is how long a flush or compaction may write before it
// gives way. Yielding at every write (a few KiB, tens of microseconds of
// work) starved compactions when requests kept the cores busy: each yield
// waited behind every runnable goroutine, compactions fell behind, and the
// unique workload lost about a sixth of its throughput at 256 clients
// (docs/benchmarks.md). Once a millisecond bounds the delay a compaction
// adds to a waiting request at a tenth of the scheduler's own slice, and
// leaves compactions most of their share of a saturated machine.
const yieldInterval = time.Millisecond

// yieldFile is a file whose writes give way first, at most once per
// yieldInterval and never while Pebble stalls writes. Pebble writes a file
// from one goroutine at a time.
type yieldFile struct {
	vfs.File
	fs   *yieldFS
	last atomic.Int64 // fs.now() at the last yield, or at creation
}

// Write implements vfs.File.
func (f *yieldFile) Write(p []byte) (int, error) {
	if now := f.fs.now(); now-f.last.Load() >= int64(yieldInterval) && !f.fs.stalled.Load() {
		f.fs.yield()
		f.last.Store(f.fs.now())
	}
	return f.File.Write(p)
}

// epoch anchors nanotime: time.Since reads the monotonic clock.
var epoch = time.Now()

func nanotime() int64 { return int64(time.Since(epoch)) }

// lowerPriority runs the calling compaction at nice value fs.nice for the
// rest of its life (lowerThreadPriority), unless Pebble is stalling
// writes, when the requests are waiting for it.
//
// On a machine with few cores a compaction is CPU work that does not
// block for hundreds of milliseconds. While it holds one of the Go
// scheduler's processors, requests share the others, and on two cores
// that is one (docs/benchmarks.md, "The HTTP middleware"). Given a
// processor more than the machine has cores (GOMAXPROCS), the kernel
// schedules the threads, and a thread at a high nice value runs when a
// core is free of the requests' threads rather than in turn with them.
// With GOMAXPROCS at the number of cores, every processor's thread has a
// core and the nice value changes little.
//
// Pebble creates a compaction's sstables on the goroutine that builds
// them. Only goroutines Pebble started for one are lowered
// (onPebbleBackground): never a caller's goroutine that would go on to
// serve requests, and never a flush. A flush frees the memtable that
// writes wait for: with two CPU-bound processes at normal priority on
// the machine, lowering flushes too stalled writes for seconds, where
// lowering compactions alone did not (docs/benchmarks.md).
func (fs *yieldFS) lowerPriority() {
	if fs.stalled.Load() || !onPebbleBackground() {
		return
	}
	err := lowerThreadPriority(fs.nice)
	if testHookLowered != nil {
		testHookLowered(err)
	}
	if err != nil {
		if !fs.lowerFailed.Swap(true) && fs.logger != nil {
			fs.logger.Errorf("engine: BackgroundNice %d: %v; compactions keep the process's priority", fs.nice, err)
		}
		return
	}
	fs.lowered.Add(1)
}

// testHookLowered, if set, is called on the lowered goroutine after each
// attempt to lower its priority, with the attempt's error.
var testHookLowered func(error)

// pebbleBackgroundFuncs are the functions Pebble runs a compaction in,
// on a goroutine of its own (compaction.go in Pebble: go d.compact(...)).
// TestBackgroundNice fails if a Pebble upgrade renames it.
var pebbleBackgroundFuncs = map[string]bool{
	"github.com/cockroachdb/pebble/v2.(*DB).compact": true,
}

// onPebbleBackground reports whether the caller runs inside one of
// pebbleBackgroundFuncs.
func onPebbleBackground() bool {
	var pcs [64]uintptr
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs[:])])
	for {
		f, more := frames.Next()
		if pebbleBackgroundFuncs[f.Function] {
			return true
		}
		if !more {
			return false
		}
	}
}
