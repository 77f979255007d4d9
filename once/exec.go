package once

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/sendlease"
)

// Exec is what a Func is given: the lease it runs under and the writes
// that commit with its result. It is valid only while the Func runs, and
// not safe for concurrent use.
//
// In local mode (the default) the Func runs inside the store's commit of
// its result (idemkv.Store.Complete's apply). Effects is that commit's:
// Get reads business data, and the store checks every read at the commit,
// running the Func again if a key it read was written by another commit
// meanwhile; Set, Delete and Emit commit atomically with the result. So
// the Func may run more than once, and must act only through Effects: no
// calls to other systems, no changes to memory that a second run would
// repeat. Its result may depend on what it read: the result stored is the
// one of the run whose reads and writes committed (see the package doc,
// "The local result").
//
// In remote mode the Func runs once, outside any commit, and acts on
// another system, sending Lease.OperationID (or a per-step key derived
// from it, OperationID.StepKey) as that system's idempotency key. Its
// local writes are deferred to the commit of its result: Effects' Set,
// Delete and Emit are recorded and made there, in call order with the
// functions given to Apply, which may also read (checked at that commit,
// and run again on a conflict). Effects.Get fails: nothing read before
// the commit could be checked at it. If the Func fails, the deferred
// writes are dropped.
type Exec struct {
	// Lease is the lease the Func runs under: its Token (to fence a
	// downstream write), its Attempt (above 1 after a takeover: in remote
	// mode, an earlier attempt's call may have landed; resume it under the
	// same OperationID) and, in remote mode, the OperationID.
	Lease idemkv.Lease
	// Run counts the runs of the Func in this Do, from 1. In remote mode
	// it is always 1; in local mode a run that another run follows was
	// discarded, its writes with it.
	Run int
	// Effects takes the writes that commit with the result; see above.
	Effects idemkv.Effects

	store    idemkv.Store
	lease    time.Duration                // Call.Lease, for Renew
	length   time.Duration                // the lease's length as claimed, for Sending (0: unknown)
	deferred []func(idemkv.Effects) error // remote mode: what the commit applies
	ended    bool                         // the Func has returned
	log      *callLog                     // Call.Logger's records of the key
}

// Apply runs f on the Effects of the commit of the Func's result. In
// local mode it runs f at once (the Func is in that commit) and returns
// its error. In remote mode it adds f to the commit, after the Func
// returns successfully: f may read and write, and runs again if its reads
// conflict; an error from f stores nothing, and the key becomes uncertain
// (the remote call has happened). Apply fails once the Func has returned.
func (x *Exec) Apply(f func(idemkv.Effects) error) error {
	if x.ended {
		return fmt.Errorf("%w: once: Exec.Apply after the function returned", idemkv.ErrInvalidArgument)
	}
	if x.Lease.Mode != idemkv.ModeRemote {
		return f(x.Effects)
	}
	x.deferred = append(x.deferred, f)
	return nil
}

// Renew extends a remote Func's lease by Call.Lease (zero: the store's
// default) from now, for a downstream call that may outlast it, and
// updates Lease. It fails with idemkv.ErrFenced if the lease was already
// lost: another caller took the key over (the Func should stop), and with
// idemkv.ErrInvalidArgument in local mode, where the Func runs inside its
// commit and should be short.
func (x *Exec) Renew(ctx context.Context) error {
	if x.Lease.Mode != idemkv.ModeRemote {
		return fmt.Errorf("%w: once: a local function runs inside its commit; it has no lease to renew", idemkv.ErrInvalidArgument)
	}
	l, err := x.store.Renew(ctx, x.Lease, x.lease)
	if err != nil {
		return err
	}
	x.Lease = l
	return nil
}

// Sending makes sure a remote Func still holds its lease, and is called
// right before its downstream call. With less than half of the lease
// left by the store's clock (the Func was slow, or its process paused) it
// renews the lease, durably (Renew): a reconciler that judged the record
// abandoned meanwhile then settles nothing (idemkv.ResolveRequest.Since).
// It fails, and the call must not be sent, with idemkv.ErrFenced when
// the lease was lost (another caller took the key over, or a reconciler
// or an operator settled it), or with the store's error. On a store that
// tells no time (an idemkv.Clock) it renews every time; in local mode it
// fails with idemkv.ErrInvalidArgument, as Renew does.
func (x *Exec) Sending(ctx context.Context) error {
	if x.Lease.Mode != idemkv.ModeRemote {
		return x.Renew(ctx) // ErrInvalidArgument
	}
	now, length := time.Time{}, time.Duration(0) // unknown: renew
	if c, ok := x.store.(idemkv.Clock); ok {
		now, length = c.Now(), x.length
	}
	l, err := sendlease.Renew(ctx, x.store, x.Lease, length, x.lease, now)
	if err != nil {
		return err
	}
	x.Lease = l
	return nil
}

// applyDeferred is the Complete callback of a remote Func's result.
func (x *Exec) applyDeferred(fx idemkv.Effects) error {
	for _, f := range x.deferred {
		if err := f(fx); err != nil {
			return err
		}
	}
	return nil
}

// release gives up the key: nothing took effect. A lease already lost
// (ErrFenced: taken over, or expired and dropped) needs no release. why
// is the attribute that says, in the log, what made it give up.
func (x *Exec) release(ctx context.Context, why slog.Attr) error {
	err := x.store.Release(ctx, x.Lease, nil)
	switch {
	case err == nil:
		x.log.log(ctx, slog.LevelInfo, msgReleased, token(x.Lease), why)
		return nil
	case errors.Is(err, idemkv.ErrFenced):
		x.log.log(ctx, slog.LevelWarn, msgLeaseLost, token(x.Lease), errAttr(err))
		return nil
	}
	err = fmt.Errorf("once: %s: releasing the key (its lease bounds the wait): %w", name(x.Lease.ID), err)
	x.log.log(ctx, slog.LevelError, msgGiveUpFail, token(x.Lease), errAttr(err))
	return err
}

// giveUp releases the key and returns err, with the release's error if
// it failed.
func (x *Exec) giveUp(ctx context.Context, err error) error {
	if rerr := x.release(ctx, errAttr(err)); rerr != nil {
		return errors.Join(err, rerr)
	}
	return err
}

// remoteEffects is a remote Func's Effects: it defers the writes to the
// commit of the result, through Apply.
type remoteEffects struct{ x *Exec }

func (r remoteEffects) Get(key []byte) ([]byte, error) {
	return nil, fmt.Errorf("%w: once: a remote function reads nothing before its commit (read %q in Exec.Apply)",
		idemkv.ErrInvalidArgument, key)
}

func (r remoteEffects) Set(key, value []byte) error {
	k, v := bytes.Clone(key), bytes.Clone(value)
	return r.x.Apply(func(fx idemkv.Effects) error { return fx.Set(k, v) })
}

func (r remoteEffects) Delete(key []byte) error {
	k := bytes.Clone(key)
	return r.x.Apply(func(fx idemkv.Effects) error { return fx.Delete(k) })
}

func (r remoteEffects) Emit(ev idemkv.Event) error {
	ev.Payload = bytes.Clone(ev.Payload)
	ev.Headers = maps.Clone(ev.Headers)
	return r.x.Apply(func(fx idemkv.Effects) error { return fx.Emit(ev) })
}
