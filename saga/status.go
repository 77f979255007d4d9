package saga

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkv/idemkv"
)

// Status reads where the saga id of tenant stands, from its records: the
// step being run or waited on, the outputs so far, and whether it is
// compensating. It changes nothing. ErrNotFound if it was never started.
func (r *Runner) Status(ctx context.Context, tenant, id string) (Status, error) {
	rec, err := r.get(ctx, r.id(tenant, id, ""))
	if err != nil {
		return Status{}, err
	}
	if rec == nil {
		return Status{}, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	st := Status{Outputs: map[string][]byte{}}
	failedAt := -1
	for i, s := range r.def.Steps {
		do, err := r.get(ctx, r.id(tenant, id, "do/"+s.Name))
		if err != nil {
			return Status{}, err
		}
		switch {
		case do != nil && do.State == idemkv.StateCompleted && do.Result.Status == statusFailed:
			failedAt, st.Failure = i, string(do.Result.Body)
		case do != nil && do.State == idemkv.StateCompleted:
			st.Outputs[s.Name] = do.Result.Body
			continue
		default:
			st.Phase, st.Step = pendingPhase(do), s.Name
		}
		break
	}
	switch {
	case rec.State == idemkv.StateUncertain && rec.Escalated:
		// Resume escalated the saga itself: its input had expired.
		return Status{Phase: Escalated, Compensating: st.Compensating, Failure: st.Failure, Outputs: st.Outputs}, nil
	case rec.State == idemkv.StateCompleted && rec.Result.Status == statusUndone:
		return Status{Phase: Compensated, Failure: string(rec.Result.Body), Outputs: st.Outputs}, nil
	case rec.State == idemkv.StateCompleted:
		return Status{Phase: Completed, Outputs: st.Outputs}, nil
	case failedAt < 0:
		if st.Phase == "" {
			st.Phase = Running // every step done; the saga record is being completed
		}
		return st, nil
	}
	st.Compensating, st.Phase = true, Running
	for j := failedAt - 1; j >= 0; j-- {
		s := r.def.Steps[j]
		if s.Undo == nil {
			continue
		}
		undo, err := r.get(ctx, r.id(tenant, id, "undo/"+s.Name))
		if err != nil {
			return Status{}, err
		}
		if undo == nil || undo.State != idemkv.StateCompleted {
			st.Phase, st.Step = pendingPhase(undo), s.Name
			return st, nil
		}
	}
	return st, nil
}

// pendingPhase is the phase of a saga stopped at an action whose record
// is rec (nil: none yet).
func pendingPhase(rec *idemkv.Record) Phase {
	switch {
	case rec == nil || rec.State != idemkv.StateUncertain:
		return Running
	case rec.Escalated:
		return Escalated
	}
	return Waiting
}

// get reads a record, nil if there is none.
func (r *Runner) get(ctx context.Context, id idemkv.ID) (*idemkv.Record, error) {
	rec, err := r.store.Get(ctx, id)
	switch {
	case errors.Is(err, idemkv.ErrNotFound):
		return nil, nil
	case err != nil:
		return nil, err
	}
	return &rec, nil
}

// Action is one action of a saga, as a reconciler sees its record.
type Action struct {
	// Kind is "do" or "undo"; Step the step's name.
	Kind, Step string
	// Key is the action's downstream idempotency key (Exec.Key).
	Key string
}

// ActionOf reports whether rec is the record of one of this runner's
// saga actions (a step's Do or Undo), and which, with the downstream key
// it was sent under: what a reconciler asks the downstream about. It reads
// the saga's record for its operation id.
func (r *Runner) ActionOf(ctx context.Context, rec idemkv.Record) (Action, bool, error) {
	kind, step, ok := r.actionOf(rec.ID)
	if !ok {
		return Action{}, false, nil
	}
	saga, err := r.store.Get(ctx, r.id(rec.ID.Tenant, rec.ID.Key, ""))
	if err != nil {
		return Action{}, false, fmt.Errorf("saga: the record of saga %q: %w", rec.ID.Key, err)
	}
	return Action{Kind: kind, Step: step, Key: saga.OperationID.StepKey(kind + "/" + step)}, true, nil
}

// Done returns the Result that settles a remote action's record as done
// with output: what a reconciler answers (reconcile.Answer.Result) when the
// downstream says the action happened.
func Done(output []byte) idemkv.Result { return idemkv.Result{Status: statusDone, Body: output} }
