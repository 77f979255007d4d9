package payments

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/idemkv/idemkv/httpidem"
)

// The payment's call to the processor, and the answers an attempt gives
// by what became of it.

// charge makes the payment's one call to the processor, under the lease
// op holds and the hold begin took, and answers the client by what the
// processor said: a charge is stored with its payment, a refusal before
// charging gives the hold back, and an answer that may hide a charge
// leaves the payment to the reconciler.
func (s *Service) charge(w http.ResponseWriter, r *http.Request, op *httpidem.Op, c ChargeRequest) {
	tenant, opID, key := op.Lease().ID.Tenant, op.Lease().OperationID, c.Key
	// A call never sent charged nothing: a client gone before it is
	// released. Once it is sent, only the processor's own answer can say
	// that nothing was charged; a call cut short by the client going away
	// may still land, so it is left to the reconciler like a timeout.
	if err := r.Context().Err(); err != nil {
		s.provider.WithLabelValues("cancelled").Inc()
		if op.Lease().Takeover() {
			s.outcomeUnknown(w, op, "the request ended before its call, after a takeover (attempt "+
				strconv.FormatUint(uint64(op.Lease().Attempt), 10)+"): an earlier attempt's call may have charged; downstream key "+key)
			return
		}
		op.Release(s.giveBack(tenant, opID, op.Lease().Token))
		httpidem.WriteProblem(w, "provider-unavailable", http.StatusServiceUnavailable,
			"the request ended before the card processor was called; nothing was charged: "+err.Error(), time.Second)
		return
	}
	// The lease must still be this attempt's when the call goes out: a
	// handler that stalled since its claim renews it first, or, if a
	// retry or the reconciler has the payment now, sends nothing.
	if err := op.Sending(r.Context()); err != nil {
		s.giveUp(w, op, "its lease could not be renewed before the call", err) // fenced, and so nothing, if the lease is gone
		return
	}
	c.Deadline = s.callDeadline(op.Lease().Expires)
	ch, err := s.cfg.Processor.Charge(r.Context(), c)
	switch {
	case errors.Is(err, ErrProviderTimeout):
		s.provider.WithLabelValues("timeout").Inc()
		s.outcomeUnknown(w, op, "card processor timed out; downstream key "+key)
		return
	case errors.Is(err, ErrDeclined):
		s.provider.WithLabelValues("declined").Inc()
		// A final answer, stored and replayed: the same request would be
		// declined again. Nothing was charged: the hold and the intent
		// go with it.
		if err := op.Apply(s.giveBack(tenant, opID, op.Lease().Token)); err != nil {
			s.storeError(w, err)
			return
		}
		httpidem.WriteProblem(w, "card-declined", http.StatusPaymentRequired, "the card was declined; nothing was charged", 0)
		return
	case errors.Is(err, ErrProviderUnavailable) && op.Lease().Takeover():
		// This call was refused, but the attempt this one took over may
		// have sent its own under the same key before it stopped, and
		// that one may have charged: only the processor can say.
		s.provider.WithLabelValues(refusal(err)).Inc()
		s.outcomeUnknown(w, op, "card processor refused the call after a takeover (attempt "+
			strconv.FormatUint(uint64(op.Lease().Attempt), 10)+"): an earlier attempt's call may have charged; downstream key "+key)
		return
	case errors.Is(err, ErrProviderUnavailable):
		// Refused before charging (unavailable, or the call came after
		// its deadline: this attempt was held back past its lease or its
		// timeout): a retry may charge.
		s.provider.WithLabelValues(refusal(err)).Inc()
		op.Release(s.giveBack(tenant, opID, op.Lease().Token))
		detail := "the card processor is unavailable; nothing was charged. Retry with the same key."
		if errors.Is(err, ErrCallExpired) {
			detail = "the call reached the card processor after its deadline, and was refused; nothing was charged. Retry with the same key."
		}
		httpidem.WriteProblem(w, "provider-unavailable", http.StatusServiceUnavailable, detail, time.Second)
		return
	case err != nil:
		// The call ended some other way once sent: the client went away
		// while it was in flight, say. It may still land.
		label := "unknown"
		if r.Context().Err() != nil {
			label = "cancelled"
		}
		s.provider.WithLabelValues(label).Inc()
		s.outcomeUnknown(w, op, fmt.Sprintf("the call to the card processor ended with %v; downstream key %s", err, key))
		return
	}
	s.provider.WithLabelValues("charged").Inc()
	p := s.payment(tenant, opID, ch)
	if err := op.Apply(s.writer(p, opID)); err != nil {
		httpidem.WriteProblem(w, "internal", http.StatusInternalServerError, err.Error(), 0)
		return
	}
	w.Header().Set("Location", "/v1/payments/"+p.ID)
	writeJSON(w, http.StatusCreated, p.Payment)
}

// callDeadline is the deadline of a call sent now under a lease that ends
// at leaseEnd (zero: unknown): that end, or Config.CallTimeout from now if
// sooner. A reconciler asks about a payment only a grace past its lease's
// end, or past its mark as uncertain, which comes after its call ended;
// with the grace above CallTimeout, no call of it can charge once it
// asks.
func (s *Service) callDeadline(leaseEnd time.Time) time.Time {
	if d := s.cfg.Clock.Now().Add(s.cfg.CallTimeout); leaseEnd.IsZero() || d.Before(leaseEnd) {
		return d
	}
	return leaseEnd
}

// refusal is the metrics label of a processor's refusal err.
func refusal(err error) string {
	if errors.Is(err, ErrCallExpired) {
		return "expired"
	}
	return "unavailable"
}

// giveUp ends an attempt that did not call the processor, for err (a
// store's): it releases the key, gives the hold back and answers 503,
// unless it took over an attempt whose call may have gone out, which
// only the processor can settle (the takeover resumed that attempt's
// operation and hold): that key is left uncertain, keeping its hold, for
// the reconciler, and answered as such.
func (s *Service) giveUp(w http.ResponseWriter, op *httpidem.Op, why string, err error) {
	l := op.Lease()
	if l.Takeover() {
		s.outcomeUnknown(w, op, "attempt "+strconv.FormatUint(uint64(l.Attempt), 10)+" took over, and "+why+
			" ("+err.Error()+"): an earlier attempt's call may have charged; downstream key "+l.OperationID.StepKey("charge"))
		return
	}
	op.Release(s.giveBack(l.ID.Tenant, l.OperationID, l.Token))
	s.storeError(w, err)
}

// outcomeUnknown answers a payment whose charge may or may not have
// happened: its key becomes uncertain (note says why) until the
// reconciler asks the processor, and keeps its hold.
func (s *Service) outcomeUnknown(w http.ResponseWriter, op *httpidem.Op, note string) {
	op.Uncertain(note)
	httpidem.WriteProblem(w, "payment-outcome-unknown", http.StatusGatewayTimeout,
		"the card processor did not answer; the payment is being reconciled and will not be charged twice. Retries with the same key answer 409 until it is settled.", 0)
}
