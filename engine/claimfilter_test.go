package engine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/stretchr/testify/require"
)

// filterStages records the claim filter's build stages and lets a test
// hold a build at one of them. Tests that use it must not run in parallel,
// and must install it before they open an engine: the hook is package-wide.
type filterStages struct {
	reached chan string
	mu      sync.Mutex
	hold    map[string]chan struct{}
}

// hookFilter installs a build hook for the test's life.
func hookFilter(t *testing.T) *filterStages {
	fs := &filterStages{reached: make(chan string, 64), hold: map[string]chan struct{}{}}
	testHookClaimFilter = func(stage string) {
		fs.reached <- stage
		fs.mu.Lock()
		c := fs.hold[stage]
		fs.mu.Unlock()
		if c != nil {
			<-c
		}
	}
	t.Cleanup(func() { testHookClaimFilter = nil })
	return fs
}

// holdAt makes the next builds that reach stage wait there until release.
func (fs *filterStages) holdAt(stage string) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.hold[stage] = make(chan struct{})
}

func (fs *filterStages) release(stage string) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	close(fs.hold[stage])
	delete(fs.hold, stage)
}

// await waits until a build reaches stage, skipping earlier stages. The
// minute is a guard against a build that never comes, not a wait.
func (fs *filterStages) await(t *testing.T, stage string) {
	t.Helper()
	guard := time.After(time.Minute)
	for {
		select {
		case st := <-fs.reached:
			if st == stage {
				return
			}
		case <-guard:
			t.Fatalf("no claim filter build reached %q", stage)
		}
	}
}

func (v *env) complete(i idemkv.ID) {
	c := v.claim(i, fpA, idemkv.ModeLocal)
	require.Equal(v.t, idemkv.Acquired, c.Outcome, "key %s", i.Key)
	require.NoError(v.t, v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, nil))
}

// A filter built at Open holds the keys already stored: their claims
// replay, and claims of new keys skip Pebble.
func TestClaimFilterHoldsStoredKeys(t *testing.T) {
	fs := hookFilter(t)
	v := newEnv(t)
	fs.await(t, "built")
	v.opts.ReplayCacheSize = -1 // every replay below must come from the filter's "maybe"
	for i := range 50 {
		v.complete(id(fmt.Sprintf("stored-%d", i)))
	}
	v.reopenScanning()
	fs.await(t, "built")

	st, err := v.e.Stats()
	require.NoError(t, err)
	require.EqualValues(t, 50, st.ClaimFilterStored)
	require.EqualValues(t, 1, st.ClaimFilterBuilds)
	require.GreaterOrEqual(t, st.ClaimFilterKeys, int64(100))

	for i := range 50 {
		c := v.claim(id(fmt.Sprintf("stored-%d", i)), fpA, idemkv.ModeLocal)
		require.Equal(t, idemkv.Replay, c.Outcome, "stored-%d", i)
	}
	for i := range 1000 {
		c := v.claim(id(fmt.Sprintf("new-%d", i)), fpA, idemkv.ModeLocal)
		require.Equal(t, idemkv.Acquired, c.Outcome)
	}
	st, err = v.e.Stats()
	require.NoError(t, err)
	// At 10 bits a key, about 1% of new keys pass the filter.
	require.Greater(t, st.ClaimFilterSkips, int64(950))
	require.Equal(t, int64(1000), st.ClaimFilterSkips+st.ClaimFilterMisses)
}

// A claim the filter answers "absent" does not look in the replay cache
// either: a key the filter has never seen is neither stored nor cached.
func TestClaimFilterAnswersBeforeTheReplayCache(t *testing.T) {
	fs := hookFilter(t)
	v := newEnv(t)
	fs.await(t, "built")
	v.complete(id("stored"))
	require.Equal(t, idemkv.Replay, v.claim(id("stored"), fpA, idemkv.ModeLocal).Outcome)
	looked := v.e.table.replay.fc.LookupCount()
	require.Positive(t, looked, "the replay must have looked in the cache")

	st0, err := v.e.Stats()
	require.NoError(t, err)
	for i := range 200 {
		c := v.claim(id(fmt.Sprintf("new-%d", i)), fpA, idemkv.ModeLocal)
		require.Equal(t, idemkv.Acquired, c.Outcome)
	}
	st, err := v.e.Stats()
	require.NoError(t, err)
	skips := st.ClaimFilterSkips - st0.ClaimFilterSkips
	require.Greater(t, skips, int64(150))
	// Only the claims the filter let through (its false positives) may
	// have looked in the cache.
	require.Equal(t, looked+200-skips, v.e.table.replay.fc.LookupCount())
}

// A rebuild covers a write whose slot existed before the build began but
// which commits after the build's snapshot, and a key first claimed while
// the build runs.
func TestClaimFilterRebuildCoversWritesInFlight(t *testing.T) {
	fs := hookFilter(t)
	v := newEnv(t)
	fs.await(t, "built")
	v.opts.ReplayCacheSize = -1
	v.opts.claimFilterGroups = 1 // one pass: the keys below are in it
	v.reopenScanning()
	fs.await(t, "built") // the first build, of an empty store
	fs.holdAt("scanned")

	early := v.claim(id("early"), fpA, idemkv.ModeLocal) // a slot before the rebuild
	require.Equal(t, idemkv.Acquired, early.Outcome)
	v.e.filter.requestBuild()
	fs.await(t, "next")
	during := v.claim(id("during"), fpA, idemkv.ModeLocal) // a slot during it
	require.Equal(t, idemkv.Acquired, during.Outcome)
	fs.await(t, "scanned")
	// Both commit after the scan's snapshot: only the slots put them in
	// the new filter.
	require.NoError(t, v.e.Complete(ctx, early.Lease, idemkv.Result{Status: 201}, nil))
	require.NoError(t, v.e.Complete(ctx, during.Lease, idemkv.Result{Status: 201}, nil))
	fs.release("scanned")
	fs.await(t, "built")

	require.EqualValues(t, 2, v.stats().ClaimFilterBuilds)
	require.Equal(t, idemkv.Replay, v.claim(id("early"), fpA, idemkv.ModeLocal).Outcome)
	require.Equal(t, idemkv.Replay, v.claim(id("during"), fpA, idemkv.ModeLocal).Outcome)
	require.Equal(t, idemkv.Mismatch, v.claim(id("early"), fpB, idemkv.ModeLocal).Outcome)
}

// Once the keys added since a build would fill the filter, it is rebuilt,
// sized for twice the keys the full one held.
func TestClaimFilterRebuildsWhenFull(t *testing.T) {
	fs := hookFilter(t)
	v := newEnv(t)
	fs.await(t, "built")
	v.opts.claimFilterMinKeys = 64
	v.opts.Shards = 1
	v.reopenScanning()
	fs.await(t, "built")
	require.EqualValues(t, 64, v.stats().ClaimFilterKeys)

	for i := range 63 {
		v.complete(id(fmt.Sprintf("k%d", i)))
	}
	require.EqualValues(t, 1, v.stats().ClaimFilterBuilds)
	// The 64th key fills it; its claim, which adds the key, starts the
	// rebuild, and its record is never written.
	require.Equal(t, idemkv.Acquired, v.claim(id("k63"), fpA, idemkv.ModeLocal).Outcome)
	fs.await(t, "built")
	st := v.stats()
	require.EqualValues(t, 2, st.ClaimFilterBuilds)
	require.EqualValues(t, 63, st.ClaimFilterStored)
	require.EqualValues(t, 128, st.ClaimFilterKeys) // twice the keys in the full filter
	for i := range 63 {
		require.Equal(t, idemkv.Replay, v.claim(id(fmt.Sprintf("k%d", i)), fpA, idemkv.ModeLocal).Outcome)
	}
	require.Equal(t, idemkv.InProgress, v.claim(id("k63"), fpA, idemkv.ModeLocal).Outcome)

	// Steady state: the sweeper deletes as many records as are added. The
	// next rebuild counts the deletes and keeps the size instead of
	// doubling it.
	v.clock.Advance(25 * time.Hour)
	_, err := v.e.Sweep(ctx)
	require.NoError(t, err)
	require.Empty(t, v.stored())
	for i := range 64 {
		v.complete(id(fmt.Sprintf("n%d", i)))
	}
	require.EqualValues(t, 2, v.stats().ClaimFilterBuilds)
	v.complete(id("n64")) // 65 keys since the last build began fill it
	fs.await(t, "built")
	st = v.stats()
	require.EqualValues(t, 3, st.ClaimFilterBuilds)
	require.EqualValues(t, 130, st.ClaimFilterKeys) // twice the 65 stored now, not twice the 128 keys in it
	require.Equal(t, idemkv.Replay, v.claim(id("n0"), fpA, idemkv.ModeLocal).Outcome)
}

// With the filter off, every lookup reads Pebble and nothing is counted.
func TestClaimFilterDisabled(t *testing.T) {
	v := newEnv(t)
	v.opts.ClaimFilterBitsPerKey = -1
	v.reopenScanning()
	v.complete(id("a"))
	require.Equal(t, idemkv.Acquired, v.claim(id("b"), fpA, idemkv.ModeLocal).Outcome)
	st := v.stats()
	require.Zero(t, st.ClaimFilterBuilds)
	require.Zero(t, st.ClaimFilterSkips)
}

func (v *env) stats() Stats {
	st, err := v.e.Stats()
	require.NoError(v.t, err)
	return st
}

// BenchmarkClaimFilterBuild times one build of the claim filter over a
// store of 1,000,000 record keys, written straight into Pebble and
// compacted first: the scan that follows every Open and every rebuild.
func BenchmarkClaimFilterBuild(b *testing.B) {
	const n = 1_000_000
	dir := writeBenchStore(b, n, false)

	e, err := Open(dir, &Options{Clock: fakeclock.New(t0), ClaimFilterBitsPerKey: -1})
	require.NoError(b, err)
	defer e.Close()
	// Build by hand: there is no builder goroutine.
	e.filter.bitsPerKey, e.filter.hashes, e.filter.built = 10, 7, make(chan struct{})
	b.ResetTimer()
	for range b.N {
		require.NoError(b, e.buildClaimFilter(context.Background()))
	}
	b.StopTimer()
	require.EqualValues(b, n, e.filter.stored.Load())
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/key")
}

// A build's scan gives way to other goroutines once per
// scanYieldInterval: it reads cached blocks without blocking, and Go would
// otherwise let it hold a core for 10 ms at a time while requests wait.
func TestClaimFilterBuildYields(t *testing.T) {
	const n = 20_000
	dir := writeBenchStore(t, n, false)
	// A clock that moves a millisecond at every reading: every check
	// finds the interval passed.
	var clock atomic.Int64
	scanNow = func() int64 { return clock.Add(int64(time.Millisecond)) }
	defer func() { scanNow = nanotime }()
	var yields atomic.Int64
	testHookFilterYield = func() { yields.Add(1) }
	defer func() { testHookFilterYield = nil }()

	e, err := Open(dir, &Options{Clock: fakeclock.New(t0), ClaimFilterBitsPerKey: -1})
	require.NoError(t, err)
	// Build by hand: there is no builder goroutine.
	e.filter.bitsPerKey, e.filter.hashes, e.filter.built = 10, 7, make(chan struct{})
	require.NoError(t, e.buildClaimFilter(context.Background()))
	require.EqualValues(t, n, e.filter.stored.Load())
	// A check every 256 keys, each finding a millisecond gone.
	require.InDelta(t, n/256, yields.Load(), 2)
	require.NoError(t, e.Close())
}

// The first build after Open sizes the filter for at least twice the
// records it will find, so it is not full as soon as it is built, even
// when the records compress to a fraction of their size (alike keys, small
// results). Sized from the bytes on disk it held half of them, and a second
// scan of the whole store followed at once.
func TestClaimFilterFirstBuildIsNotFull(t *testing.T) {
	fs := hookFilter(t)
	v := newEnv(t)
	fs.await(t, "built")
	const n = 5000
	for i := range n {
		v.complete(id(fmt.Sprintf("stored-%06d", i)))
	}
	require.NoError(t, v.e.Flush())
	require.NoError(t, v.e.Compact(ctx))

	v.opts.claimFilterMinKeys = 8
	v.reopenScanning()
	fs.await(t, "built")
	st := v.stats()
	require.EqualValues(t, 1, st.ClaimFilterBuilds)
	require.EqualValues(t, n, st.ClaimFilterStored)
	require.GreaterOrEqual(t, st.ClaimFilterKeys, int64(2*n))
}

// A build whose scan fails leaves lookups reading Pebble (or the filter in
// use) and is tried again once more keys have been added.
func TestClaimFilterBuildRetriesAfterAFailedScan(t *testing.T) {
	var armed atomic.Bool
	inj := failingSSTables(&armed, errorfs.OpFileReadAt)
	fs := hookFilter(t)
	v := newEnv(t)
	fs.await(t, "built")
	for i := range 2000 {
		v.complete(id(fmt.Sprintf("stored-%04d", i)))
	}
	require.NoError(t, v.e.Flush())
	require.NoError(t, v.e.Compact(ctx))

	v.opts.FS = errorfs.Wrap(vfs.Default, inj)
	v.opts.CacheSize = 1 << 20
	v.opts.ReplayCacheSize = -1
	v.opts.claimFilterMinKeys = 8
	fs.holdAt("next")
	v.reopenScanning()
	fs.await(t, "next")
	armed.Store(true) // the scan's reads of sstables fail
	fs.release("next")
	fs.await(t, "failed")
	armed.Store(false)
	require.Zero(t, v.stats().ClaimFilterBuilds)
	for i := range 2000 { // answered by Pebble
		require.Equal(t, idemkv.Replay, v.claim(id(fmt.Sprintf("stored-%04d", i)), fpA, idemkv.ModeLocal).Outcome)
	}

	for i := range 8 { // enough new keys to try again
		require.Equal(t, idemkv.Acquired, v.claim(id(fmt.Sprintf("new-%d", i)), fpA, idemkv.ModeLocal).Outcome)
	}
	fs.await(t, "built")
	st := v.stats()
	require.EqualValues(t, 1, st.ClaimFilterBuilds)
	require.EqualValues(t, 2000, st.ClaimFilterStored)
	for i := range 2000 {
		require.Equal(t, idemkv.Replay, v.claim(id(fmt.Sprintf("stored-%04d", i)), fpA, idemkv.ModeLocal).Outcome)
	}
}

// A build that fails on a read error is retried with backoff, counted and
// logged, until one succeeds: a first build that failed would otherwise
// never come again, and every claim would read Pebble for the store's life.
func TestClaimFilterRetriesAFailedBuild(t *testing.T) {
	var armed atomic.Bool
	inj := failingSSTables(&armed, errorfs.OpFileReadAt)
	waits, ticks := make(chan time.Duration, 1), make(chan time.Time)
	claimFilterAfter = func(d time.Duration) <-chan time.Time { waits <- d; return ticks }
	t.Cleanup(func() { claimFilterAfter = time.After })
	fs := hookFilter(t)
	v := newEnv(t)
	fs.await(t, "built")
	for i := range 30 {
		v.complete(id(fmt.Sprintf("k%d", i)))
	}
	require.NoError(t, v.e.Flush())
	require.NoError(t, v.e.Close())
	require.NoError(t, os.Remove(filepath.Join(v.dir, filterFile))) // scan, not the saved filter
	v.opts.FS = errorfs.Wrap(vfs.Default, inj)
	v.opts.ReplayCacheSize = -1
	v.opts.CacheSize = 1 // no block stays cached: the build's scan reads the file
	fs.holdAt("next")
	v.open()
	fs.await(t, "next")
	armed.Store(true) // after Open's own reads, before the build's scan
	fs.release("next")
	fs.await(t, "failed")
	d := <-waits
	require.GreaterOrEqual(t, d, time.Second/2)
	require.LessOrEqual(t, d, time.Second)
	st := v.stats()
	require.EqualValues(t, 1, st.ClaimFilterFailures)
	require.Zero(t, st.ClaimFilterKeys, "no filter yet")

	armed.Store(false)
	ticks <- time.Now()
	fs.await(t, "built")
	<-v.e.ClaimFilterBuilt()
	st = v.stats()
	require.EqualValues(t, 30, st.ClaimFilterStored)
	require.Equal(t, idemkv.Replay, v.claim(id("k7"), fpA, idemkv.ModeLocal).Outcome)
}

// A rebuild builds its filters group by group of stripes: while one group
// is built, only its stripes have a filter being built beside the one in
// use. In every group, a write whose slot existed before the group's scan
// but committed after it is covered, and so is every key stored before.
func TestClaimFilterRebuildsInGroups(t *testing.T) {
	// The hook is installed before any engine and removed after the last
	// is closed (cleanups run last first); it acts only once armed.
	var armed atomic.Bool
	var (
		building []int // stripes with a filter being built, at each "next"
		doubled  bool  // a stripe built without a filter in use
		inFlight []idemkv.Lease
		keys     []string
		failure  error
		v        *env
	)
	done := make(chan struct{})
	testHookClaimFilter = func(stage string) {
		if !armed.Load() {
			return
		}
		switch stage {
		case "next":
			n := 0
			for i := range v.e.table.stripes {
				st := &v.e.table.stripes[i]
				st.mu.Lock()
				if st.mu.nextFilter != nil {
					doubled = doubled || st.mu.filter == nil
					n++
				}
				st.mu.Unlock()
			}
			building = append(building, n)
			// Slots in every stripe's group, most of them in others.
			for range 8 {
				k := fmt.Sprintf("flight-%d", len(keys))
				keys = append(keys, k)
				c, err := v.e.Claim(ctx, idemkv.ClaimRequest{ID: id(k), Fingerprint: fpA})
				if err != nil || c.Outcome != idemkv.Acquired {
					failure = fmt.Errorf("claim %s: %v %v", k, c.Outcome, err)
					return
				}
				inFlight = append(inFlight, c.Lease)
			}
		case "scanned":
			for _, l := range inFlight {
				if err := v.e.Complete(ctx, l, idemkv.Result{Status: 201}, nil); err != nil {
					failure = err
				}
			}
			inFlight = nil
		case "built":
			armed.Store(false)
			close(done)
		}
	}
	t.Cleanup(func() { testHookClaimFilter = nil })
	v = newEnv(t)
	<-v.e.ClaimFilterBuilt()
	v.opts.ReplayCacheSize = -1
	v.opts.Shards = 8
	v.reopenScanning()
	<-v.e.ClaimFilterBuilt()
	stored := v.completeAll("stored", 40)

	armed.Store(true)
	v.e.filter.requestBuild()
	<-done // the hook's writes above happen before this

	require.NoError(t, failure)
	require.False(t, doubled, "a rebuild replaces a filter in use")
	require.Equal(t, []int{2, 2, 2, 2}, building, "a quarter of the 8 stripes at a time")
	st := v.stats()
	require.EqualValues(t, 2, st.ClaimFilterBuilds)
	v.requireKeysFound(stored)
	v.requireKeysFound(keys)
}
