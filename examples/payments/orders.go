package payments

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fingerprint"
	"github.com/idemkv/idemkv/httpidem"
	"github.com/idemkv/idemkv/reconcile"
	"github.com/idemkv/idemkv/saga"
)

// Orders are the guide's multi-step workflow, run by package saga on the
// service's store: reserve the item (local: the order row), authorize the
// card (remote: the processor, under a key derived from the saga), then
// confirm (local). A declined card releases the reservation. The order's
// page shows where it stands ("authorizing"), also while an authorization
// whose answer was lost waits for the reconciler.

// Order is the API's order object.
type Order struct {
	ID       string `json:"id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	SKU      string `json:"sku"`
	// Status is reserving, authorizing, confirming, confirmed, cancelling,
	// declined, failed or needs-attention (an undo escalated to an operator).
	Status string `json:"status"`
	// Charge is the authorization's charge, once there is one.
	Charge string `json:"charge,omitempty"`
	// Reconciling says the current step's outcome is unknown and the
	// reconciler is asking the processor.
	Reconciling bool   `json:"reconciling,omitempty"`
	Failure     string `json:"failure,omitempty"`
}

type orderRequest struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	SKU      string `json:"sku"`
}

// maxOrderBody bounds the body of POST /v1/orders.
const maxOrderBody = 4 << 10

// readOrder reads an order as payments are read (decodePayment): one
// JSON object with no duplicate members and nothing after it, members
// named exactly, a whole-number amount. A body that Go's decoder alone
// would take (the first of two "amount"s, "AMOUNT", trailing bytes)
// could be read one way by the saga and another by whatever in front of
// the service reads it too.
func readOrder(body io.Reader) (orderRequest, error) {
	var req orderRequest
	b, err := io.ReadAll(io.LimitReader(body, maxOrderBody+1))
	switch {
	case err != nil:
		return req, fmt.Errorf("reading the body: %w", err)
	case len(b) > maxOrderBody:
		return req, fmt.Errorf("the body exceeds %d bytes", maxOrderBody)
	}
	if _, err := fingerprint.Canonical(b, nil); err != nil {
		return req, err
	}
	var members map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if dec.Decode(&members) != nil || members == nil {
		return req, errors.New("the body must be a JSON object")
	}
	for name, raw := range members {
		var err error
		switch name {
		case "amount":
			var n json.Number
			if raw[0] == '"' || json.Unmarshal(raw, &n) != nil {
				err = errors.New("amount must be a JSON number")
			} else if v, ok := wholeNumber(n.String()); ok {
				req.Amount = v
			} else {
				err = errors.New("amount must be a whole number of minor units")
			}
		case "currency":
			err = json.Unmarshal(raw, &req.Currency)
		case "sku":
			err = json.Unmarshal(raw, &req.SKU)
		default:
			err = fmt.Errorf("unknown member %q (members: amount, currency, sku)", name)
		}
		if err != nil {
			return req, err
		}
	}
	return req, nil
}

// orderID is the order (and saga) id of the client's idempotency key: the
// same key always names the same order.
func orderID(tenant, key string) string {
	h := sha256.Sum256([]byte(tenant + "\x00" + key))
	return "ord_" + hex.EncodeToString(h[:12])
}

func orderRowKey(tenant, id string) []byte {
	k, _ := idemkv.AppendTenantKey([]byte("ord/"), tenant, []byte(id))
	return k
}

// orderSaga is the order workflow on the service's store and processor.
func (s *Service) orderSaga() (*saga.Runner, error) {
	row := func(x *saga.Exec, state string) error {
		return x.Effects.Set(orderRowKey(x.Tenant, x.ID), []byte(state))
	}
	return saga.New(s.cfg.Store, saga.Definition{Name: "order", Steps: []saga.Step{
		{Name: "reserve",
			Do:   func(_ context.Context, x *saga.Exec) ([]byte, error) { return nil, row(x, "reserved") },
			Undo: func(_ context.Context, x *saga.Exec) error { return row(x, "released") }},
		{Name: "authorize", Remote: true, Do: s.authorize},
		{Name: "confirm", Do: func(_ context.Context, x *saga.Exec) ([]byte, error) { return nil, row(x, "confirmed") }},
	}}, &saga.Options{Lease: s.cfg.Lease, Logger: s.cfg.Logger})
}

// authorize charges the order's amount under the step's derived key.
func (s *Service) authorize(ctx context.Context, x *saga.Exec) ([]byte, error) {
	var req orderRequest
	if err := json.Unmarshal(x.Input, &req); err != nil {
		return nil, fmt.Errorf("%w: order input: %v", saga.ErrPermanent, err)
	}
	if err := x.Sending(ctx); err != nil {
		return nil, err // nothing sent: the step is another's now, or the store is down
	}
	ch, err := s.cfg.Processor.Charge(ctx, ChargeRequest{Key: x.Key, Amount: req.Amount, Currency: req.Currency,
		Description: "order " + x.ID, Deadline: s.callDeadline(x.LeaseExpires())})
	switch {
	case errors.Is(err, ErrDeclined):
		return nil, fmt.Errorf("%w: %w", saga.ErrPermanent, err)
	case errors.Is(err, ErrProviderUnavailable):
		return nil, err // refused before charging: tried again
	case err != nil:
		// A timeout, or any other end of a call that was sent: it may
		// have charged (Processor's contract), so only the processor can
		// say, and the saga waits for the reconciler.
		return nil, fmt.Errorf("%w: %w", saga.ErrUnknown, err)
	}
	return []byte(ch.ID), nil
}

// createOrder starts the order named by the Idempotency-Key, or reports
// where an earlier start of it stands: 201 once the order has ended
// (confirmed or declined), 202 while it is under way, with its Location.
func (s *Service) createOrder(w http.ResponseWriter, r *http.Request) {
	tenant, ok := s.authenticate(w, r)
	if !ok {
		return
	}
	// The middleware's parser: "o1" (a Structured Field string) and o1 (a
	// bare token) name one key, as on every protected route.
	key, err := httpidem.ParseKey(r.Header.Values(httpidem.HeaderKey))
	if err != nil {
		kind := httpidem.ProblemInvalidKey
		if errors.Is(err, httpidem.ErrMissingKey) {
			kind = httpidem.ProblemMissingKey
		}
		httpidem.WriteProblem(w, kind, http.StatusBadRequest, "an order needs an Idempotency-Key: "+err.Error(), 0)
		return
	}
	req, err := readOrder(r.Body)
	if err != nil {
		httpidem.WriteProblem(w, "invalid-order", http.StatusBadRequest, err.Error(), 0)
		return
	}
	if req.Amount <= 0 || !isCurrency(req.Currency) || req.SKU == "" || len(req.SKU) > 64 {
		httpidem.WriteProblem(w, "invalid-order", http.StatusUnprocessableEntity,
			"amount must be a positive whole number of minor units, currency three upper-case letters, sku 1 to 64 bytes", 0)
		return
	}
	input, _ := json.Marshal(req) // canonical: the saga binds its id to these bytes
	id := orderID(tenant, key)
	st, err := s.orders.Start(r.Context(), tenant, id, input)
	switch {
	case errors.Is(err, saga.ErrMismatch):
		httpidem.WriteProblem(w, httpidem.ProblemKeyMismatch, http.StatusUnprocessableEntity,
			"this Idempotency-Key started an order with another body", 0)
		return
	case errors.Is(err, saga.ErrInputExpired):
		httpidem.WriteProblem(w, "order-expired", http.StatusConflict,
			"this order stayed open past its records' retention: an operator settles it; nothing was run again", 0)
		return
	case err != nil:
		s.storeError(w, err)
		return
	}
	o := orderOf(id, req, st)
	w.Header().Set("Location", "/v1/orders/"+id)
	status := http.StatusCreated
	if st.Phase != saga.Completed && st.Phase != saga.Compensated {
		status = http.StatusAccepted
	}
	writeJSON(w, status, o)
}

// getOrder answers where an order stands, read from its saga's records.
func (s *Service) getOrder(w http.ResponseWriter, r *http.Request) {
	tenant, ok := s.authenticate(w, r)
	if !ok {
		return
	}
	id := r.PathValue("id")
	if !strings.HasPrefix(id, "ord_") || idemkv.ValidateKey(id) != nil {
		httpidem.WriteProblem(w, "not-found", http.StatusNotFound, "no such order", 0)
		return
	}
	in, err := s.cfg.Store.Get(r.Context(), idemkv.ID{Tenant: tenant, Endpoint: "saga/order/input", Key: id})
	if errors.Is(err, idemkv.ErrNotFound) {
		httpidem.WriteProblem(w, "not-found", http.StatusNotFound, "no such order", 0)
		return
	}
	var req orderRequest
	if err == nil {
		err = json.Unmarshal(in.Result.Body, &req)
	}
	var st saga.Status
	if err == nil {
		st, err = s.orders.Status(r.Context(), tenant, id)
	}
	switch {
	case errors.Is(err, saga.ErrNotFound):
		st = saga.Status{Phase: saga.Running, Step: "reserve"} // its input is stored, its saga not yet
	case err != nil:
		s.storeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, orderOf(id, req, st))
}

// orderOf is the order id of input req as its saga's status st shows it.
func orderOf(id string, req orderRequest, st saga.Status) Order {
	o := Order{ID: id, Amount: req.Amount, Currency: req.Currency, SKU: req.SKU, Charge: string(st.Outputs["authorize"])}
	switch {
	case st.Phase == saga.Completed:
		o.Status = "confirmed"
	case st.Phase == saga.Compensated && strings.Contains(st.Failure, ErrDeclined.Error()):
		o.Status, o.Failure = "declined", st.Failure
	case st.Phase == saga.Compensated:
		o.Status, o.Failure = "failed", st.Failure
	case st.Phase == saga.Escalated:
		o.Status, o.Failure = "needs-attention", st.Failure
	case st.Compensating:
		o.Status, o.Failure = "cancelling", st.Failure
	default:
		o.Status = map[string]string{"reserve": "reserving", "authorize": "authorizing", "confirm": "confirming"}[st.Step]
		o.Reconciling = st.Phase == saga.Waiting
	}
	return o
}

// authenticate is tenantOf, answering a 401 itself.
func (s *Service) authenticate(w http.ResponseWriter, r *http.Request) (string, bool) {
	tenant, err := s.tenantOf(r)
	if err != nil {
		w.Header().Set("WWW-Authenticate", challenge)
		httpidem.WriteProblem(w, httpidem.ProblemUnauthenticated, http.StatusUnauthorized, err.Error(), 0)
		return "", false
	}
	return tenant, true
}

// reconcileOrder answers for an order saga's action, by asking the
// processor under the action's key; ok is false for any other record.
func (s *Service) reconcileOrder(ctx context.Context, rec idemkv.Record) (reconcile.Answer, bool, error) {
	if s.orders == nil {
		return reconcile.Answer{}, false, nil
	}
	a, ok, err := s.orders.ActionOf(ctx, rec)
	if err != nil || !ok {
		return reconcile.Answer{}, ok, err
	}
	ch, found, err := s.cfg.Processor.Lookup(ctx, a.Key)
	switch {
	case err != nil:
		return reconcile.Answer{}, true, err
	case !found:
		return reconcile.Answer{Verdict: reconcile.NotApplied}, true, nil
	case ch.Key != a.Key || ch.ID == "":
		return reconcile.Answer{Reason: "processor answered a malformed charge"}, true, nil
	}
	return reconcile.Answer{Verdict: reconcile.Applied, Result: saga.Done([]byte(ch.ID))}, true, nil
}

// Orders returns the runner of the order sagas, whose Resume a service
// calls periodically to take over orders a crash left, and whose Owns
// tells a reconcile.Worker which records to leave to it.
func (s *Service) Orders() *saga.Runner { return s.orders }
