package engine

import (
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// writeStalls counts Pebble's write stalls and the time writes spent in
// them, fed by its event listener. Pebble stalls writes when memtables
// queue up faster than they flush, or when level 0 reaches
// L0StopWritesThreshold sublevels (three times
// Options.L0CompactionThreshold): every write waits until a flush or a
// compaction catches up. Pebble reports at most one stall at a time (it
// begins and ends them under its commit mutex), and ends each one it
// begins.
type writeStalls struct {
	now func() time.Time // elapsed time; Go's monotonic clock in Open
	mu  struct {
		sync.Mutex
		count int64         // stalls begun since Open
		total time.Duration // time in the stalls that ended
		began time.Time     // when the stall in progress began; zero if none
	}
}

// listener returns the event callbacks that keep w.
func (w *writeStalls) listener() pebble.EventListener {
	return pebble.EventListener{
		WriteStallBegin: func(pebble.WriteStallBeginInfo) { w.begin() },
		WriteStallEnd:   w.end,
	}
}

func (w *writeStalls) begin() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.mu.count++
	w.mu.began = w.now()
}

func (w *writeStalls) end() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.mu.began.IsZero() {
		w.mu.total += w.now().Sub(w.mu.began)
		w.mu.began = time.Time{}
	}
}

// counts returns the stalls begun since Open and the time spent in them,
// the stall in progress included: a stall that never ends shows as time
// that keeps growing.
func (w *writeStalls) counts() (n int64, d time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	d = w.mu.total
	if !w.mu.began.IsZero() {
		d += w.now().Sub(w.mu.began)
	}
	return w.mu.count, d
}
