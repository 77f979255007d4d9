package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bits-and-blooms/bloom/v3"
	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv/engine/internal/record"
)

// The claim filter keeps claims of new keys out of Pebble.
//
// Nearly every claim is for a key the store has never seen, and answering
// "not there" through Pebble costs an iterator, a search of every memtable's
// skiplist and a bloom probe per level: the largest single cost of a claim.
// Each stripe of the lease table therefore keeps an in-memory bloom
// filter of the record keys stored under it, and a lookup the filter
// answers "absent" skips Pebble.
//
// Invariant: while a stripe's filter is set, it holds every record key of
// that stripe that is stored in Pebble or being written to it. This is what
// makes a "definitely absent" answer safe, and it rests on the invariant
// documented on leaseTable: every write of a record key happens under a slot,
// and every slot is installed under its stripe's mutex by installLocked, which adds its
// key to the stripe's filters first. Keys already on disk when a filter is
// built are added by the build's scan.
//
// A build (the first one starts at Open; until it ends, every lookup reads
// Pebble):
//
//  1. under each stripe's mutex, sets a new, empty next filter and adds to
//     it the keys of every slot the stripe holds, so that a write already in
//     flight is covered even if it commits after step 2's snapshot;
//  2. opens an iterator, a snapshot taken after step 1, and adds every
//     stored record key to its stripe's next filter; a record committed after
//     the snapshot was written under a slot that step 1 saw, or that was
//     installed later and so added itself;
//  3. under each stripe's mutex, makes next the filter.
//
// Bloom filters cannot forget, so keys the sweeper deletes stay in the
// filter and its false-positive rate creeps up as keys are added. A build
// sizes the filter for twice the keys it found, and once the keys added
// since then would fill it, the filter is rebuilt the same way. A false
// positive costs only the Pebble lookup the filter would have saved.
//
// A rebuild, which replaces filters in use, runs steps 1 to 3 once for
// each of rebuildGroups groups of stripes, each scan adding only its
// group's keys: the filters being built then take a quarter of the memory
// of those in use rather than as much again (1 GB at the guide's 432 M
// records), for more scans. The first build after Open replaces nothing
// and runs once for all stripes.

// rebuildGroups is how many groups of stripes a rebuild builds in turn.
const rebuildGroups = 4

// minFilterKeys is the fewest keys a filter is sized for: 64 Ki keys take
// 80 KiB at 10 bits a key, nothing next to the block cache. Tests lower it
// with Options.claimFilterMinKeys.
const minFilterKeys = 1 << 16

// claimFilter is the engine-wide state of the stripes' filters.
type claimFilter struct {
	bitsPerKey int // 0: no filter, every lookup reads Pebble
	hashes     uint

	// adds counts keys added by installLocked since the current build
	// began; when it reaches limit, a rebuild is due.
	adds  atomic.Int64
	limit atomic.Int64
	kick  chan struct{} // capacity 1: a rebuild is due

	// Figures for Stats.
	capacity atomic.Int64 // keys the filter in use is sized for
	stored   atomic.Int64 // keys the last build found on disk
	builds   atomic.Int64 // builds that ended
	failures atomic.Int64 // builds that failed
	loaded   atomic.Bool  // the first filter was read from a saved file
	skips    atomic.Int64 // lookups answered absent without Pebble
	misses   atomic.Int64 // lookups the filter passed that Pebble found absent

	// sweptAtBuild is the engine's count of swept records when the
	// current build began. Only the build goroutine touches it.
	sweptAtBuild int64

	stop func()
	done chan struct{}
	// built is closed when the first build has ended (at once if there is
	// no filter).
	built     chan struct{}
	builtOnce sync.Once
}

// testHookClaimFilter, if set, is called by a build with its stage: "next"
// after step 1, "scanned" after step 2, "built" after step 3, or "failed"
// when step 2 fails.
var testHookClaimFilter func(stage string)

// scanYieldInterval is how long a build's scan may run before it gives
// way to other goroutines: a tenth of the Go scheduler's own slice, so
// that a scan of a large store does not hold a processor while requests
// wait for one.
const scanYieldInterval = time.Millisecond

// scanNow reads the clock a build's scan paces its yields by (monotonic
// nanoseconds); tests replace it.
var scanNow = nanotime

// start anchors nanotime: time.Since reads the monotonic clock.
var start = time.Now()

func nanotime() int64 { return int64(time.Since(start)) }

// testHookFilterYield, if set, is called each time a build's scan gives
// way to other goroutines.
var testHookFilterYield func()

// filterAddLocked adds k to the stripe's filters, if it has any.
//
// REQUIRES: st.mu held.
func (st *stripe) filterAddLocked(k []byte) {
	if f := st.mu.filter; f != nil {
		f.Add(k)
	}
	if f := st.mu.nextFilter; f != nil {
		f.Add(k)
	}
}

// noteAdd counts one key added by installLocked and asks for a rebuild
// when the filter is full.
func (f *claimFilter) noteAdd() {
	if f.bitsPerKey == 0 {
		return
	}
	if f.adds.Add(1) == f.limit.Load() {
		f.requestBuild()
	}
}

// setLimit asks for a rebuild once adds reaches limit (at once if it
// already has).
func (f *claimFilter) setLimit(limit int64) {
	f.limit.Store(limit)
	if f.adds.Load() >= limit {
		f.requestBuild()
	}
}

func (f *claimFilter) requestBuild() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// startClaimFilter starts the goroutine that builds the stripes' filters,
// unless they are disabled or the store is read-only. Close stops it.
func (e *Engine) startClaimFilter() {
	f := &e.filter
	f.done = make(chan struct{})
	f.built = make(chan struct{})
	if e.opts.ClaimFilterBitsPerKey <= 0 || e.opts.ReadOnly {
		f.stop = func() {}
		close(f.done)
		close(f.built)
		return
	}
	f.bitsPerKey = e.opts.ClaimFilterBitsPerKey
	f.hashes = uint(max(1, math.Round(float64(f.bitsPerKey)*math.Ln2)))
	f.kick = make(chan struct{}, 1)
	f.limit.Store(math.MaxInt64)
	ctx, cancel := context.WithCancel(context.Background())
	f.stop = cancel
	switch err := e.loadSavedFilter(); {
	case err == nil:
		f.builtOnce.Do(func() { close(f.built) })
	case errors.Is(err, os.ErrNotExist):
		f.requestBuild()
	default:
		e.opts.Logger.Infof("idemkv: claim filter: %v; building it by scanning the store", err)
		f.requestBuild()
	}
	go func() {
		defer close(f.done)
		inARow := 0
		var retry <-chan time.Time
		for {
			select {
			case <-ctx.Done():
				return
			case <-f.kick:
			case <-retry:
			}
			retry = nil
			err := e.buildClaimFilter(ctx)
			if err == nil {
				inARow = 0
				continue
			}
			if ctx.Err() != nil || e.gate.err() != nil {
				continue
			}
			// Lookups go on reading Pebble where there is no filter; a
			// failed build (a transient read error, say) is tried again
			// with backoff rather than waiting for the next rebuild due,
			// which for a first build never comes.
			inARow++
			f.failures.Add(1)
			e.opts.Logger.Errorf("idemkv: claim filter build failed (%d in a row), will retry: %v", inARow, err)
			retry = claimFilterAfter(filterRetryWait(inARow))
		}
	}()
}

// claimFilterAfter waits before a failed build is tried again; tests
// replace it.
var claimFilterAfter = time.After

// filterRetryWait is the wait before the next build after n failures in
// a row: 1 s doubling up to 5 minutes, jittered down by up to half so that
// engines that failed together do not retry together.
func filterRetryWait(n int) time.Duration {
	d := time.Second << min(n-1, 9)
	d = min(d, 5*time.Minute)
	return d - rand.N(d/2)
}

// ClaimFilterBuilt returns a channel that is closed once the claim filter's
// first build after Open has ended, or at once if the engine has no claim
// filter (Options.ClaimFilterBitsPerKey). Until then every claim looks up
// Pebble, which is correct but slower; the build scans every stored record
// key, about a second per million on two cores (docs/operations.md).
func (e *Engine) ClaimFilterBuilt() <-chan struct{} { return e.filter.built }

// buildClaimFilter builds new filters for every stripe (steps 1 to 3 of the
// comment at the top of this file).
func (e *Engine) buildClaimFilter(ctx context.Context) error {
	f := &e.filter
	// Estimate the stored records: those the last build found, plus the
	// keys added since (an upper bound on the records written since: some
	// claims are released or never complete), minus those the sweeper has
	// deleted since. Sizing from the keys in the filter instead would
	// double the filter at every rebuild of a store in steady state.
	swept := e.counters.swept.Load()
	want := max(0, f.stored.Load()+f.adds.Load()-(swept-f.sweptAtBuild))
	if f.builds.Load() == 0 {
		// Before the first scan, estimate from the tables' entry counts.
		if n, err := e.estimateStoredRecords(); err == nil {
			want = n + f.adds.Load()
		}
	}
	prevSwept := f.sweptAtBuild
	f.sweptAtBuild = swept
	least := int64(minFilterKeys)
	if e.opts.claimFilterMinKeys > 0 {
		least = e.opts.claimFilterMinKeys
	}
	capacity := max(least, 2*want)
	bits := filterBits(capacity, len(e.table.stripes), f.bitsPerKey)

	prevAdds := f.adds.Swap(0)
	f.limit.Store(math.MaxInt64)
	groups := 1
	if f.builds.Load() > 0 {
		groups = rebuildGroups
		if e.opts.claimFilterGroups > 0 {
			groups = e.opts.claimFilterGroups
		}
	}
	var found int64
	for g := range groups {
		n, err := e.buildGroup(ctx, bits, g, groups)
		if err != nil {
			// The filters in use (if any) stay, those of the groups built
			// already among them, and go on counting from where they were;
			// try again after another least keys.
			f.adds.Add(prevAdds)
			f.sweptAtBuild = prevSwept
			f.setLimit(f.adds.Load() + least)
			if testHookClaimFilter != nil {
				testHookClaimFilter("failed")
			}
			return err
		}
		found += n
	}
	f.stored.Store(found)
	f.capacity.Store(capacity)
	f.builds.Add(1)
	f.builtOnce.Do(func() { close(f.built) })
	// The filter holds the keys found plus those added since step 1; it
	// is full once capacity keys are in it.
	f.setLimit(capacity - found)
	if testHookClaimFilter != nil {
		testHookClaimFilter("built")
	}
	return nil
}

// buildGroup runs steps 1 to 3 for group g of groups (the stripes whose
// index is g modulo groups), with filters of bits bits, and returns the
// stored keys it found.
func (e *Engine) buildGroup(ctx context.Context, bits uint, g, groups int) (int64, error) {
	f := &e.filter
	inGroup := func(i int) bool { return i%groups == g }
	for i := range e.table.stripes {
		if !inGroup(i) {
			continue
		}
		st := &e.table.stripes[i]
		st.mu.Lock()
		st.mu.nextFilter = bloom.New(bits, f.hashes)
		for k := range st.mu.slots {
			st.mu.nextFilter.AddString(k)
		}
		st.mu.Unlock()
	}
	if testHookClaimFilter != nil {
		testHookClaimFilter("next")
	}
	found, err := e.scanRecordKeys(ctx, inGroup)
	if err == nil && testHookClaimFilter != nil {
		testHookClaimFilter("scanned")
	}
	for i := range e.table.stripes {
		if !inGroup(i) {
			continue
		}
		st := &e.table.stripes[i]
		st.mu.Lock()
		if err == nil {
			st.mu.filter = st.mu.nextFilter
		}
		st.mu.nextFilter = nil
		st.mu.Unlock()
	}
	return found, err
}

// estimateStoredRecords estimates the record keys stored, for sizing the
// first filter before any scan has counted them. It errs high, because a
// filter sized too small is full as soon as it is built and the whole
// store is scanned again at once. Every entry of every sstable that holds
// record keys counts, deletions and older versions included. In a large
// store nearly every table holds one kind of key, so the count is close;
// the tables at the edges of the records' span, which hold other keys too,
// count whole (weighing them by the share of their bytes among the
// records can count low). Records only
// in the memtables are not counted: if they are more than the tables hold,
// the store is small and scanning it again is cheap. The records' size on
// disk is no guide: they compress to as little as 16 bytes each when their
// keys are alike.
func (e *Engine) estimateStoredRecords() (int64, error) {
	var n uint64
	for _, span := range [][2][]byte{{recordStart, recordEnd}, {expiryStart, expiryEnd}} {
		levels, err := e.db.SSTables(pebble.WithProperties(), pebble.WithKeyRangeFilter(span[0], span[1]))
		if err != nil {
			return 0, err
		}
		for _, level := range levels {
			for _, t := range level {
				if t.Properties != nil {
					n += t.Properties.NumEntries
				}
			}
		}
	}
	return int64(min(n, math.MaxInt64/4)), nil
}

// scanRecordKeys adds to its stripe's next filter the record key of every
// record in the store whose stripe is in the group (inGroup of the
// stripe's index), and returns how many it added. Records in ended
// buckets have expired and cost the filter a little room until the
// sweeper drops them; skipping them by the clock would hide them for the
// filter's life if the clock were corrected back.
func (e *Engine) scanRecordKeys(ctx context.Context, inGroup func(int) bool) (int64, error) {
	var n, seen int64
	lastYield := scanNow()
	add := func(k []byte) error {
		seen++
		if seen%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		// A scan does not block while the blocks it reads are cached, and
		// Go preempts such a goroutine only after 10 ms: give way to
		// waiting requests once per scanYieldInterval.
		if seen%256 == 0 {
			if now := scanNow(); now-lastYield >= int64(scanYieldInterval) {
				runtime.Gosched()
				lastYield = scanNow()
				if testHookFilterYield != nil {
					testHookFilterYield()
				}
			}
		}
		i := e.table.stripeIndex(k)
		if !inGroup(i) {
			return nil
		}
		st := &e.table.stripes[i]
		st.mu.Lock()
		st.mu.nextFilter.Add(k)
		st.mu.Unlock()
		n++
		return nil
	}
	it, err := e.db.NewIter(&pebble.IterOptions{LowerBound: recordStart, UpperBound: recordEnd})
	if err != nil {
		return 0, err
	}
	for valid := it.First(); valid; valid = it.Next() {
		if err := add(it.Key()); err != nil {
			_ = it.Close()
			return 0, err
		}
	}
	if err := it.Close(); err != nil {
		return 0, fmt.Errorf("scan record keys: %w", err)
	}

	if it, err = e.db.NewIter(&pebble.IterOptions{LowerBound: expiryStart, UpperBound: expiryEnd}); err != nil {
		return 0, err
	}
	rk := []byte{nsRecord}
	for valid := it.First(); valid; valid = it.Next() {
		bp, _, _, _, err := record.SplitExpiryKey(it.Key())
		if err != nil {
			_ = it.Close()
			return 0, fmt.Errorf("scan expiry keys: %x: %w", it.Key(), err)
		}
		rk = append(rk[:1], it.Key()[len(bp):]...)
		if err := add(rk); err != nil {
			_ = it.Close()
			return 0, err
		}
	}
	if err := it.Close(); err != nil {
		return 0, fmt.Errorf("scan expiry keys: %w", err)
	}
	return n, nil
}
