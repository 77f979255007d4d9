package payments

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/httpidem"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/reconcile"
)

type orderFixture struct {
	t     *testing.T
	clock *fakeclock.Clock
	eng   *engine.Engine
	svc   *Service
	srv   *httptest.Server
	fault scriptedFault
}

func newOrders(t *testing.T) *orderFixture {
	f := &orderFixture{t: t, clock: fakeclock.New(time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC))}
	eng, err := engine.Open(t.TempDir(), &engine.Options{Clock: f.clock, NoBackgroundSweep: true})
	require.NoError(t, err)
	p := NewProvider(ProviderOptions{Rand: rand.New(rand.NewPCG(1, 2)), Fault: f.fault.get, Clock: f.clock})
	svc, err := New(Config{Store: eng, Processor: p, Clock: f.clock})
	require.NoError(t, err)
	f.eng, f.svc, f.srv = eng, svc, httptest.NewServer(svc.Handler())
	t.Cleanup(func() {
		f.srv.Close()
		eng.Close()
	})
	return f
}

func (f *orderFixture) do(method, path, key, body string) (int, http.Header, string) {
	req, err := http.NewRequest(method, f.srv.URL+path, strings.NewReader(body))
	require.NoError(f.t, err)
	req.Header.Set("Authorization", "Bearer acct_1")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := f.srv.Client().Do(req)
	require.NoError(f.t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// get reads an order through GET /v1/orders/{id}.
func (f *orderFixture) get(id string) Order {
	f.t.Helper()
	status, _, body := f.do("GET", "/v1/orders/"+id, "", "")
	require.Equal(f.t, http.StatusOK, status, body)
	return decodeOrder(f.t, body)
}

func decodeOrder(t *testing.T, body string) Order {
	t.Helper()
	return decode[Order](t, reply{body: []byte(body)})
}

const pen = `{"amount": 1200, "currency": "USD", "sku": "pen"}`

func TestOrderIsConfirmedOnce(t *testing.T) {
	f := newOrders(t)
	status, h, body := f.do("POST", "/v1/orders", "ord-1", pen)
	require.Equal(t, http.StatusCreated, status, body)
	o := decodeOrder(t, body)
	assert.Equal(t, "confirmed", o.Status)
	assert.NotEmpty(t, o.Charge)
	assert.Equal(t, "/v1/orders/"+o.ID, h.Get("Location"))

	status, _, again := f.do("POST", "/v1/orders", "ord-1", pen)
	assert.Equal(t, http.StatusCreated, status)
	assert.Equal(t, body, again)
	status, _, _ = f.do("POST", "/v1/orders", "ord-1", `{"amount": 9900, "currency": "USD", "sku": "pen"}`)
	assert.Equal(t, http.StatusUnprocessableEntity, status, "a key names one order")
	got := f.get(o.ID)
	assert.Equal(t, o, got)
	assert.Equal(t, 1, f.svc.cfg.Processor.(*Provider).Stats().Charges)
}

// TestOrderAuthorizationTimeoutIsVisibleThenReconciled: while the
// authorization's outcome is unknown the order reads "authorizing" and
// "reconciling"; once the reconciler has found the charge and the order
// is resumed, it is confirmed, charged once.
func TestOrderAuthorizationTimeoutIsVisibleThenReconciled(t *testing.T) {
	f := newOrders(t)
	f.fault.set(ErrProviderTimeout)
	status, _, body := f.do("POST", "/v1/orders", "ord-2", pen)
	f.fault.set(nil)
	require.Equal(t, http.StatusAccepted, status, body)
	o := decodeOrder(t, body)
	assert.Equal(t, "authorizing", o.Status)
	assert.True(t, o.Reconciling)
	got := f.get(o.ID)
	assert.Equal(t, "authorizing", got.Status)

	f.clock.Advance(time.Second) // the reconciler's grace: the call that timed out has ended
	w, err := reconcile.New(f.eng, f.svc, &reconcile.Options{Clock: f.clock, Grace: time.Second,
		Handles: func(rec idemkv.Record) bool { return !f.svc.Orders().Owns(rec) }})
	require.NoError(t, err)
	require.NoError(t, w.Pass(context.Background()))
	require.Equal(t, int64(1), w.Stats().Applied)
	got = f.get(o.ID)
	assert.Equal(t, "confirming", got.Status, "authorized; confirmed at the next resume")
	assert.False(t, got.Reconciling)

	f.clock.Advance(30 * time.Second)
	n, err := f.svc.Orders().Resume(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	got = f.get(o.ID)
	assert.Equal(t, "confirmed", got.Status)
	assert.Equal(t, 1, f.svc.cfg.Processor.(*Provider).Stats().Charges)
}

// cutAfterCharge is a processor whose first call charges and then ends
// with an error of no kind the contract names (a connection reset after
// the request went out), and whose later calls are refused.
type cutAfterCharge struct {
	Processor
	calls int
}

func (p *cutAfterCharge) Charge(ctx context.Context, req ChargeRequest) (Charge, error) {
	if p.calls++; p.calls > 1 {
		return Charge{}, ErrProviderUnavailable
	}
	if _, err := p.Processor.Charge(ctx, req); err != nil {
		return Charge{}, err
	}
	return Charge{}, errors.New("connection reset by peer")
}

// TestOrderAuthorizationEndingOddlyIsUnknown: an authorization that
// ends with an error the Processor contract does not name may have
// charged: the order waits for the reconciler, and is not failed (and its
// reservation released) by the refusals that follow.
func TestOrderAuthorizationEndingOddlyIsUnknown(t *testing.T) {
	clock := fakeclock.New(time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC))
	eng, err := engine.Open(t.TempDir(), &engine.Options{Clock: clock, NoBackgroundSweep: true})
	require.NoError(t, err)
	defer eng.Close()
	p := NewProvider(ProviderOptions{Rand: rand.New(rand.NewPCG(1, 2)), Clock: clock})
	svc, err := New(Config{Store: eng, Processor: &cutAfterCharge{Processor: p}, Clock: clock})
	require.NoError(t, err)
	srv := httptest.NewServer(svc.Handler())
	defer srv.Close()
	f := &orderFixture{t: t, clock: clock, eng: eng, svc: svc, srv: srv}
	status, _, body := f.do("POST", "/v1/orders", "ord-9", pen)
	require.Equal(t, http.StatusAccepted, status, body)
	o := decodeOrder(t, body)
	assert.Equal(t, "authorizing", o.Status)
	assert.True(t, o.Reconciling, "the reconciler asks the processor")
	assert.Equal(t, 1, p.Stats().Charges)
	row, err := eng.GetData(t.Context(), orderRowKey("acct_1", o.ID))
	require.NoError(t, err)
	assert.NotEqual(t, "released", string(row), "the reservation stands")
}

func TestDeclinedOrderReleasesItsReservation(t *testing.T) {
	f := newOrders(t)
	f.fault.set(ErrDeclined)
	status, _, body := f.do("POST", "/v1/orders", "ord-3", pen)
	require.Equal(t, http.StatusCreated, status, body)
	o := decodeOrder(t, body)
	assert.Equal(t, "declined", o.Status)
	row, err := f.eng.GetData(t.Context(), orderRowKey("acct_1", o.ID))
	require.NoError(t, err)
	assert.Equal(t, "released", string(row))
	assert.Zero(t, f.svc.cfg.Processor.(*Provider).Stats().Charges)
}

// The order's key is read as the middleware reads it: "o1", a Structured
// Field string, and o1, a bare token, are one key, one order, one charge.
func TestOrderKeyFormsNameOneKey(t *testing.T) {
	f := newOrders(t)
	status, _, quoted := f.do("POST", "/v1/orders", `"o1"`, pen)
	require.Equal(t, http.StatusCreated, status, quoted)
	status, _, bare := f.do("POST", "/v1/orders", "o1", pen)
	require.Equal(t, http.StatusCreated, status, bare)
	assert.Equal(t, quoted, bare)
	assert.Equal(t, 1, f.svc.cfg.Processor.(*Provider).Stats().Charges)
	for _, key := range []string{`"o1`, "o 1", `"o1";p=1`, "o1, o2"} {
		status, _, body := f.do("POST", "/v1/orders", key, pen)
		assert.Equal(t, http.StatusBadRequest, status, "%s: %s", key, body)
		assert.Contains(t, body, httpidem.ProblemInvalidKey)
	}
}

func TestOrderBadInput(t *testing.T) {
	f := newOrders(t)
	for _, tc := range []struct {
		key, body string
		status    int
	}{
		{"", pen, http.StatusBadRequest},
		{"k", `{`, http.StatusBadRequest},
		{"k", `{"amount": 1200, "currency": "USD", "sku": "pen", "x": 1}`, http.StatusBadRequest},
		{"k", `{"amount": 0, "currency": "USD", "sku": "pen"}`, http.StatusUnprocessableEntity},
		{"k", `{"amount": 1, "currency": "usd", "sku": "pen"}`, http.StatusUnprocessableEntity},
		{"k", `{"amount": 1, "currency": "USD", "sku": ""}`, http.StatusUnprocessableEntity},
		// Read as the fingerprint reads payments: one object, names exact,
		// no member twice (a proxy may read the first "amount").
		{"k", `{"amount": 1200, "currency": "USD", "sku": "pen"} trailing`, http.StatusBadRequest},
		{"k", `{"AMOUNT": 1200, "Currency": "USD", "SKU": "pen"}`, http.StatusBadRequest},
		{"k", `{"amount": 1200, "currency": "USD", "sku": "pen", "amount": 1}`, http.StatusBadRequest},
		{"k", `{"amount": "1200", "currency": "USD", "sku": "pen"}`, http.StatusBadRequest},
		{"k", `{"amount": 12.5, "currency": "USD", "sku": "pen"}`, http.StatusBadRequest},
		{"k", `[1]`, http.StatusBadRequest},
	} {
		status, h, body := f.do("POST", "/v1/orders", tc.key, tc.body)
		assert.Equal(t, tc.status, status, "%s %s: %s", tc.key, tc.body, body)
		assert.Equal(t, "application/problem+json", h.Get("Content-Type"))
	}
	status, _, _ := f.do("GET", "/v1/orders/ord_missing", "", "")
	assert.Equal(t, http.StatusNotFound, status)
	status, _, _ = f.do("GET", "/v1/orders/nope", "", "")
	assert.Equal(t, http.StatusNotFound, status)
	// Another account's order is not found.
	_, _, body := f.do("POST", "/v1/orders", "ord-4", pen)
	o := decodeOrder(t, body)
	req, _ := http.NewRequest("GET", f.srv.URL+"/v1/orders/"+o.ID, nil)
	req.Header.Set("Authorization", "Bearer acct_2")
	resp, err := f.srv.Client().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	assert.Equal(t, 1, f.svc.cfg.Processor.(*Provider).Stats().Charges)
	// A whole number written 1200.0 is 1200, as for payments.
	status, _, body = f.do("POST", "/v1/orders", "ord-5", `{"amount": 1200.0, "currency": "USD", "sku": "pen"}`)
	assert.Equal(t, http.StatusCreated, status, "%s", body)
	assert.Equal(t, int64(1200), decodeOrder(t, body).Amount)
}

// heldOnce holds the first call back on its way to the processor while
// the clock moves on by hold.
type heldOnce struct {
	Processor
	clock *fakeclock.Clock
	hold  time.Duration
	reqs  []ChargeRequest
	errs  []error
}

func (p *heldOnce) Charge(ctx context.Context, req ChargeRequest) (Charge, error) {
	p.reqs = append(p.reqs, req)
	if len(p.reqs) == 1 {
		p.clock.Advance(p.hold)
	}
	c, err := p.Processor.Charge(ctx, req)
	p.errs = append(p.errs, err)
	return c, err
}

// An order's authorization carries a deadline, as a payment's charge
// does: held back past it, it is refused, charging nothing, and the step
// tries again.
func TestOrderAuthorizationCarriesADeadline(t *testing.T) {
	start := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	clock := fakeclock.New(start)
	eng, err := engine.Open(t.TempDir(), &engine.Options{Clock: clock, NoBackgroundSweep: true})
	require.NoError(t, err)
	defer eng.Close()
	p := NewProvider(ProviderOptions{Rand: rand.New(rand.NewPCG(1, 2)), Clock: clock})
	held := &heldOnce{Processor: p, clock: clock, hold: 6 * time.Second}
	svc, err := New(Config{Store: eng, Processor: held, Clock: clock, CallTimeout: 5 * time.Second})
	require.NoError(t, err)
	srv := httptest.NewServer(svc.Handler())
	defer srv.Close()
	f := &orderFixture{t: t, clock: clock, eng: eng, svc: svc, srv: srv}
	status, _, body := f.do("POST", "/v1/orders", "ord-late", pen)
	require.Equal(t, http.StatusCreated, status, body)
	assert.Equal(t, "confirmed", decodeOrder(t, body).Status)
	require.Len(t, held.reqs, 2)
	assert.Equal(t, start.Add(5*time.Second), held.reqs[0].Deadline, "the call timeout, sooner than the lease's end")
	assert.ErrorIs(t, held.errs[0], ErrCallExpired)
	assert.NoError(t, held.errs[1])
	assert.Equal(t, 1, p.Stats().Charges)
}
