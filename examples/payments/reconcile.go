package payments

import (
	"context"
	"fmt"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/reconcile"
)

// paymentsEndpoint is the endpoint payments are claimed under.
const paymentsEndpoint = "POST /v1/payments"

// Settling a payment without its request, by a reconciler (Reconcile) or
// by an operator (Settle): both answer through charged and notCharged,
// which write what the handler writes, so that the three ways a payment
// ends cannot drift apart.

// isPayment reports whether rec is a payment's record.
func isPayment(rec idemkv.Record) bool {
	return rec.ID.Endpoint == paymentsEndpoint && !rec.OperationID.IsZero()
}

// charged is the answer for a payment whose charge ch was made: its row,
// index entry and event, its hold converted and its intent deleted
// (writer), committed with the outcome a replay rebuilds from the row.
func (s *Service) charged(rec idemkv.Record, ch Charge) reconcile.Answer {
	p := s.payment(rec.ID.Tenant, rec.OperationID, ch)
	return reconcile.Answer{Verdict: reconcile.Applied, Result: createdOutcome(p.ID), Apply: s.writer(p, rec.OperationID)}
}

// notCharged is the answer for a payment that provably was not charged:
// the record is removed, its hold given back and its intent deleted with
// it (giveBack), and a retry charges anew.
func (s *Service) notCharged(rec idemkv.Record) reconcile.Answer {
	return reconcile.Answer{Verdict: reconcile.NotApplied, Apply: s.giveBack(rec.ID.Tenant, rec.OperationID, rec.Token)}
}

// validCharge reports whether ch reads as a charge under key.
func validCharge(ch Charge, key string) bool {
	return ch.ID != "" && ch.Key == key && ch.Amount > 0 && isCurrency(ch.Currency)
}

// Reconcile implements reconcile.Reconciler for the payments a timeout or
// a crash left unsettled, and for the orders' authorizations (the same
// question, under the saga step's key): it asks the processor for the
// charge under the payment's downstream key. A charge found is the
// payment made: the payment row is written with the resolution, and
// retries replay it. No charge means none was made: the record is
// released, the hold given back, and a retry charges anew under the same
// downstream key. A processor that cannot answer, or answers malformed,
// is Unknown.
//
// It relies on the processor keeping its keys longer than a payment can
// stay unsettled (reconcile.Options.MaxAge): a key the processor has
// forgotten reads as never charged.
func (s *Service) Reconcile(ctx context.Context, rec idemkv.Record) (reconcile.Answer, error) {
	if a, ok, err := s.reconcileOrder(ctx, rec); ok || err != nil {
		return a, err
	}
	if !isPayment(rec) {
		return reconcile.Answer{Reason: fmt.Sprintf("not a payment: %s", rec.ID.Endpoint)}, nil
	}
	key := rec.OperationID.StepKey("charge")
	ch, found, err := s.cfg.Processor.Lookup(ctx, key)
	switch {
	case err != nil:
		return reconcile.Answer{}, fmt.Errorf("processor lookup of %s: %w", key, err)
	case !found:
		return s.notCharged(rec), nil
	case !validCharge(ch, key):
		return reconcile.Answer{Reason: fmt.Sprintf("processor answered a malformed charge for %s: %+v", key, ch)}, nil
	}
	return s.charged(rec, ch), nil
}

// Settle implements reconcile.Settler: an operator's settlement of a
// payment writes what the service writes when it settles one itself.
//
//   - NotApplied: the answer gives the hold back and deletes the intent
//     (as a reconciler's "not applied" does).
//   - Applied: the payment is rebuilt from its intent (intent.go) and the
//     charge, which the processor is asked for under the payment's
//     downstream key; the answer writes its row, index entry and event,
//     converts its hold and deletes its intent (as the handler's
//     completion does), with the outcome a replay rebuilds from the row
//     (201 and its Location; result, the operator's, is not used). If the
//     processor cannot say, has no such charge, or answers malformed, the
//     payment is recorded as the operator says, with an empty charge id,
//     and a warning is logged.
//   - Applied, of a payment with no intent (begun before intents were
//     kept): the answer stores result, the operator's, converts the hold
//     (if any) and writes no row; a warning is logged.
//   - A record that is not a payment's (an order's saga step): the answer
//     stores result (Applied) or removes the record (NotApplied), and
//     writes nothing.
//
// A verdict other than Applied or NotApplied is an error.
func (s *Service) Settle(ctx context.Context, rec idemkv.Record, verdict reconcile.Verdict, result idemkv.Result) (reconcile.Answer, error) {
	if verdict != reconcile.Applied && verdict != reconcile.NotApplied {
		return reconcile.Answer{}, fmt.Errorf("payments: settle with verdict %q: want applied or not applied", verdict)
	}
	switch {
	case !isPayment(rec) && verdict == reconcile.Applied:
		return reconcile.Answer{Verdict: reconcile.Applied, Result: result}, nil
	case !isPayment(rec):
		return reconcile.Answer{Verdict: reconcile.NotApplied}, nil
	case verdict == reconcile.NotApplied:
		return s.notCharged(rec), nil
	}
	tenant, opID := rec.ID.Tenant, rec.OperationID
	log := s.cfg.Logger.With("tenant", tenant, "endpoint", rec.ID.Endpoint, "key_hash", rec.ID.Hash(),
		"token", rec.Token, "operation_id", opID.String())
	in, found, err := s.readIntent(ctx, tenant, opID)
	if err != nil {
		return reconcile.Answer{}, err
	}
	if !found {
		log.Warn("payments: settled as charged by an operator, but the payment has no intent (it began before intents were kept): " +
			"the operator's result is stored and no payment row is written")
		return reconcile.Answer{Verdict: reconcile.Applied, Result: result, Apply: dropHold(tenant, opID)}, nil
	}
	key := opID.StepKey("charge")
	ch, found, err := s.cfg.Processor.Lookup(ctx, key)
	var why string
	switch {
	case err != nil:
		why = "the processor could not say (" + err.Error() + ")"
	case !found:
		why = "the processor has no charge under its key"
	case !validCharge(ch, key):
		why = fmt.Sprintf("the processor answered a malformed charge (%+v)", ch)
	}
	if why != "" {
		log.Warn("payments: settled as charged by an operator; " + why +
			": the payment is recorded from its intent with an empty charge id")
		ch = Charge{Key: key, Amount: in.Amount, Currency: in.Currency, Description: in.Description}
	}
	return s.charged(rec, ch), nil
}

var (
	_ reconcile.Reconciler = (*Service)(nil)
	_ reconcile.Settler    = (*Service)(nil)
)
