package httpidem

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/sendlease"
)

// ErrSettled is returned by Op.Apply once the outcome has been committed:
// when the response outgrew the stored-body cap or was flushed, its
// outcome was committed before the first byte went out.
var ErrSettled = errors.New("httpidem: outcome already committed")

// Op is the protected operation a handler runs under. The middleware puts
// it in the request's context; FromContext returns it.
type Op struct {
	mu sync.Mutex
	// lease is the request's; the heartbeat moves its Expires as it
	// renews it.
	lease     idemkv.Lease
	applies   []func(idemkv.Effects) error
	pointer   string
	uncertain bool
	released  bool
	invalid   bool
	// compensations commit with the release (Release's arguments).
	compensations []func(idemkv.Effects) error
	note          string
	settled       bool
	// store renews the lease for d (the route's), now tells the
	// middleware's time, and length is the lease's length as claimed:
	// what Sending needs (nil store: an Op made without a middleware).
	store  idemkv.Store
	d      time.Duration
	now    func() time.Time
	length time.Duration
}

type opKey struct{}

// FromContext returns the operation the request runs under, or nil when
// the request is not protected (a method or route the middleware passes
// through, a request without a key on a route where it is optional, or a
// fail-open route whose store is down).
func FromContext(ctx context.Context) *Op {
	op, _ := ctx.Value(opKey{}).(*Op)
	return op
}

// Lease returns the lease the request holds: its fencing token and, for a
// remote route, the OperationID to send downstream as the downstream
// idempotency key. Every attempt of one logical operation that resumes an
// earlier one (a takeover) carries the same OperationID. Its Expires is
// the lease's end as last renewed by the heartbeat (Route.Heartbeat).
func (op *Op) Lease() idemkv.Lease {
	op.mu.Lock()
	defer op.mu.Unlock()
	return op.lease
}

// Sending makes sure the request still holds its lease, and is called
// right before a remote route's handler sends its downstream call. When
// less than half of the lease is left by the middleware's clock (the
// handler was slow, or its process paused), it renews the lease, durably,
// as the heartbeat does: a reconciler that meanwhile judged the record
// abandoned then settles nothing (idemkv.ResolveRequest.Since). It fails,
// and the call must not be sent, when the lease is no longer held
// (idemkv.ErrFenced: another attempt took the key over, or a reconciler
// or an operator settled it), or when the store could not renew it.
//
// Once it returns, op.Lease().Expires is the last moment the call may be
// acted on: send it as the call's deadline to a downstream that can
// refuse a call arriving later, so that a reconciler's "not applied",
// asked a grace past it, stays true (package reconcile, Caveats).
func (op *Op) Sending(ctx context.Context) error {
	if op.store == nil {
		return nil
	}
	renewed, err := sendlease.Renew(ctx, op.store, op.Lease(), op.length, op.d, op.now())
	if err != nil {
		return fmt.Errorf("httpidem: the lease could not be renewed before the downstream call: %w", err)
	}
	op.renewed(renewed.Expires)
	return nil
}

// renewed records the lease's end as a heartbeat renewed it.
func (op *Op) renewed(expires time.Time) {
	op.mu.Lock()
	op.lease.Expires = expires
	op.mu.Unlock()
}

// Apply adds business writes that commit atomically with the operation's
// outcome: they are durable exactly when a retry can replay the response,
// and discarded if the outcome is not stored (a 5xx, a panic). f runs at
// commit time; an error from it stores nothing, and the client gets a 503.
// Apply fails with ErrSettled after the outcome is committed.
func (op *Op) Apply(f func(idemkv.Effects) error) error {
	op.mu.Lock()
	defer op.mu.Unlock()
	if op.settled {
		return ErrSettled
	}
	op.applies = append(op.applies, f)
	return nil
}

// SetPointer sets the stored result's pointer: where the created object
// lives, for example "/v1/payments/pay_42". By default it is the response's
// Location header. A replay of a response too large to store is rebuilt
// from it (see Route.Rebuild).
func (op *Op) SetPointer(p string) {
	op.mu.Lock()
	op.pointer = p
	op.mu.Unlock()
}

// Uncertain says the operation's effect may or may not have happened (a
// downstream call timed out). Instead of storing the response, the
// middleware records the key as uncertain with note: retries are answered
// 409 reconciling, never re-run, until the record is resolved
// (idemkv.Store.Resolve). The handler's own response still goes to this
// client.
func (op *Op) Uncertain(note string) {
	op.mu.Lock()
	op.uncertain, op.note = true, note
	op.mu.Unlock()
}

// Release says the operation had no effect: the downstream call was never
// made, or was refused before it acted. The middleware then releases the
// key instead of storing the response, and a retry runs anew. In a remote
// route a response that is not final (a 5xx, 408, 425 or 429;
// Route.Storable) marks the key uncertain unless the handler calls
// Release, because such a response proves nothing about the downstream
// (a validation failure, Invalid, is released too: the handler never
// called it). Uncertain wins over Release.
//
// compensate, if given, are writes that commit with the release, in the
// same commit fenced on the request's lease (idemkv.Store.Release): what
// the attempt gives back, such as an amount it held. An attempt that has
// lost its lease to a retry gives back nothing, so it cannot free what
// the retry still uses. Writes added with Apply are not part of a
// release: they go with a stored outcome only.
func (op *Op) Release(compensate ...func(idemkv.Effects) error) {
	op.mu.Lock()
	op.released = true
	op.compensations = append(op.compensations, compensate...)
	op.mu.Unlock()
}

// Invalid says the request failed validation before the handler began
// to execute it: nothing was done (no downstream call, no write outside
// Apply). Like Stripe, which saves no result for such a request, the
// middleware then neither stores the response nor marks the key
// uncertain, in a remote route too: it releases the key, so that the
// corrected request, sent with the same key, runs anew instead of
// meeting a 422 key-mismatch. Writes added with Apply are dropped. It
// applies whatever the status the handler answers; by default a 400 or
// 422 counts as Invalid without the call (Route.ValidationFailure).
// Uncertain wins over Invalid.
func (op *Op) Invalid() {
	op.mu.Lock()
	op.invalid = true
	op.mu.Unlock()
}

// compensate is the Release callback running every compensation in
// order, or nil if there are none.
func (op *Op) compensate() func(idemkv.Effects) error {
	if len(op.compensations) == 0 {
		return nil
	}
	return func(fx idemkv.Effects) error {
		for _, f := range op.compensations {
			if err := f(fx); err != nil {
				return err
			}
		}
		return nil
	}
}

// apply is the Complete callback running every registered Apply in order.
func (op *Op) apply(fx idemkv.Effects) error {
	for _, f := range op.applies {
		if err := f(fx); err != nil {
			return err
		}
	}
	return nil
}

// declared is what the handler said about its operation.
type declared struct {
	pointer   string
	uncertain bool
	released  bool
	invalid   bool
	note      string
}

// settle marks the outcome committed and returns what the handler
// declared.
func (op *Op) settle() declared {
	op.mu.Lock()
	defer op.mu.Unlock()
	op.settled = true
	return declared{pointer: op.pointer, uncertain: op.uncertain, released: op.released, invalid: op.invalid, note: op.note}
}
