package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// ErrUnhealthy is returned by Claim, and by Health, while Pebble's latest
// flush or compaction has failed: out of disk space or file descriptors,
// or an I/O error. Pebble retries them, and the engine is healthy again
// after the next one that succeeds; meanwhile claims that would acquire
// are refused at once, where the work they start would otherwise wait on
// writes that cannot flush. Replays, reads and operations already holding
// a key go on.
var ErrUnhealthy = errors.New("engine: store unhealthy")

// health is the state of Pebble's background work, fed by its event
// listener. A failure is logged when it begins and when it ends, not at
// each of Pebble's retries.
type health struct {
	logf func(format string, args ...any)
	now  func() time.Time
	// sick mirrors mu.err != nil, so that a claim checks health without
	// taking the mutex.
	sick atomic.Bool
	mu   struct {
		sync.Mutex
		err    error     // the latest background error; nil when healthy
		since  time.Time // when the failures in a row began
		errors int64     // background errors since Open
	}
}

// listener returns the event callbacks that keep h.
func (h *health) listener() pebble.EventListener {
	return pebble.EventListener{
		BackgroundError: h.failed,
		FlushEnd: func(info pebble.FlushInfo) {
			if info.Err == nil {
				h.recovered()
			}
		},
		CompactionEnd: func(info pebble.CompactionInfo) {
			if info.Err == nil {
				h.recovered()
			}
		},
	}
}

func (h *health) failed(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.mu.errors++
	first := h.mu.err == nil
	if first {
		h.mu.since = h.now()
	}
	h.mu.err = err
	h.sick.Store(true)
	// Logged once the state is set: whoever reads the line finds the
	// store refusing claims already.
	if first {
		h.logf("idemkv: store unhealthy, refusing new claims until Pebble's background work succeeds: %v", err)
	}
}

func (h *health) recovered() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mu.err != nil {
		h.mu.err = nil
		h.sick.Store(false)
		h.logf("idemkv: store healthy again after %d background errors since %s", h.mu.errors, h.mu.since.Format(time.RFC3339))
	}
}

// check returns nil while healthy, else an ErrUnhealthy saying why.
func (h *health) check() error {
	if !h.sick.Load() {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mu.err == nil {
		return nil
	}
	return fmt.Errorf("%w since %s: %v", ErrUnhealthy, h.mu.since.Format(time.RFC3339), h.mu.err)
}

// counts returns the background errors since Open and, while unhealthy,
// when the current run of them began.
func (h *health) counts() (errors int64, since time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mu.err != nil {
		since = h.mu.since
	}
	return h.mu.errors, since
}

// Health returns nil while the store is healthy and an error matching
// ErrUnhealthy (or idemkv.ErrFailed, once a write has failed) while it is
// not: what a readiness or liveness probe should report. It reads no disk:
// ctx only ends it early.
func (e *Engine) Health(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := e.gate.err(); err != nil {
		return err
	}
	return e.health.check()
}
