package saga

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/idemkv/idemkv"
)

// A runner that stops a saga to wait on an action (a remote step whose
// outcome is unknown waits for a reconciler; an escalated action for an
// operator) keeps holding the saga's record: it is the one that will go on
// with it. Before Wake, nothing told it when the action was settled, so
// the saga waited until its lease ran out and Resume took it over (an
// order under timeouts took 40 s to confirm). The runner now keeps the
// lease of each saga it stopped (parked), and Wake, called once the action
// is settled, goes on under it at once. A runner that did not stop the
// saga (another process, or this one restarted) holds no lease of it:
// Wake then takes the saga over if its lease has run out, and otherwise
// leaves it to its lease and Resume, as before.

// Wake goes on at once with the saga that rec, the record of one of this
// runner's saga actions (a step's Do or Undo), belongs to. Call it once
// that record has been settled, so that the saga does not wait for its
// lease to run out: a reconcile.Worker calls it from its OnResolve hook,
//
//	OnResolve: func(ctx context.Context, rec idemkv.Record, _ reconcile.Verdict) {
//		runner.Wake(ctx, rec)
//	},
//
// and an application that settles an action by hand can call it too. If
// this runner stopped the saga to wait on the action, it still holds the
// saga's lease and goes on under it, in the caller's goroutine, running
// the steps that follow until the saga ends or stops again. Otherwise it
// takes the saga over if its runner went away (its lease ran out), as
// Resume would, and leaves it to the runner that holds it if not. It
// returns where the saga stands, with ok true; for any other record it
// does nothing and returns ok false. Its errors are those of Start, and
// are logged to Options.Logger as Start's are.
func (r *Runner) Wake(ctx context.Context, rec idemkv.Record) (st Status, ok bool, err error) {
	kind, step, ok := r.actionOf(rec.ID)
	if !ok {
		return Status{}, false, nil
	}
	tenant, id := rec.ID.Tenant, rec.ID.Key
	l, parked := r.unpark(tenant, id)
	in, err := r.get(ctx, r.id(tenant, id, "input"))
	switch {
	case err != nil:
		if parked {
			r.park(tenant, id, l) // a later Wake may go on under it
		}
		r.log(ctx, slog.LevelError, msgStoreFailed, tenant, id, l.Token, slog.Any("err", err))
		return Status{}, true, err
	case in == nil:
		// The saga outlived its input; Resume escalates it once its
		// lease has run out.
		st, err := r.Status(ctx, tenant, id)
		return st, true, err
	}
	if parked {
		nl, err := r.store.Renew(ctx, l, r.o.Lease)
		switch {
		case err == nil:
			r.update(func(s *Stats) { s.Woken++ })
			d := r.driver(nl, tenant, id, in.Result.Body)
			d.log(ctx, slog.LevelInfo, msgWoken, slog.String("step", step), slog.String("action", kind))
			st, err := d.run(ctx)
			return st, true, err
		case !errors.Is(err, idemkv.ErrFenced):
			r.park(tenant, id, l)
			r.log(ctx, slog.LevelError, msgStoreFailed, tenant, id, l.Token, slog.Any("err", err))
			return Status{}, true, err
		}
		// Fenced: another runner took the saga over meanwhile, or it ended.
	}
	st, err = r.run(ctx, tenant, id, in.Result.Body)
	return st, true, err
}

// actionOf reports whether id is the record of one of this runner's saga
// actions, and which: kind "do" or "undo", and the step's name.
func (r *Runner) actionOf(id idemkv.ID) (kind, step string, ok bool) {
	rest, ok := strings.CutPrefix(id.Endpoint, r.endpoint()+"/")
	if !ok {
		return "", "", false
	}
	kind, step, ok = strings.Cut(rest, "/")
	if !ok || (kind != "do" && kind != "undo") {
		return "", "", false
	}
	return kind, step, true
}

// park keeps l, the lease of the saga id of tenant, which this runner
// stopped to wait on an action.
func (r *Runner) park(tenant, id string, l idemkv.Lease) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.mu.parked[sagaRef{tenant, id}] = l
}

// unpark takes the lease this runner kept of the saga id of tenant, if it
// kept one.
func (r *Runner) unpark(tenant, id string) (idemkv.Lease, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := sagaRef{tenant, id}
	l, ok := r.mu.parked[k]
	delete(r.mu.parked, k)
	return l, ok
}

// forgetRunOut forgets the kept leases that have run out by now: Resume
// (this runner's or another's) takes those sagas over, and Wake, not
// finding one, takes it over itself.
func (r *Runner) forgetRunOut(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, l := range r.mu.parked {
		if !now.Before(l.Expires) {
			delete(r.mu.parked, k)
		}
	}
}

func (r *Runner) update(fn func(*Stats)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fn(&r.mu.stats)
}
