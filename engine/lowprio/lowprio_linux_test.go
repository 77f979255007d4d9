//go:build linux

package lowprio

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// threadNice is the nice value of the calling goroutine's current thread.
func threadNice() (int, error) {
	prio, err := unix.Getpriority(unix.PRIO_PROCESS, unix.Gettid())
	return 20 - prio, err // the system call returns 20 - nice
}

// recorder installs p's test hook and returns what it saw: for each
// attempt, its error, or the nice value read back on the lowered thread.
func recorder(p *Priority) func() (nices []int, errs []error) {
	var mu sync.Mutex
	var nices []int
	var errs []error
	p.testHookLowered = func(err error) { // on Pebble's goroutine: no t.FailNow
		n := -100
		if err == nil {
			n, err = threadNice()
		}
		mu.Lock()
		defer mu.Unlock()
		nices, errs = append(nices, n), append(errs, err)
	}
	return func() ([]int, []error) {
		mu.Lock()
		defer mu.Unlock()
		return append([]int(nil), nices...), append([]error(nil), errs...)
	}
}

// openStore opens a Pebble store in a fresh directory configured by p,
// with small memtables so that a few thousand writes flush. The caller
// closes it.
func openStore(t *testing.T, p *Priority) (*pebble.DB, *scheduler) {
	po := &pebble.Options{MemTableSize: 256 << 10, L0CompactionThreshold: 2}
	p.Configure(po)
	db, err := pebble.Open(t.TempDir(), po)
	require.NoError(t, err)
	return db, po.Experimental.CompactionScheduler.(*scheduler)
}

// writeAndFlush writes n keys with values and flushes them into level 0.
func writeAndFlush(t *testing.T, db *pebble.DB, round, n int) {
	val := make([]byte, 100)
	for i := range n {
		require.NoError(t, db.Set([]byte(fmt.Sprintf("k%08d", i*7919%n)), append(val[:0:0], fmt.Sprint(round, i)...), pebble.NoSync))
	}
	require.NoError(t, db.Flush())
}

// targetNice is a nice value below the test's own: an unprivileged thread
// may only lower its priority. It skips a test that runs at 19 already.
func targetNice(t *testing.T) int {
	mine, err := threadNice()
	require.NoError(t, err)
	if mine >= 19 {
		t.Skipf("the test runs at nice %d: no lower priority to set", mine)
	}
	return min(19, mine+7)
}

// TestCompactionsLowered: a store configured by a Priority runs its
// compactions on threads at the Priority's nice value, its flushes do not
// go through it, and the goroutine that calls Pebble keeps its own
// priority. It fails if a Pebble upgrade stops scheduling compactions
// through Options.Experimental.CompactionScheduler or stops calling
// MeasureCPU on a compaction's goroutine.
func TestCompactionsLowered(t *testing.T) {
	runtime.LockOSThread() // so that threadNice reads this goroutine's thread throughout
	defer runtime.UnlockOSThread()
	mine, err := threadNice()
	require.NoError(t, err)
	target := targetNice(t)
	p, err := New(&Options{Nice: target})
	require.NoError(t, err)
	seen := recorder(p)
	po := &pebble.Options{MemTableSize: 256 << 10, DisableAutomaticCompactions: true}
	p.Configure(po)
	db, err := pebble.Open(t.TempDir(), po)
	require.NoError(t, err)
	defer db.Close()

	for round := range 3 {
		writeAndFlush(t, db, round, 2000)
	}
	_, errs := seen()
	require.Empty(t, errs, "a flush was lowered")
	require.NoError(t, db.Compact(context.Background(), []byte("k"), []byte("l"), true))

	nices, errs := seen()
	require.NotEmpty(t, errs, "no compaction was lowered")
	for i, err := range errs {
		require.NoError(t, err)
		require.Equal(t, target, nices[i])
	}
	require.EqualValues(t, len(errs), p.Lowered())
	require.Zero(t, p.Failed())
	now, err := threadNice()
	require.NoError(t, err)
	require.Equal(t, mine, now, "the caller's thread was lowered")
}

// TestAutomaticCompactions: compactions that Pebble starts on its own,
// admitted by the scheduler when it is asked or when a running compaction
// ends, run and are lowered, and every admitted compaction is done once
// the store is closed.
func TestAutomaticCompactions(t *testing.T) {
	targetNice(t)
	p, err := New(nil)
	require.NoError(t, err)
	db, s := openStore(t, p)
	for round := range 12 {
		writeAndFlush(t, db, round, 2000)
	}
	// Level 0 holds at most a few flushes once compactions catch up.
	require.NoError(t, db.Compact(context.Background(), []byte("k"), []byte("l"), true))
	require.Positive(t, db.Metrics().Compact.Count)
	require.Positive(t, p.Lowered())
	require.NoError(t, db.Close())
	s.mu.Lock()
	defer s.mu.Unlock()
	require.Zero(t, s.mu.running, "a compaction was admitted and never done")
	require.True(t, s.mu.unregistered)
}

// TestStalledNotLowered: a compaction that starts while Pebble stalls
// writes keeps the normal priority: the writes are waiting for it.
func TestStalledNotLowered(t *testing.T) {
	targetNice(t)
	p, err := New(nil)
	require.NoError(t, err)
	seen := recorder(p)
	db, s := openStore(t, p)
	defer db.Close()
	s.stalled.Store(true)
	for round := range 3 {
		writeAndFlush(t, db, round, 2000)
	}
	require.NoError(t, db.Compact(context.Background(), []byte("k"), []byte("l"), true))
	_, errs := seen()
	require.Empty(t, errs)
	require.Zero(t, p.Lowered())
}

// TestOptions: the default is 19, and values outside 1..19 are refused.
func TestOptions(t *testing.T) {
	p, err := New(nil)
	require.NoError(t, err)
	require.Equal(t, 19, p.opts.Nice)
	for _, n := range []int{-1, 20} {
		_, err := New(&Options{Nice: n})
		require.ErrorContains(t, err, "Nice")
	}
}
