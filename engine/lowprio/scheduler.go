package lowprio

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// scheduler is a pebble.CompactionScheduler for one store. It admits
// compactions the way Pebble's default scheduler does, up to the store's
// GetAllowedWithoutPermission (which follows Options.CompactionConcurrency
// Range and the compaction backlog), and hands each a grant handle that
// lowers its goroutine's priority.
//
// Pebble orders the scheduler's mutex after its own: TrySchedule is called
// with the store's mutex held, while the grant loop calls into the store
// with no lock held.
type scheduler struct {
	p       *Priority
	db      pebble.DBForCompaction
	stalled atomic.Bool // between Pebble's WriteStallBegin and WriteStallEnd

	mu struct {
		sync.Mutex
		running      int
		unregistered bool
		// granting serializes grant loops; granted is signalled when one
		// ends.
		granting bool
		granted  sync.Cond
	}
	poke, stop, stopped chan struct{}
}

// sampleEvery is how often the scheduler looks for compactions it may
// admit beyond those it is told of: Pebble does not tell a scheduler of
// every change of the allowed concurrency (a flush can raise it), so, like
// Pebble's own scheduler, it samples.
const sampleEvery = 100 * time.Millisecond

var _ pebble.CompactionScheduler = (*scheduler)(nil)

func newScheduler(p *Priority) *scheduler {
	s := &scheduler{p: p, poke: make(chan struct{}, 1), stop: make(chan struct{}), stopped: make(chan struct{})}
	s.mu.granted.L = &s.mu.Mutex
	return s
}

// Register implements pebble.CompactionScheduler.
func (s *scheduler) Register(_ int, db pebble.DBForCompaction) {
	s.db = db
	go s.sample()
}

// Unregister implements pebble.CompactionScheduler: it stops granting and
// waits for a grant loop in progress.
func (s *scheduler) Unregister() {
	close(s.stop)
	<-s.stopped
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.unregistered = true
	for s.mu.granting {
		s.mu.granted.Wait()
	}
}

// TrySchedule implements pebble.CompactionScheduler.
func (s *scheduler) TrySchedule() (bool, pebble.CompactionGrantHandle) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.unregistered || s.db.GetAllowedWithoutPermission() <= s.mu.running {
		return false, nil
	}
	s.mu.running++
	return true, &handle{s: s}
}

// UpdateGetAllowedWithoutPermission implements pebble.CompactionScheduler.
func (s *scheduler) UpdateGetAllowedWithoutPermission() {
	select {
	case s.poke <- struct{}{}:
	default:
	}
}

// sample grants what it can every sampleEvery and when poked, until
// Unregister.
func (s *scheduler) sample() {
	defer close(s.stopped)
	t := time.NewTicker(sampleEvery)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		case <-s.poke:
		}
		s.grant()
	}
}

// done ends one admitted compaction and admits waiting ones in its place.
func (s *scheduler) done() {
	s.mu.Lock()
	s.mu.running--
	s.mu.Unlock()
	s.grant()
}

// grant admits waiting compactions while the store allows more than are
// running. One grant loop runs at a time; it calls into the store with no
// lock held.
func (s *scheduler) grant() {
	s.mu.Lock()
	for s.mu.granting {
		s.mu.granted.Wait()
	}
	n := 0
	if !s.mu.unregistered {
		n = s.db.GetAllowedWithoutPermission() - s.mu.running
	}
	if n <= 0 {
		s.mu.Unlock()
		return
	}
	s.mu.granting = true
	s.mu.Unlock()
	for ; n > 0; n-- {
		if waiting, _ := s.db.GetWaitingCompaction(); !waiting {
			break
		}
		s.mu.Lock()
		s.mu.running++
		s.mu.Unlock()
		if !s.db.Schedule(&handle{s: s}) {
			s.mu.Lock()
			s.mu.running--
			s.mu.Unlock()
			break
		}
	}
	s.mu.Lock()
	s.mu.granting = false
	s.mu.granted.Broadcast()
	s.mu.Unlock()
}

// handle is the grant of one compaction. Pebble calls MeasureCPU with
// CompactionGoroutinePrimary regularly from the compaction's own goroutine
// (every 128 keys and at the end of each output table), so the first such
// call lowers that goroutine. Only that goroutine reads or writes tried.
type handle struct {
	s     *scheduler
	tried bool
}

// Started implements pebble.CompactionGrantHandle.
func (h *handle) Started() {}

// MeasureCPU implements pebble.CompactionGrantHandle.
func (h *handle) MeasureCPU(g pebble.CompactionGoroutineKind) {
	if g != pebble.CompactionGoroutinePrimary || h.tried {
		return
	}
	h.tried = true
	if !h.s.stalled.Load() {
		h.s.p.lower()
	}
}

// CumulativeStats implements pebble.CompactionGrantHandle.
func (h *handle) CumulativeStats(pebble.CompactionGrantHandleStats) {}

// Done implements pebble.CompactionGrantHandle.
func (h *handle) Done() { h.s.done() }
