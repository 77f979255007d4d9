package engine

import (
	"context"
	"sync"
	"time"

	"github.com/bits-and-blooms/bloom/v3"
	"github.com/cespare/xxhash/v2"
	"github.com/idemkv/idemkv"
)

// leaseTable is the engine's memory of the keys in play: a slot for every
// key that a holder in this process holds, or that has a write in flight,
// striped over mutexes by a hash of the record key. Exclusion between
// concurrent claims of one key lives here.
//
// Invariant: every write of a record key happens while that key has a
// busy slot, and slots are created, marked busy and removed only under
// their stripe's mutex. So a reader holding the mutex that finds no busy
// slot sees a record value that is durable and will not change until the
// mutex is released. This is also what keeps a concurrent duplicate from
// replaying a result that Pebble has made visible but not yet synced.
//
// Two other structures are exact only because of it, and so live with the
// table: the replay cache (cache.go), whose entry for a key is dropped
// when a slot is installed for it and filled only from durable sources,
// and the stripes' claim filters (claimfilter.go), which every installed
// key joins before its write.
type leaseTable struct {
	stripes []stripe
	replay  replayCache
	filter  *claimFilter
}

// stripe is one lock stripe of the table.
type stripe struct {
	mu struct {
		sync.Mutex
		slots  map[string]*slot
		reapAt int // reap expired slots when len(slots) reaches this
		// filter, if set, holds every record key of this stripe that is
		// stored or being written; nextFilter is the one being built
		// (claimfilter.go).
		filter, nextFilter *bloom.BloomFilter
	}
}

// slot is a record held in progress by a holder in this process, or a key
// with a write in flight.
type slot struct {
	rec idemkv.Record // State is StateInProgress, or the state being replaced
	// busy: a write for this key is in flight. Claims and Gets answer from
	// the state before the write (InProgress); holder operations and
	// resolutions wait for the write to end, then decide.
	busy bool
	// done is closed when the busy write ends (made by markBusy).
	done chan struct{}
	// durable: the record in rec is on disk under the record key (a remote
	// claim once written, or a stored record being rewritten).
	durable bool
}

// minReapAt is the fewest slots a stripe holds before it reaps.
const minReapAt = 1024

func (t *leaseTable) init(stripes int, replay replayCache, filter *claimFilter) {
	t.stripes = make([]stripe, stripes)
	for i := range t.stripes {
		t.stripes[i].mu.slots = make(map[string]*slot)
		t.stripes[i].mu.reapAt = minReapAt
	}
	t.replay, t.filter = replay, filter
}

// stripe returns the stripe of record key k.
func (t *leaseTable) stripe(k []byte) *stripe { return &t.stripes[t.stripeIndex(k)] }

// stripeIndex returns the index of k's stripe.
func (t *leaseTable) stripeIndex(k []byte) int { return int(xxhash.Sum64(k) % uint64(len(t.stripes))) }

// slotLocked returns k's slot, or nil.
//
// REQUIRES: st.mu held.
func (st *stripe) slotLocked(k []byte) *slot { return st.mu.slots[string(k)] }

// installLocked makes s the slot of k. Every write to k happens under a
// slot, so this is where k's replay-cache entry is dropped and where k
// joins the stripe's claim filters.
//
// REQUIRES: st.mu held.
func (t *leaseTable) installLocked(st *stripe, k []byte, s *slot) {
	st.filterAddLocked(k)
	t.filter.noteAdd()
	st.mu.slots[string(k)] = s
	t.replay.drop(k)
}

// installHolderLocked installs rec, a new attempt, as k's slot; busy marks it for
// the durable write of the claim. It reaps the stripe first if it has
// grown.
//
// REQUIRES: st.mu held.
func (t *leaseTable) installHolderLocked(st *stripe, k []byte, rec idemkv.Record, busy bool, now time.Time) *slot {
	s := &slot{rec: rec}
	t.installLocked(st, k, s)
	if len(st.mu.slots) >= st.mu.reapAt {
		st.reapLocked(now)
	}
	if busy {
		s.markBusy()
	}
	return s
}

// beginWriteLocked returns k's slot marked busy for a write that replaces
// its record: s itself (k's slot, not busy), or, if s is nil, a new slot
// for cur, the record stored under k.
//
// REQUIRES: st.mu held.
func (t *leaseTable) beginWriteLocked(st *stripe, k []byte, s *slot, cur idemkv.Record) *slot {
	if s == nil {
		s = &slot{rec: cur, durable: true}
		t.installLocked(st, k, s)
	}
	s.markBusy()
	return s
}

// endWriteLocked ends the write on k's busy slot s that replaced k's
// record with next (nil: deleted): the slot goes, a completed next is
// cached for replays, and waiters wake to decide on the new state.
//
// REQUIRES: st.mu held; s busy; the write durable.
func (t *leaseTable) endWriteLocked(st *stripe, k []byte, s *slot, next *idemkv.Record, now time.Time) {
	delete(st.mu.slots, string(k))
	if next != nil {
		t.replay.put(k, next, now)
	}
	s.clearBusy()
}

// abortWriteLocked ends the busy write on k's slot s that wrote nothing
// (its checked reads had changed). A holder's slot stays as it was; a
// slot made for the write alone (beginWriteLocked, for a record no holder
// here holds: an uncertain one being resolved) goes, for a slot is a
// holder's to use, and the attempt that left the record uncertain was
// fenced off.
//
// REQUIRES: st.mu held; s busy.
func (t *leaseTable) abortWriteLocked(st *stripe, k []byte, s *slot) {
	if s.rec.State != idemkv.StateInProgress {
		delete(st.mu.slots, string(k))
	}
	s.clearBusy()
}

// dropLocked removes k's slot s, held but not busy or marked busy by its
// holder, whose record was never written (a local claim released).
//
// REQUIRES: st.mu held.
func (st *stripe) dropLocked(k []byte, s *slot) {
	delete(st.mu.slots, string(k))
	if s.busy {
		s.clearBusy()
	}
}

// abandonWrite wakes the waiters of s after its write failed. s stays
// busy for good: the engine is poisoned (gate.fail) and must not answer
// for its key, and the waiters find that out as they wake.
func (s *slot) abandonWrite() { close(s.done) }

// reapLocked drops slots whose leases have expired and that have no write
// in flight, so that holders that vanished do not grow the table forever.
// A reaped local holder is fenced; a reaped remote holder can still finish
// through its durable record.
//
// REQUIRES: st.mu held.
func (st *stripe) reapLocked(now time.Time) {
	for k, s := range st.mu.slots {
		if !s.busy && !now.Before(s.rec.LeaseExpires) {
			delete(st.mu.slots, k)
		}
	}
	st.mu.reapAt = max(minReapAt, 2*len(st.mu.slots))
}

// markBusy marks s busy. REQUIRES: the stripe mutex held; s not busy.
func (s *slot) markBusy() {
	s.busy = true
	s.done = make(chan struct{})
}

// clearBusy ends s's busy write and wakes its waiters. REQUIRES: the
// stripe mutex held; s busy.
func (s *slot) clearBusy() {
	s.busy = false
	close(s.done)
}

// eachSlot calls fn for every slot, under its stripe's mutex.
func (t *leaseTable) eachSlot(fn func(*slot)) {
	for i := range t.stripes {
		st := &t.stripes[i]
		st.mu.Lock()
		for _, s := range st.mu.slots {
			fn(s)
		}
		st.mu.Unlock()
	}
}

// waitLocked waits for the busy write on s to end. It releases st.mu
// while waiting and holds it again on return, so the caller must look the
// key up afresh. It fails if ctx ends or the write poisoned the engine.
//
// REQUIRES: st.mu held; s busy.
func (e *Engine) waitLocked(ctx context.Context, st *stripe, s *slot) error {
	done := s.done
	st.mu.Unlock()
	if e.testHookWait != nil {
		e.testHookWait()
	}
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	st.mu.Lock()
	if err == nil {
		err = e.gate.err()
	}
	return err
}
