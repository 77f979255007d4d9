package admin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/reconcile"
)

// An operator's resolution goes through the application whose record it
// settles, so that it writes what the application's own settlements
// write: the payment row of a charge that happened, the hold given back
// of one that did not. Without that, an applied resolution stores an
// outcome whose object does not exist (a replay answers 201 with no
// payment behind it), and a no-effect one leaves the operation's hold
// counted for ever. A verified resolution asks the reconciler first and
// stores what the downstream says, never the operator's word against it.

// DefaultResolveTimeout is how long a resolution waits for each call of
// the Settler or the Reconciler when ResolveOptions.Timeout is zero.
const DefaultResolveTimeout = 10 * time.Second

// ResolveOptions connect Resolve to the application whose records it
// settles. A nil *ResolveOptions, or the zero value, settles the record
// alone, as the store's Resolve does.
type ResolveOptions struct {
	// Settler, if set, makes every resolution that is not verified go
	// through the application: an applied one commits the Answer of
	// Settle(rec, reconcile.Applied, the operator's result), its Result
	// (the operator's, if the Answer's is zero) and its Apply; a
	// no-effect one commits the Apply of Settle(rec,
	// reconcile.NotApplied, zero result), which gives back what the
	// operation held. An error from Settle, an Answer of the opposite
	// verdict, or a panic in Settle or in the Apply refuses the
	// resolution: nothing is written. Default: none, the record alone.
	Settler reconcile.Settler
	// Reconciler, if set, answers verified resolutions
	// (ResolveRequest.Verify): it is asked about the record, and the
	// resolution is made only if it agrees with the operator, with its
	// own Answer (the Result and Apply it would have committed). Without
	// one a verified resolution is refused (ErrNoReconciler).
	Reconciler reconcile.Reconciler
	// Timeout bounds each call of Settle and Reconcile, which must honour
	// their context: a call that does not answer in time refuses the
	// resolution. Default: DefaultResolveTimeout.
	Timeout time.Duration
	// Clock measures Timeout (idemkv.AfterFunc), so that a simulation's
	// TimerClock drives it. Default: Go's timers.
	Clock idemkv.Clock
}

// Errors of a resolution through the application. Each refuses it;
// nothing is written, and the audit log records the refusal.
var (
	// ErrNoReconciler: the resolution asked to be verified, and there is
	// no reconciler to ask.
	ErrNoReconciler = errors.New("admin: verify needs a reconciler, and this service has none")
	// ErrDownstreamDisagrees: the reconciler answered the opposite of the
	// operator's resolution (a charge found for a no-effect resolution,
	// none for an applied one).
	ErrDownstreamDisagrees = errors.New("admin: the downstream disagrees with the resolution")
	// ErrDownstreamUnknown: the reconciler could not say what became of
	// the operation (it answered unknown, failed, panicked or timed
	// out). A resolution without verify stands on the operator's word.
	ErrDownstreamUnknown = errors.New("admin: the downstream could not say what happened")
	// ErrServiceRefused: the Settler refused the resolution, answered
	// the opposite verdict, or the writes it gave failed or panicked.
	ErrServiceRefused = errors.New("admin: the service refused the settlement")
)

// PanicError is a panic of the application's Settle, Reconcile or
// Apply, recovered by Resolve: the resolution was refused. It wraps
// ErrServiceRefused (or ErrDownstreamUnknown for the reconciler's).
type PanicError struct {
	// In says which call panicked: "settle", "reconcile" or "apply".
	In string
	// Value is what it panicked with.
	Value any
}

func (e *PanicError) Error() string { return fmt.Sprintf("%s panicked: %v", e.In, e.Value) }

// Unwrap places the panic among the refusals.
func (e *PanicError) Unwrap() error {
	if e.In == "reconcile" {
		return ErrDownstreamUnknown
	}
	return ErrServiceRefused
}

func (o *ResolveOptions) orDefault() *ResolveOptions {
	if o == nil {
		return &ResolveOptions{}
	}
	return o
}

// settlement fills sr, the store's resolution of rec that req asks for,
// with what the application commits with it, and entry with what the
// application said; an error refuses the resolution.
func (o *ResolveOptions) settlement(ctx context.Context, rec *idemkv.Record, req *ResolveRequest, sr *idemkv.ResolveRequest, entry *AuditEntry) error {
	if rec.State == idemkv.StateCompleted {
		// Asking the application about a settled record could only
		// confuse the refusal the store would give.
		return fmt.Errorf("%w: the record is completed: only an uncertain, abandoned or escalated record is resolved", idemkv.ErrWrongState)
	}
	switch {
	case req.Verify:
		return o.verify(ctx, rec, req, sr, entry)
	case o.Settler != nil:
		return o.settle(ctx, rec, req, sr, entry)
	}
	return nil
}

// verify asks the reconciler about rec and, if it agrees with req,
// commits its Answer instead of the operator's result.
func (o *ResolveOptions) verify(ctx context.Context, rec *idemkv.Record, req *ResolveRequest, sr *idemkv.ResolveRequest, entry *AuditEntry) error {
	a, err := o.call(ctx, "reconcile", func(ctx context.Context) (reconcile.Answer, error) {
		return o.Reconciler.Reconcile(ctx, *rec)
	})
	if err == nil && a.Verdict > reconcile.NotApplied {
		err = fmt.Errorf("the reconciler answered %v", a.Verdict)
	}
	if err != nil {
		entry.Downstream = reconcile.Unknown.String()
		if errors.Is(err, ErrDownstreamUnknown) { // a panic
			return err
		}
		return fmt.Errorf("%w: %w; resolve without verify if you know what happened", ErrDownstreamUnknown, err)
	}
	entry.Downstream = a.Verdict.String()
	switch {
	case a.Verdict == reconcile.Unknown:
		return fmt.Errorf("%w: %s; resolve without verify if you know what happened", ErrDownstreamUnknown, cmp.Or(a.Reason, "no reason given"))
	case a.Verdict == reconcile.Applied && req.NoEffect:
		return fmt.Errorf("%w: it says the operation happened, so the record is not released (resolve --applied --verify stores what it found)", ErrDownstreamDisagrees)
	case a.Verdict == reconcile.NotApplied && !req.NoEffect:
		return fmt.Errorf("%w: it says the operation did not happen, so no outcome is stored (resolve --no-effect --verify releases the record)", ErrDownstreamDisagrees)
	}
	sr.Apply = o.guard(a.Apply)
	if a.Verdict == reconcile.Applied {
		sr.Result = a.Result
		entry.Outcome = fmt.Sprintf("completed with the downstream's answer, status %d", a.Result.Status)
		if a.Result.Pointer != "" {
			entry.Outcome += " " + a.Result.Pointer
		}
	} else {
		entry.Outcome = "removed: the downstream confirms the operation did not happen, a retry runs anew"
	}
	return nil
}

// settle asks the Settler for the Answer that goes with req's
// resolution of rec.
func (o *ResolveOptions) settle(ctx context.Context, rec *idemkv.Record, req *ResolveRequest, sr *idemkv.ResolveRequest, entry *AuditEntry) error {
	verdict, opposite := reconcile.Applied, reconcile.NotApplied
	if req.NoEffect {
		verdict, opposite = reconcile.NotApplied, reconcile.Applied
	}
	result := sr.Result
	a, err := o.call(ctx, "settle", func(ctx context.Context) (reconcile.Answer, error) {
		return o.Settler.Settle(ctx, *rec, verdict, result)
	})
	switch {
	case errors.Is(err, ErrServiceRefused): // a panic
		return err
	case err != nil:
		return fmt.Errorf("%w: %w", ErrServiceRefused, err)
	case a.Verdict == opposite || a.Verdict > reconcile.NotApplied:
		return fmt.Errorf("%w: asked to settle it %v, it answered %v", ErrServiceRefused, verdict, a.Verdict)
	}
	sr.Apply = o.guard(a.Apply)
	if !req.NoEffect && !isZero(&a.Result) {
		sr.Result = a.Result
		entry.Outcome = fmt.Sprintf("completed with status %d", a.Result.Status)
	}
	entry.Outcome += ", through the service"
	return nil
}

func isZero(r *idemkv.Result) bool { return r.Status == 0 && r.Pointer == "" && r.Body == nil }

// call runs f, bounded by o's timeout, with a panic turned into a
// *PanicError. It does not start a goroutine: f must honour ctx.
func (o *ResolveOptions) call(ctx context.Context, in string, f func(context.Context) (reconcile.Answer, error)) (a reconcile.Answer, err error) {
	timeout := cmp.Or(o.Timeout, DefaultResolveTimeout)
	errTimedOut := fmt.Errorf("no answer within %v", timeout)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := idemkv.AfterFunc(o.Clock, timeout, func() { cancel(errTimedOut) })
	defer stop()
	defer func() {
		if p := recover(); p != nil {
			a, err = reconcile.Answer{}, &PanicError{In: in, Value: p}
		}
	}()
	a, err = f(ctx)
	if err != nil && context.Cause(ctx) == errTimedOut {
		err = fmt.Errorf("%w: %w", errTimedOut, err)
	}
	return a, err
}

// guard returns apply with a panic turned into a *PanicError and an
// error marked as the service's, so that either refuses the resolution
// (the store writes nothing when its Apply fails); nil stays nil. The
// error is wrapped, not replaced: the store still sees its own errors
// (a conflict it retries, say).
func (o *ResolveOptions) guard(apply func(idemkv.Effects) error) func(idemkv.Effects) error {
	if apply == nil {
		return nil
	}
	return func(fx idemkv.Effects) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = &PanicError{In: "apply", Value: p}
			}
		}()
		if err := apply(fx); err != nil {
			return fmt.Errorf("%w: its writes failed: %w", ErrServiceRefused, err)
		}
		return nil
	}
}
