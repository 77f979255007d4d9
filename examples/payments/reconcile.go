package payments

import (
	"context"
	"fmt"
	"net/http"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/httpidem"
	"github.com/idemkv/idemkv/reconcile"
)

// paymentsEndpoint is the endpoint payments are claimed under.
const paymentsEndpoint = "POST /v1/payments"

// Reconcile implements reconcile.Reconciler for the payments a timeout or
// a crash left unsettled, and for the orders' authorizations (the same
// question, under the saga step's key): it asks the processor for the charge under the
// payment's downstream key. A charge found is the payment made: the
// payment row is written with the resolution, and retries replay it. No
// charge means none was made: the record is released and a retry charges
// anew. A processor that cannot answer, or answers malformed, is Unknown.
//
// It relies on the processor keeping its keys longer than a payment can
// stay unsettled (reconcile.Options.MaxAge): a key the processor has
// forgotten reads as never charged.
func (s *Service) Reconcile(ctx context.Context, rec idemkv.Record) (reconcile.Answer, error) {
	if a, ok, err := s.reconcileOrder(ctx, rec); ok || err != nil {
		return a, err
	}
	if rec.ID.Endpoint != paymentsEndpoint || rec.OperationID.IsZero() {
		return reconcile.Answer{Reason: fmt.Sprintf("not a payment: %s", rec.ID.Endpoint)}, nil
	}
	key := rec.OperationID.StepKey("charge")
	ch, found, err := s.cfg.Processor.Lookup(ctx, key)
	switch {
	case err != nil:
		return reconcile.Answer{}, fmt.Errorf("processor lookup of %s: %w", key, err)
	case !found:
		return reconcile.Answer{Verdict: reconcile.NotApplied, Apply: unhold(rec.ID.Tenant, rec.OperationID)}, nil
	case ch.ID == "" || ch.Key != key || ch.Amount <= 0 || !isCurrency(ch.Currency):
		return reconcile.Answer{Reason: fmt.Sprintf("processor answered a malformed charge for %s: %+v", key, ch)}, nil
	}
	p := s.payment(rec.ID.Tenant, rec.OperationID, ch)
	return reconcile.Answer{
		Verdict: reconcile.Applied,
		Result:  httpidem.Outcome(http.StatusCreated, "/v1/payments/"+p.ID, nil, nil), // replays rebuild it from the row
		Apply:   s.writer(p, rec.OperationID),
	}, nil
}
