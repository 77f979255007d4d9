package saga

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/idemkv/idemkv"
)

// call runs the action, and turns a panic in it into a *panicked error.
func call(ctx context.Context, kind string, s Step, x *Exec) (out []byte, err error) {
	defer func() {
		if v := recover(); v != nil {
			out, err = nil, &panicked{value: v, stack: debug.Stack()}
		}
	}()
	if kind == "do" {
		return s.Do(ctx, x)
	}
	return nil, s.Undo(ctx, x)
}

// panicked is a panic recovered from a step's Do or Undo, with the stack
// of the goroutine that raised it.
type panicked struct {
	value any
	stack []byte
}

func (p *panicked) Error() string { return fmt.Sprintf("panicked: %v", p.value) }

// panicked handles an action, held under l, whose Do or Undo panicked: a
// bug, not an answer, so the action is neither failed nor retried in
// this run. The runner stops as if it had crashed there: a local action
// wrote nothing (its writes were buffered), and its claim is given up; a
// remote one may have sent its call, and its record is left in progress,
// so that the runner that takes the saga over re-sends it under the same
// key. The saga's record is left as it was, for Resume once its lease
// has run out. An action that has panicked Options.MaxAttempts times in
// this runner is escalated instead, as an undo that keeps failing is,
// and waits for an operator.
func (d *driver) panicked(ctx context.Context, kind string, s Step, l idemkv.Lease, p *panicked) ([]byte, actionState, error) {
	n := d.r.countPanic(l.ID)
	d.log(ctx, slog.LevelError, msgPanicked, append(stepAttrs(kind, s), slog.Int("panics", n),
		slog.String("panic", fmt.Sprint(p.value)), slog.String("stack", string(p.stack)))...)
	if n >= d.r.o.MaxAttempts {
		note := idemkv.Note(fmt.Sprintf("saga %s: %s %s panicked %d times, the last: %v", d.r.def.Name, kind, s.Name, n, p.value))
		if err := d.r.store.MarkUncertain(ctx, l, note); err != nil {
			return nil, 0, err
		}
		return nil, actionEscalated, d.r.store.Escalate(ctx, idemkv.EscalateRequest{ID: l.ID, Token: l.Token, Note: note})
	}
	var err error
	if !s.Remote {
		err = d.r.store.Release(ctx, l, nil)
	}
	return nil, 0, errors.Join(fmt.Errorf("%w: saga %s: %s %s", ErrPanicked, d.r.def.Name, kind, s.Name), err)
}

// countPanic counts a panic of the action whose record is id, and
// returns how many it has had in this runner.
func (r *Runner) countPanic(id idemkv.ID) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.mu.stats.Panics++
	r.mu.panics[id]++
	return r.mu.panics[id]
}

// forgetPanics forgets the panics of an action that has ended.
func (r *Runner) forgetPanics(id idemkv.ID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.mu.panics, id)
}
