package saga

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/sendlease"
)

// Start starts the saga id of tenant with input, or goes on with one
// started before with the same input (ErrMismatch for other input). It
// runs steps until the saga ends, waits on an unknown outcome, or is
// escalated, and returns where it stands. A saga that another runner
// holds is left to it (Phase Running).
func (r *Runner) Start(ctx context.Context, tenant, id string, input []byte) (Status, error) {
	// The input is stored before the saga record, so that a runner that
	// takes the saga over always finds it.
	c, err := r.store.Claim(ctx, idemkv.ClaimRequest{ID: r.id(tenant, id, "input"), Fingerprint: fingerprint(input),
		Mode: idemkv.ModeLocal, Retention: r.o.Retention})
	if err != nil {
		return Status{}, err
	}
	switch c.Outcome {
	case idemkv.Acquired:
		if err := r.refuseExpired(ctx, c.Lease, tenant, id); err != nil {
			return Status{}, err
		}
		if err := r.store.Complete(ctx, c.Lease, idemkv.Result{Status: statusDone, Body: input}, nil); err != nil {
			return Status{}, err
		}
	case idemkv.Mismatch:
		return Status{}, fmt.Errorf("%w: %q", ErrMismatch, id)
	case idemkv.InProgress:
		return Status{Phase: Running}, nil // another Start of it is storing the input
	}
	return r.run(ctx, tenant, id, input)
}

// refuseExpired gives the input's claim l back and fails with
// ErrInputExpired when the saga id of tenant is open already: its input
// had expired (a saga's input is stored before its record, and kept as
// long), and what is left of its records must not be run again.
func (r *Runner) refuseExpired(ctx context.Context, l idemkv.Lease, tenant, id string) error {
	rec, err := r.get(ctx, r.id(tenant, id, ""))
	switch {
	case err == nil && (rec == nil || rec.State == idemkv.StateCompleted):
		return nil
	case err == nil:
		err = fmt.Errorf("%w: saga %q stayed open past its records' retention; Resume escalates it for an operator", ErrInputExpired, id)
	}
	return errors.Join(err, r.store.Release(context.WithoutCancel(ctx), l, nil))
}

// Resume takes over the sagas of this definition whose runner went away
// (their lease ran out), and runs each as Start does. It returns how many
// it took over, and the errors of those it could not, after trying every
// one. A saga whose input its store no longer holds (it stayed open past
// its records' retention) is escalated, for an operator.
func (r *Runner) Resume(ctx context.Context) (int, error) {
	r.forgetRunOut(r.o.Clock.Now())
	req := idemkv.ListRequest{Limit: 1000}
	n := 0
	var errs error
	for {
		page, err := r.store.List(ctx, req)
		if err != nil {
			return n, err
		}
		for _, rec := range page.Records {
			if !r.Owns(rec) || rec.State != idemkv.StateInProgress {
				continue
			}
			took, err := r.resume(ctx, rec)
			if err != nil {
				if ctx.Err() != nil {
					return n, errors.Join(errs, err)
				}
				errs = errors.Join(errs, err) // the others go on
				continue
			}
			if took {
				n++
			}
		}
		if page.Next == "" {
			return n, errs
		}
		req.After = page.Next
	}
}

// resume takes over the abandoned saga record rec; took says it did
// (another runner may have taken it, or it may have ended, meanwhile).
func (r *Runner) resume(ctx context.Context, rec idemkv.Record) (took bool, err error) {
	in, err := r.store.Get(ctx, r.id(rec.ID.Tenant, rec.ID.Key, "input"))
	if errors.Is(err, idemkv.ErrNotFound) {
		note := "saga " + r.def.Name + ": its input has expired (the saga stayed open past its records' retention); settle it by hand"
		if err := r.store.Escalate(ctx, idemkv.EscalateRequest{ID: rec.ID, Token: rec.Token, Note: note}); err != nil {
			err = fmt.Errorf("saga: %q: its input has expired, and escalating it failed: %w", rec.ID.Key, err)
			r.log(ctx, slog.LevelError, msgStoreFailed, rec.ID.Tenant, rec.ID.Key, rec.Token, slog.Any("err", err))
			return false, err
		}
		r.log(ctx, slog.LevelError, msgEscalated, rec.ID.Tenant, rec.ID.Key, rec.Token, slog.String("note", note))
		return false, fmt.Errorf("saga: %q escalated: its input has expired", rec.ID.Key)
	}
	if err != nil {
		return false, fmt.Errorf("saga: input of %q: %w", rec.ID.Key, err)
	}
	_, took, err = r.runClaimed(ctx, rec.ID.Tenant, rec.ID.Key, in.Result.Body)
	return took, err
}

// run claims the saga record and drives the saga.
func (r *Runner) run(ctx context.Context, tenant, id string, input []byte) (Status, error) {
	st, _, err := r.runClaimed(ctx, tenant, id, input)
	return st, err
}

// runClaimed is run; took says this runner claimed the saga (rather than
// finding it ended, or held by another runner).
func (r *Runner) runClaimed(ctx context.Context, tenant, id string, input []byte) (Status, bool, error) {
	c, err := r.store.Claim(ctx, idemkv.ClaimRequest{ID: r.id(tenant, id, ""), Fingerprint: fingerprint(input),
		Mode: idemkv.ModeRemote, Resumable: true, Lease: r.o.Lease, Retention: r.o.Retention})
	if err != nil {
		return Status{}, false, err
	}
	switch c.Outcome {
	case idemkv.Acquired:
	case idemkv.Mismatch:
		return Status{}, false, fmt.Errorf("%w: %q", ErrMismatch, id)
	default: // ended (Replay), or held by another runner
		st, err := r.Status(ctx, tenant, id)
		return st, false, err
	}
	r.unpark(tenant, id) // a lease this runner kept of it has run out: this one replaces it
	d := r.driver(c.Lease, tenant, id, input)
	msg := msgStarted
	if c.Lease.Takeover() {
		msg = msgTakenOver
	}
	d.log(ctx, slog.LevelInfo, msg, slog.Uint64("attempt", uint64(c.Lease.Attempt)),
		slog.String("operation_id", c.Lease.OperationID.String()))
	st, err := d.run(ctx)
	return st, true, err
}

// driver returns a driver of the saga id of tenant, whose record it holds
// under l.
func (r *Runner) driver(l idemkv.Lease, tenant, id string, input []byte) *driver {
	return &driver{r: r, saga: l, tenant: tenant, id: id, input: input, outputs: map[string][]byte{}}
}

// run drives the saga, and if it stops to wait on an action (a reconciler,
// an operator), keeps its lease for Wake.
func (d *driver) run(ctx context.Context) (Status, error) {
	for {
		st, err := d.drive(ctx)
		if err != nil || (st.Phase != Waiting && st.Phase != Escalated) {
			return st, err
		}
		d.r.park(d.tenant, d.id, d.saga)
		// A settlement that came between the action's mark and the park
		// found no lease to wake: look at the action once more.
		kind := "do"
		if st.Compensating {
			kind = "undo"
		}
		rec, err := d.r.get(ctx, d.r.id(d.tenant, d.id, kind+"/"+st.Step))
		if err != nil || (rec != nil && rec.State == idemkv.StateUncertain) {
			return st, nil // still waiting (or unreadable: Wake, or Resume, goes on)
		}
		l, ok := d.r.unpark(d.tenant, d.id)
		if !ok {
			return st, nil // a Wake took it meanwhile
		}
		*d = *d.r.driver(l, d.tenant, d.id, d.input) // from the first step, as a new run
	}
}

// driver drives one saga whose record it holds.
type driver struct {
	r            *Runner
	saga         idemkv.Lease
	tenant, id   string
	input        []byte
	outputs      map[string][]byte
	failure      string // why a step failed for good
	failedAt     int    // its index; -1 while none has
	failedNow    bool   // it failed in this run, not in an earlier runner's
	compensating bool
}

// drive runs the steps, then, if one failed for good, the undos of those
// before it in reverse, and completes the saga record.
func (d *driver) drive(ctx context.Context) (Status, error) {
	steps := d.r.def.Steps
	d.failedAt = -1
forward:
	for i, s := range steps {
		out, st, err := d.action(ctx, "do", s)
		if err != nil {
			return Status{}, err
		}
		switch st {
		case actionDone:
			d.outputs[s.Name] = out
		case actionFailed:
			d.failedAt, d.failure = i, string(out)
			break forward
		default:
			return d.status(st, s.Name), nil
		}
	}
	if d.failedAt < 0 {
		if err := d.r.store.Complete(ctx, d.saga, idemkv.Result{Status: statusDone}, nil); err != nil {
			return Status{}, d.storeErr(ctx, err)
		}
		d.log(ctx, slog.LevelInfo, msgCompleted)
		return Status{Phase: Completed, Outputs: d.outputs}, nil
	}
	d.compensating = true
	if d.failedNow { // a runner that took over a compensating saga logged taken over
		d.log(ctx, slog.LevelInfo, msgCompensating, slog.String("step", steps[d.failedAt].Name), slog.String("failure", d.failure))
	}
	for j := d.failedAt - 1; j >= 0; j-- {
		s := steps[j]
		if s.Undo == nil {
			continue
		}
		_, st, err := d.action(ctx, "undo", s)
		if err != nil {
			return Status{}, err
		}
		if st != actionDone {
			return d.status(st, s.Name), nil
		}
	}
	if err := d.r.store.Complete(ctx, d.saga, idemkv.Result{Status: statusUndone, Body: []byte(d.failure)}, nil); err != nil {
		return Status{}, d.storeErr(ctx, err)
	}
	d.log(ctx, slog.LevelInfo, msgCompensated, slog.String("failure", d.failure))
	return Status{Phase: Compensated, Failure: d.failure, Outputs: d.outputs}, nil
}

// status is the saga's status stopped at step in state st.
func (d *driver) status(st actionState, step string) Status {
	p := Running
	switch st {
	case actionWaiting:
		p = Waiting
	case actionEscalated:
		p = Escalated
	}
	return Status{Phase: p, Step: step, Compensating: d.compensating, Failure: d.failure, Outputs: d.outputs}
}

// actionState is where one action (a step's Do, or its Undo) stands.
type actionState int

const (
	actionDone      actionState = iota // its recovery point is stored
	actionFailed                       // a Do failed for good
	actionWaiting                      // its outcome is unknown: a reconciler settles it
	actionEscalated                    // an Undo kept failing; an operator settles it
	actionBusy                         // another runner's attempt holds it
)

// action runs one action of step s, kind "do" or "undo", under its own
// record, or reads the outcome its record holds.
func (d *driver) action(ctx context.Context, kind string, s Step) ([]byte, actionState, error) {
	if err := d.renew(ctx); err != nil {
		// ErrFenced: another runner has it
		return nil, 0, d.storeErr(ctx, fmt.Errorf("saga: %q: the saga's lease: %w", d.id, err), stepAttrs(kind, s)...)
	}
	name := kind + "/" + s.Name
	mode := idemkv.ModeLocal
	if s.Remote {
		mode = idemkv.ModeRemote
	}
	c, err := d.r.store.Claim(ctx, idemkv.ClaimRequest{ID: d.r.id(d.tenant, d.id, name), Fingerprint: stepFP,
		Mode: mode, Resumable: true, Lease: d.r.o.Lease, Retention: d.r.o.Retention})
	if err != nil {
		return nil, 0, d.storeErr(ctx, err, stepAttrs(kind, s)...)
	}
	switch c.Outcome {
	case idemkv.Replay:
		// A failed status marks a Do that failed for good. Any other
		// outcome, and any outcome of an Undo (an operator may settle an
		// escalated one with another status), is done.
		if kind == "do" && c.Record.Result.Status == statusFailed {
			return c.Record.Result.Body, actionFailed, nil
		}
		return c.Record.Result.Body, actionDone, nil
	case idemkv.Reconciling:
		if c.Record.Escalated {
			return nil, actionEscalated, nil
		}
		return nil, actionWaiting, nil
	case idemkv.InProgress:
		return nil, actionBusy, nil
	case idemkv.Mismatch:
		return nil, 0, fmt.Errorf("saga: %q: record %s is not a step's", d.id, name)
	}
	out, st, err := d.attempts(ctx, kind, s, c.Lease)
	d.logAction(ctx, kind, s, st, err)
	if err == nil {
		d.r.forgetPanics(c.Lease.ID) // the action has ended
	}
	return out, st, err
}

// logAction logs how an action the runner ran ended: done, undone, its
// outcome unknown, escalated, or a store error. A Do that failed for good
// is logged by drive, as the saga's compensating.
func (d *driver) logAction(ctx context.Context, kind string, s Step, st actionState, err error) {
	ctx = context.WithoutCancel(ctx)
	attrs := stepAttrs(kind, s)
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		// The caller stopped the runner: nothing failed.
	case errors.Is(err, ErrPanicked):
		// Logged, with its stack, where it was recovered.
	case err != nil:
		_ = d.storeErr(ctx, err, attrs...)
	case st == actionDone && kind == "do":
		d.log(ctx, slog.LevelInfo, msgStepDone, attrs...)
	case st == actionDone:
		d.log(ctx, slog.LevelInfo, msgStepUndone, attrs...)
	case st == actionWaiting:
		d.log(ctx, slog.LevelInfo, msgStepUnknown, attrs...)
	case st == actionEscalated:
		d.log(ctx, slog.LevelError, msgEscalated, attrs...)
	}
}

// attempts tries an action it holds the lease of until it succeeds, fails
// for good, runs out of attempts or has an unknown outcome.
func (d *driver) attempts(ctx context.Context, kind string, s Step, l idemkv.Lease) ([]byte, actionState, error) {
	x := &Exec{Tenant: d.tenant, ID: d.id, Input: d.input, Key: d.saga.OperationID.StepKey(kind + "/" + s.Name), outputs: d.outputs}
	store := d.r.store
	for attempt := 1; ; attempt++ {
		var buf effectsBuffer
		if !s.Remote {
			x.Effects = &buf
		} else {
			x.sending, x.lease = d.sending(&l), &l
		}
		out, err := call(ctx, kind, s, x)
		bg := context.WithoutCancel(ctx) // settle the action even if ctx ends now
		var p *panicked
		switch {
		case errors.As(err, &p):
			return d.panicked(bg, kind, s, l, p)
		case err == nil:
			var apply func(idemkv.Effects) error
			if !s.Remote {
				apply = buf.apply
			}
			return out, actionDone, store.Complete(bg, l, idemkv.Result{Status: statusDone, Body: out}, apply)
		case s.Remote && (errors.Is(err, ErrUnknown) || ctx.Err() != nil):
			return nil, actionWaiting, store.MarkUncertain(bg, l, idemkv.Note(fmt.Sprintf("saga %s: %s: %v", d.r.def.Name, kind+" "+s.Name, err)))
		case ctx.Err() != nil:
			return nil, 0, errors.Join(ctx.Err(), store.Release(bg, l, nil)) // a local action: nothing was written
		case kind == "do" && s.Remote && l.Takeover() && !errors.Is(err, ErrPermanent) && attempt >= d.r.o.MaxAttempts:
			// The runner before this one may have sent the step and
			// crashed: its call may have landed. Failing the step would
			// leave that effect undone; only the downstream can say.
			note := idemkv.Note(fmt.Sprintf("saga %s: %s taken over from attempt %d, then %d failed tries, the last: %v",
				d.r.def.Name, s.Name, l.Attempt-1, attempt, err))
			return nil, actionWaiting, store.MarkUncertain(bg, l, note)
		case kind == "do" && (errors.Is(err, ErrPermanent) || attempt >= d.r.o.MaxAttempts):
			why := err.Error()
			if !errors.Is(err, ErrPermanent) {
				why = fmt.Sprintf("%s: gave up after %d attempts: %v", s.Name, attempt, err)
			}
			d.failedNow = true
			return []byte(why), actionFailed, store.Complete(bg, l, idemkv.Result{Status: statusFailed, Body: []byte(why)}, nil)
		case errors.Is(err, ErrPermanent) || attempt >= d.r.o.MaxAttempts:
			note := idemkv.Note(fmt.Sprintf("saga %s: undo %s failed %d times, the last: %v", d.r.def.Name, s.Name, attempt, err))
			if err := store.MarkUncertain(bg, l, note); err != nil {
				return nil, 0, err
			}
			return nil, actionEscalated, store.Escalate(bg, idemkv.EscalateRequest{ID: l.ID, Token: l.Token, Note: note})
		}
		if d.r.o.Logger != nil {
			d.log(ctx, slog.LevelWarn, msgStepRetrying, append(stepAttrs(kind, s), slog.Int("attempt", attempt), slog.Any("err", err))...)
		}
		select {
		case <-d.r.o.After(d.r.backoff(attempt)):
		case <-ctx.Done():
			bg := context.WithoutCancel(ctx)
			if kind == "do" && s.Remote && l.Takeover() {
				// This runner's tries had no effect, but the runner it
				// took over from may have sent the step: given up, the
				// step would be claimed afresh, and a runner no longer
				// taking over could fail it blind. Only the downstream
				// can say.
				note := idemkv.Note(fmt.Sprintf("saga %s: %s taken over from attempt %d, then stopped after %d failed tries, the last: %v",
					d.r.def.Name, s.Name, l.Attempt-1, attempt, err))
				return nil, actionWaiting, errors.Join(ctx.Err(), store.MarkUncertain(bg, l, note))
			}
			return nil, 0, errors.Join(ctx.Err(), store.Release(bg, l, nil)) // the tries had no effect
		}
		var rerr error
		if l, rerr = store.Renew(ctx, l, d.r.o.Lease); rerr != nil {
			return nil, 0, rerr
		}
		if rerr = d.renew(ctx); rerr != nil {
			return nil, 0, rerr
		}
	}
}

// sending is Exec.Sending for the remote action whose lease is *l
// (sendlease's rule, on the runner's clock).
func (d *driver) sending(l *idemkv.Lease) func(context.Context) error {
	length := l.Expires.Sub(d.r.o.Clock.Now())
	return func(ctx context.Context) error {
		renewed, err := sendlease.Renew(ctx, d.r.store, *l, length, d.r.o.Lease, d.r.o.Clock.Now())
		if err != nil {
			return fmt.Errorf("saga: the lease could not be renewed before the downstream call: %w", err)
		}
		*l = renewed
		return nil
	}
}

// renew renews the saga's lease, and keeps the renewed lease (its new
// expiry) for a park.
func (d *driver) renew(ctx context.Context) error {
	l, err := d.r.store.Renew(ctx, d.saga, d.r.o.Lease)
	if err == nil {
		d.saga = l
	}
	return err
}

// backoff is the wait after the given number of tries.
func (r *Runner) backoff(attempt int) time.Duration {
	d := r.o.MinBackoff
	for i := 1; i < attempt && d < r.o.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, r.o.MaxBackoff)
}

// effectsBuffer keeps a local action's writes and events until its
// outcome is known, and then commits them with it. It reads only its own
// writes: a step's Do runs before its outcome's commit, outside it, so a
// read could not be checked at that commit.
type effectsBuffer struct {
	ops    []effectOp
	events []idemkv.Event
}

type effectOp struct {
	del        bool
	key, value []byte
}

func (b *effectsBuffer) Get(key []byte) ([]byte, error) {
	for i := len(b.ops) - 1; i >= 0; i-- {
		if op := b.ops[i]; string(op.key) == string(key) {
			if op.del {
				return nil, fmt.Errorf("%w: %q deleted by this step", idemkv.ErrNotFound, key)
			}
			return append([]byte(nil), op.value...), nil
		}
	}
	return nil, fmt.Errorf("%w: a saga step reads only its own writes, not %q", idemkv.ErrInvalidArgument, key)
}

func (b *effectsBuffer) Emit(ev idemkv.Event) error {
	ev.Payload = append([]byte(nil), ev.Payload...)
	ev.Headers = maps.Clone(ev.Headers)
	b.events = append(b.events, ev)
	return nil
}

func (b *effectsBuffer) Set(key, value []byte) error {
	b.ops = append(b.ops, effectOp{key: append([]byte(nil), key...), value: append([]byte(nil), value...)})
	return nil
}

func (b *effectsBuffer) Delete(key []byte) error {
	b.ops = append(b.ops, effectOp{del: true, key: append([]byte(nil), key...)})
	return nil
}

func (b *effectsBuffer) apply(fx idemkv.Effects) error {
	for _, op := range b.ops {
		var err error
		if op.del {
			err = fx.Delete(op.key)
		} else {
			err = fx.Set(op.key, op.value)
		}
		if err != nil {
			return err
		}
	}
	for _, ev := range b.events {
		if err := fx.Emit(ev); err != nil {
			return err
		}
	}
	return nil
}
