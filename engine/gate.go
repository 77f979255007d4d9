package engine

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/idemkv/idemkv"
)

// gate admits operations and lets Close wait for those in flight
// (including their fsyncs) before it closes Pebble. Admission never blocks,
// so an Effects callback that reads through GetData cannot deadlock
// against a concurrent Close.
//
// It also holds the error that poisoned the engine (idemkv.ErrFailed):
// from then on nothing is admitted.
type gate struct {
	mu struct {
		sync.Mutex
		closed   bool
		inflight int
		drained  sync.Cond // signalled when inflight drops to 0 after close
	}
	failed atomic.Pointer[error]
}

func (g *gate) init() { g.mu.drained.L = &g.mu.Mutex }

// enter admits one operation; every successful enter is paired with exit.
func (g *gate) enter() error {
	if err := g.err(); err != nil {
		return err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.mu.closed {
		return idemkv.ErrClosed
	}
	g.mu.inflight++
	return nil
}

// begin admits an operation on behalf of ctx: enter, then fail if ctx is
// already done. A successful begin is paired with exit.
func (g *gate) begin(ctx context.Context) error {
	if err := g.enter(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		g.exit()
		return err
	}
	return nil
}

func (g *gate) exit() {
	g.mu.Lock()
	if g.mu.inflight--; g.mu.inflight == 0 && g.mu.closed {
		g.mu.drained.Broadcast()
	}
	g.mu.Unlock()
}

// close stops admitting operations and waits for those in flight. It
// reports false if the gate was already closed.
func (g *gate) close() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.mu.closed {
		return false
	}
	g.mu.closed = true
	for g.mu.inflight > 0 {
		g.mu.drained.Wait()
	}
	return true
}

// fail poisons the engine with err (the first error wins) and returns it
// wrapped in idemkv.ErrFailed.
func (g *gate) fail(err error) error {
	g.failed.CompareAndSwap(nil, &err)
	return fmt.Errorf("%w: %w", idemkv.ErrFailed, err)
}

// err returns the poisoning error wrapped in idemkv.ErrFailed, or nil.
func (g *gate) err() error {
	if p := g.failed.Load(); p != nil {
		return fmt.Errorf("%w: %w", idemkv.ErrFailed, *p)
	}
	return nil
}
