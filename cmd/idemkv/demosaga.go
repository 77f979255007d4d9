package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/examples/payments"
	"github.com/idemkv/idemkv/reconcile"
	"github.com/idemkv/idemkv/saga"
)

// The demo's order saga (package saga), on the same store and processor
// as the payments: reserve the item (local), authorize the card (remote,
// under a key derived from the saga), confirm the order (local). A
// declined card releases the reservation.

// orderRunner returns a runner of the order saga on the demo's store.
func (d *demo) orderRunner() (*saga.Runner, error) {
	row := func(x *saga.Exec, state string) error {
		return x.Effects.Set([]byte("order/"+x.Tenant+"/"+x.ID), []byte(state))
	}
	return saga.New(d.e, saga.Definition{Name: "order", Steps: []saga.Step{
		{Name: "reserve",
			Do:   func(_ context.Context, x *saga.Exec) ([]byte, error) { return nil, row(x, "reserved, authorizing") },
			Undo: func(_ context.Context, x *saga.Exec) error { return row(x, "declined; reservation released") }},
		{Name: "authorize", Remote: true, Do: func(ctx context.Context, x *saga.Exec) ([]byte, error) {
			ch, err := d.proc.Charge(ctx, payments.ChargeRequest{Key: x.Key, Amount: demoAmount, Currency: "USD", Description: "order " + x.ID})
			switch {
			case errors.Is(err, payments.ErrProviderTimeout):
				return nil, fmt.Errorf("%w: %w", saga.ErrUnknown, err)
			case errors.Is(err, payments.ErrDeclined):
				return nil, fmt.Errorf("%w: %w", saga.ErrPermanent, err)
			case err != nil:
				return nil, err // unavailable: nothing charged, try again
			}
			return []byte(ch.ID), nil
		}},
		{Name: "confirm", Do: func(_ context.Context, x *saga.Exec) ([]byte, error) {
			return nil, row(x, "confirmed, charge "+string(x.Output("authorize")))
		}},
	}}, &saga.Options{Lease: demoLease})
}

// demoGrace is the reconciler's grace in the demo: how old an uncertain
// record must be before it is asked about.
const demoGrace = time.Second

// reconciler is the demo's: the order saga's authorizations, and the
// payments, each asked about at the processor.
func (d *demo) reconciler(r *saga.Runner) (*reconcile.Worker, error) {
	svc := d.svc.Load()
	return reconcile.New(d.e, reconcile.ReconcilerFunc(func(ctx context.Context, rec idemkv.Record) (reconcile.Answer, error) {
		a, ok, err := r.ActionOf(ctx, rec)
		switch {
		case err != nil:
			return reconcile.Answer{}, err
		case !ok:
			return svc.Reconcile(ctx, rec)
		}
		ch, found, err := d.proc.Lookup(ctx, a.Key)
		switch {
		case err != nil:
			return reconcile.Answer{}, err
		case !found:
			return reconcile.Answer{Verdict: reconcile.NotApplied}, nil
		}
		return reconcile.Answer{Verdict: reconcile.Applied, Result: saga.Done([]byte(ch.ID))}, nil
	}), &reconcile.Options{Clock: d.e, Grace: demoGrace, Handles: func(rec idemkv.Record) bool { return !r.Owns(rec) }})
}

func (d *demo) order(ctx context.Context, id string) string {
	v, err := d.e.GetData(ctx, []byte("order/"+d.account+"/"+id))
	if err != nil {
		return "(none)"
	}
	return string(v)
}

// 8. An order's authorization times out: the order waits, visibly, until
// the reconciler finds the charge; then it goes on and is confirmed.
func (d *demo) sagaTimeout(ctx context.Context) error {
	r, err := d.orderRunner()
	if err != nil {
		return err
	}
	id, p0 := "ord_"+randHex(4), d.proc.Stats()
	d.script.timeout()
	d.say("processor", "will authorize the next call, and then time out")
	st, err := r.Start(ctx, d.account, id, []byte(`{"sku":"pen","amount":5000}`))
	if err != nil {
		return err
	}
	if st.Phase != saga.Waiting || st.Step != "authorize" {
		return fmt.Errorf("the order is %s at %q; want waiting at authorize", st.Phase, st.Step)
	}
	d.say("saga", "order %s: reserve done; authorize timed out; the order waits (%s at %q)", id, st.Phase, st.Step)
	d.say("order", "the order page reads %q", d.order(ctx, id))
	w, err := d.reconciler(r)
	if err != nil {
		return err
	}
	d.clock.Advance(demoGrace)
	if err := w.Pass(ctx); err != nil {
		return err
	}
	d.say("reconciler", "%v later (its grace: the call that timed out has ended), asks the processor under the", demoGrace)
	d.say("", "step's key: authorized; the step is settled")
	d.clock.Advance(demoLease - demoGrace)
	n, err := r.Resume(ctx)
	if err != nil {
		return err
	}
	if st, err = r.Status(ctx, d.account, id); err != nil {
		return err
	}
	p := d.proc.Stats()
	if n != 1 || st.Phase != saga.Completed || p.Charges-p0.Charges != 1 {
		return fmt.Errorf("resumed %d, the order is %s, %d charges; want 1, completed, 1", n, st.Phase, p.Charges-p0.Charges)
	}
	d.say("saga", "resumed after the lease: %s; the order page reads %q", st.Phase, d.order(ctx, id))
	d.say("why", "the authorization was sent once, under a key derived from the saga; only the processor")
	d.say("", "knew whether it happened, and the saga went on only once it had said so")
	return nil
}

// 9. An order's card is declined: the reservation is released, and the
// order ends compensated.
func (d *demo) sagaDeclined(ctx context.Context) error {
	r, err := d.orderRunner()
	if err != nil {
		return err
	}
	id, p0 := "ord_"+randHex(4), d.proc.Stats()
	d.script.arm(func(context.Context) error { return payments.ErrDeclined })
	d.say("processor", "will decline the next card")
	st, err := r.Start(ctx, d.account, id, []byte(`{"sku":"pen","amount":5000}`))
	if err != nil {
		return err
	}
	p := d.proc.Stats()
	if st.Phase != saga.Compensated || p.Charges != p0.Charges {
		return fmt.Errorf("the order is %s after %d charges; want compensated after none", st.Phase, p.Charges-p0.Charges)
	}
	d.say("saga", "order %s: reserve done; authorize declined (%s); reserve undone", id, st.Failure)
	d.say("order", "the order page reads %q", d.order(ctx, id))
	again, err := r.Start(ctx, d.account, id, []byte(`{"sku":"pen","amount":5000}`))
	if err != nil {
		return err
	}
	if again.Phase != saga.Compensated {
		return fmt.Errorf("started again: %s, want compensated", again.Phase)
	}
	d.say("client", "starts the same order again: %s, nothing runs twice", again.Phase)
	return nil
}
