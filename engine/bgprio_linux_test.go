//go:build linux

package engine

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// threadNice is the nice value of the calling goroutine's current thread.
func threadNice(t testing.TB) int {
	n, err := getThreadNice()
	require.NoError(t, err)
	return n
}

func getThreadNice() (int, error) {
	prio, err := unix.Getpriority(unix.PRIO_PROCESS, unix.Gettid())
	return 20 - prio, err // the system call returns 20 - nice
}

// niceRecorder installs testHookLowered for the test and returns what it
// saw: each attempt's error and, when it succeeded, the nice value of the
// thread it lowered, read on that thread.
func niceRecorder(t *testing.T) func() (nices []int, errs []error) {
	var mu sync.Mutex
	var nices []int
	var errs []error
	testHookLowered = func(err error) { // on Pebble's goroutine: no t.FailNow
		n := -100
		if err == nil {
			n, err = getThreadNice()
		}
		mu.Lock()
		defer mu.Unlock()
		nices, errs = append(nices, n), append(errs, err)
	}
	t.Cleanup(func() { testHookLowered = nil })
	return func() ([]int, []error) {
		mu.Lock()
		defer mu.Unlock()
		return append([]int(nil), nices...), append([]error(nil), errs...)
	}
}

// newNiceEnv is newEnv on a new store opened with BackgroundNice nice.
func newNiceEnv(t *testing.T, nice int) *env {
	v := &env{t: t, dir: t.TempDir(), clock: fakeclock.New(t0)}
	v.opts = Options{Clock: v.clock, Lease: 30 * time.Second, CacheSize: 8 << 20, MemTableSize: 4 << 20, BackgroundNice: nice}
	v.open()
	t.Cleanup(func() { _ = v.e.Close() })
	return v
}

// TestBackgroundNice: with Options.BackgroundNice, Pebble's compactions
// run on threads at that nice value, its flushes do not (writes wait for
// them), and the goroutine that calls the engine (and waits for its
// flushes and compactions) keeps its own. It also fails if a Pebble
// upgrade renames the function that runs compactions
// (pebbleBackgroundFuncs), which would silently end the lowering.
func TestBackgroundNice(t *testing.T) {
	runtime.LockOSThread() // so that threadNice reads this goroutine's thread throughout
	defer runtime.UnlockOSThread()
	mine := threadNice(t)
	// A lower priority than the test's own: an unprivileged thread may
	// only lower its priority.
	if mine >= 19 {
		t.Skipf("the test runs at nice %d: no lower priority to set", mine)
	}
	target := min(19, mine+7)
	seen := niceRecorder(t)

	v := newNiceEnv(t, target)
	writeAndFlush(t, v)
	_, errs := seen()
	require.Empty(t, errs, "a flush was lowered")
	require.NoError(t, v.e.Compact(ctx))

	nices, errs := seen()
	require.NotEmpty(t, errs, "no compaction was lowered")
	for i, err := range errs {
		require.NoError(t, err)
		require.Equal(t, target, nices[i])
	}
	require.Equal(t, mine, threadNice(t), "the caller's thread was lowered")
	st, err := v.e.Stats()
	require.NoError(t, err)
	require.Equal(t, int64(len(errs)), st.LowPriorityTables)
}

// TestBackgroundNiceOff: by default nothing is lowered, and NoBackgroundYield
// alone leaves Pebble's filesystem unwrapped.
func TestBackgroundNiceOff(t *testing.T) {
	seen := niceRecorder(t)
	v := newEnv(t)
	flushAndCompact(t, v)
	_, errs := seen()
	require.Empty(t, errs)
	st, err := v.e.Stats()
	require.NoError(t, err)
	require.Zero(t, st.LowPriorityTables)

	po := (&Options{NoBackgroundYield: true}).EnsureDefaults().PebbleOptions()
	_, wrapped := po.FS.(*yieldFS)
	require.False(t, wrapped)
	po = (&Options{NoBackgroundYield: true, BackgroundNice: 19}).EnsureDefaults().PebbleOptions()
	yfs, wrapped := po.FS.(*yieldFS)
	require.True(t, wrapped, "BackgroundNice needs the wrapper without the yield")
	f, err := yfs.Create(t.TempDir()+"/000001.sst", "pebble-compaction")
	require.NoError(t, err)
	_, isYield := f.(*yieldFile)
	require.False(t, isYield, "NoBackgroundYield with BackgroundNice must not yield")
	require.NoError(t, f.Close())
}

// TestBackgroundNiceOnlyPebbleGoroutines: a flush's or compaction's file
// created from any other goroutine (a caller's) lowers nothing, and
// neither does a compaction's created while Pebble stalls writes.
func TestBackgroundNiceOnlyPebbleGoroutines(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	mine := threadNice(t)
	seen := niceRecorder(t)
	fs := newYieldFS(vfs.Default)
	fs.nice = 19
	dir := t.TempDir()
	for i, category := range []vfs.DiskWriteCategory{"pebble-memtable-flush", "pebble-compaction"} {
		f, err := fs.Create(fmt.Sprintf("%s/%06d.sst", dir, i), category)
		require.NoError(t, err)
		require.NoError(t, f.Close())
	}
	_, errs := seen()
	require.Empty(t, errs)
	require.Equal(t, mine, threadNice(t))
	require.Zero(t, fs.lowered.Load())

	// A stall: even Pebble's own goroutines keep their priority. (A new
	// store: Open has nothing to flush or compact before the stall is set.)
	v := newNiceEnv(t, 7)
	v.e.yfs.stalled.Store(true)
	flushAndCompact(t, v)
	_, errs = seen()
	require.Empty(t, errs)
}
