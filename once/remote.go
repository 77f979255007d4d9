package once

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/idemkv/idemkv"
)

// runRemote runs a remote Func once, outside any commit, and settles the
// key: its result is stored with the writes it deferred; an error it marks
// NoEffect releases the key, unless the claim took over an earlier
// attempt (which may have acted); any other error, a panic, or a result that
// cannot be stored leaves the key uncertain, since the downstream may have
// acted.
func (x *Exec) runRemote(ctx context.Context, fn Func) (Outcome, error) {
	bg := context.WithoutCancel(ctx) // the call may have landed: record it whatever ctx does
	x.Run = 1
	x.Effects = remoteEffects{x: x}
	res, err := x.callRemote(ctx, bg, fn)
	switch {
	case errors.Is(err, ErrNoEffect) && x.Lease.Takeover():
		// Proof of this attempt's call says nothing of the attempt taken
		// over, which may have sent its own under the same operation id.
		return Outcome{}, x.uncertain(bg, "the function had no effect, but the attempt it took over may have", withoutNoEffect(err))
	case errors.Is(err, ErrNoEffect):
		return Outcome{}, x.giveUp(bg, err)
	case err != nil:
		return Outcome{}, x.uncertain(bg, "the function failed", err)
	}
	var apply func(idemkv.Effects) error
	if len(x.deferred) > 0 {
		apply = x.applyDeferred
	}
	err = x.store.Complete(bg, x.Lease, res, apply)
	switch {
	case errors.Is(err, idemkv.ErrFenced):
		// Another caller took the key over (a resumable one, or a claim
		// that found the lease expired and made the key uncertain).
		x.log.log(bg, slog.LevelWarn, msgLeaseLost, token(x.Lease), errAttr(err))
		return Outcome{}, fmt.Errorf("%w: %s: the lease was lost before the outcome was stored: %w",
			ErrUncertain, name(x.Lease.ID), err)
	case err != nil:
		x.log.log(bg, slog.LevelError, msgStoreFailed, token(x.Lease), errAttr(err))
		return Outcome{}, x.uncertain(bg, "its outcome could not be stored", err)
	}
	if x.log.enabled(bg, slog.LevelInfo) {
		x.log.log(bg, slog.LevelInfo, msgStored, token(x.Lease), slog.Int("status", res.Status),
			slog.String("operation_id", x.Lease.OperationID.String()))
	}
	return Outcome{Result: res, OperationID: x.Lease.OperationID}, nil
}

// callRemote calls fn. If fn panics or exits its goroutine
// (runtime.Goexit), it marks the key uncertain first, and raises the
// panic again from where it was stopped, so that its trace still shows
// where fn panicked.
func (x *Exec) callRemote(ctx, bg context.Context, fn Func) (res idemkv.Result, err error) {
	returned := false
	defer func() {
		x.ended = true
		if returned {
			return
		}
		v := recover()
		how := "exited its goroutine (runtime.Goexit)"
		if v != nil {
			how = fmt.Sprintf("panicked: %v", v)
		}
		_ = x.uncertain(bg, "the function "+how, nil)
		if v != nil {
			panic(v)
		}
	}()
	res, err = fn(ctx, x)
	returned = true
	return res, err
}

// uncertain marks the key uncertain, noting what happened and its cause,
// and returns the ErrUncertain that says so (with the marking's own
// error, if it failed; ErrFenced there means another caller already took
// the key over, which leaves it no less uncertain to this one).
func (x *Exec) uncertain(ctx context.Context, what string, cause error) error {
	note := "once: " + what
	err := fmt.Errorf("%w: %s: %s", ErrUncertain, name(x.Lease.ID), what)
	if cause != nil {
		note += ": " + cause.Error()
		err = fmt.Errorf("%w: %s: %s: %w", ErrUncertain, name(x.Lease.ID), what, cause)
	}
	switch merr := x.store.MarkUncertain(ctx, x.Lease, idemkv.Note(note)); {
	case merr == nil:
		x.log.log(ctx, slog.LevelInfo, msgUncertain, token(x.Lease), slog.String("note", idemkv.Note(note)))
	case errors.Is(merr, idemkv.ErrFenced):
		x.log.log(ctx, slog.LevelWarn, msgLeaseLost, token(x.Lease), errAttr(merr))
	default:
		merr = fmt.Errorf("once: %s: marking the key uncertain: %w", name(x.Lease.ID), merr)
		x.log.log(ctx, slog.LevelError, msgGiveUpFail, token(x.Lease), errAttr(merr))
		err = errors.Join(err, merr)
	}
	return err
}
