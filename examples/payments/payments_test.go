package payments

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/httpidem"
	"github.com/idemkv/idemkv/internal/fakeclock"
)

type svcFixture struct {
	t   *testing.T
	eng *engine.Engine
	srv *httptest.Server
	p   *Provider
	svc *Service
}

// newService runs the service on a real engine behind loopback HTTP.
func newService(t *testing.T, po ProviderOptions) *svcFixture {
	return newServiceWait(t, po, 0)
}

func newServiceWait(t *testing.T, po ProviderOptions, wait time.Duration) *svcFixture {
	t.Helper()
	eng, err := engine.Open(t.TempDir(), &engine.Options{NoBackgroundSweep: true})
	require.NoError(t, err)
	clock := newTicking()
	po.Rand, po.Clock = rand.New(rand.NewPCG(1, 2)), clock.still()
	p := NewProvider(po)
	svc, err := New(Config{Store: eng, Processor: p, Wait: wait, Clock: clock})
	require.NoError(t, err)
	srv := httptest.NewServer(svc.Handler())
	t.Cleanup(func() {
		srv.Close()
		eng.Close()
	})
	return &svcFixture{t: t, eng: eng, srv: srv, p: p, svc: svc}
}

// ticking is a clock that moves one second at every reading, so that
// every payment has its own Created.
type ticking struct {
	mu  sync.Mutex
	now time.Time
}

func newTicking() *ticking { return &ticking{now: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)} }

func (c *ticking) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(time.Second)
	return c.now
}

// still is c read without moving it: the simulated processor's clock, in
// step with the service's, which compares a call's deadline with it.
func (c *ticking) still() idemkv.Clock { return stillTicking{c} }

type stillTicking struct{ c *ticking }

func (s stillTicking) Now() time.Time {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return s.c.now
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func (f *svcFixture) send(method, path, account, key, body string) reply {
	f.t.Helper()
	req, err := http.NewRequest(method, f.srv.URL+path, strings.NewReader(body))
	require.NoError(f.t, err)
	if account != "" {
		req.Header.Set("Authorization", "Bearer "+account)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := f.srv.Client().Do(req)
	require.NoError(f.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(f.t, err)
	return reply{resp.StatusCode, resp.Header, b}
}

func (f *svcFixture) pay(account, key, body string) reply {
	return f.send("POST", "/v1/payments", account, key, body)
}

func decode[T any](t *testing.T, r reply) T {
	t.Helper()
	var v T
	require.NoError(t, json.Unmarshal(r.body, &v), "body: %s", r.body)
	return v
}

func problemOf(t *testing.T, r reply, status int, kind string) httpidem.Problem {
	t.Helper()
	require.Equal(t, status, r.status, "body: %s", r.body)
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"))
	p := decode[httpidem.Problem](t, r)
	require.Equal(t, httpidem.ProblemBase+kind, p.Type)
	return p
}

const order = `{"amount": 5000, "currency": "USD", "card": "tok_123"}`

func TestPaymentRunsOnceAndReplays(t *testing.T) {
	f := newService(t, ProviderOptions{})
	first := f.pay("acct_1", "order-1", order)
	require.Equal(t, http.StatusCreated, first.status, "%s", first.body)
	p := decode[Payment](t, first)
	assert.Equal(t, int64(5000), p.Amount)
	assert.Equal(t, "USD", p.Currency)
	assert.Equal(t, "succeeded", p.Status)
	assert.Equal(t, "/v1/payments/"+p.ID, first.header.Get("Location"))

	// A retry, even formatted differently, replays the same payment.
	retry := f.pay("acct_1", "order-1", `{"card":"tok_123","currency":"USD","amount":5000}`)
	assert.Equal(t, http.StatusCreated, retry.status)
	assert.Equal(t, first.body, retry.body)
	assert.Equal(t, "true", retry.header.Get("Idempotent-Replayed"))
	assert.Equal(t, 1, f.p.Stats().Calls)

	second := decode[Payment](t, f.pay("acct_1", "order-2", order))
	got := decode[Payment](t, f.send("GET", "/v1/payments/"+p.ID, "acct_1", "", ""))
	assert.Equal(t, p, got)

	list := decode[struct {
		Data    []Payment `json:"data"`
		HasMore bool      `json:"has_more"`
	}](t, f.send("GET", "/v1/payments", "acct_1", "", ""))
	require.Len(t, list.Data, 2)
	assert.Equal(t, second.ID, list.Data[0].ID, "newest first")
	assert.Equal(t, p.ID, list.Data[1].ID)
	limited := decode[struct {
		Data    []Payment `json:"data"`
		HasMore bool      `json:"has_more"`
	}](t, f.send("GET", "/v1/payments?limit=1", "acct_1", "", ""))
	assert.Len(t, limited.Data, 1)
	assert.True(t, limited.HasMore)

	// Another account sees none of it, and its keys are its own.
	problemOf(t, f.send("GET", "/v1/payments/"+p.ID, "acct_2", "", ""), http.StatusNotFound, "not-found")
	assert.Contains(t, string(f.send("GET", "/v1/payments", "acct_2", "", "").body), `"data":[]`)
	other := f.pay("acct_2", "order-1", order)
	assert.Equal(t, http.StatusCreated, other.status)
	assert.Empty(t, other.header.Get("Idempotent-Replayed"))
}

func TestBadRequests(t *testing.T) {
	f := newService(t, ProviderOptions{})
	problemOf(t, f.pay("", "k", order), http.StatusUnauthorized, httpidem.ProblemUnauthenticated)
	problemOf(t, f.send("GET", "/v1/payments", "", "", ""), http.StatusUnauthorized, httpidem.ProblemUnauthenticated)
	problemOf(t, f.pay("acct_1", "", order), http.StatusBadRequest, httpidem.ProblemMissingKey)
	problemOf(t, f.pay("acct_1", "k1", `{"amount":`), http.StatusBadRequest, httpidem.ProblemInvalidBody)
	problemOf(t, f.pay("acct_1", "k1", `[1]`), http.StatusBadRequest, "invalid-payment")
	p := problemOf(t, f.pay("acct_1", "k2", `{}`), http.StatusUnprocessableEntity, "invalid-payment")
	assert.Contains(t, p.Detail, "amount is required")
	assert.Contains(t, p.Detail, "currency is required")
	assert.Contains(t, p.Detail, "card is required")
	p = problemOf(t, f.pay("acct_1", "k3", `{"amount":-5,"currency":"usd","card":"tok"}`), http.StatusUnprocessableEntity, "invalid-payment")
	assert.Contains(t, p.Detail, "amount must be positive")
	assert.Contains(t, p.Detail, "currency must be")
	problemOf(t, f.pay("acct_1", "k4", `{"amount":1.5,"currency":"USD","card":"tok"}`), http.StatusUnprocessableEntity, "invalid-payment")
	problemOf(t, f.send("GET", "/v1/payments?limit=0", "acct_1", "", ""), http.StatusBadRequest, "invalid-query")
	problemOf(t, f.send("DELETE", "/v1/payments", "acct_1", "", ""), http.StatusMethodNotAllowed, "method-not-allowed")
	// A validation error is not stored (it failed before anything
	// happened): the corrected request with the same key runs, instead
	// of getting key-mismatch.
	first := f.pay("acct_1", "k5", `{"amount":-5,"currency":"USD","card":"tok"}`)
	assert.Equal(t, http.StatusUnprocessableEntity, first.status)
	assert.Zero(t, f.p.Stats().Calls, "no bad request reached the card processor")
	fixed := f.pay("acct_1", "k5", `{"amount":5,"currency":"USD","card":"tok"}`)
	assert.Equal(t, http.StatusCreated, fixed.status, "%s", fixed.body)
	assert.Empty(t, fixed.header.Get("Idempotent-Replayed"))
	assert.Equal(t, 1, f.p.Stats().Calls)
}

func TestReusedKeyNamesTheChangedFields(t *testing.T) {
	f := newService(t, ProviderOptions{})
	f.pay("acct_1", "order-1", order)
	p := problemOf(t, f.pay("acct_1", "order-1", `{"amount": 6000, "currency": "USD", "card": "tok_123"}`),
		http.StatusUnprocessableEntity, httpidem.ProblemKeyMismatch)
	assert.Equal(t, []string{"body /amount"}, p.Fields)
	assert.Equal(t, 1, f.p.Stats().Calls)
}

func TestTimeoutStaysUncertainAndNeverChargesTwice(t *testing.T) {
	f := newService(t, ProviderOptions{TimeoutRate: 1})
	problemOf(t, f.pay("acct_1", "order-1", order), http.StatusGatewayTimeout, "payment-outcome-unknown")
	for range 3 {
		r := f.pay("acct_1", "order-1", order)
		problemOf(t, r, http.StatusConflict, httpidem.ProblemReconciling)
		assert.NotEmpty(t, r.header.Get("Retry-After"))
	}
	assert.Equal(t, ProviderStats{Calls: 1, Charges: 1}, f.p.Stats())
	rec, err := f.eng.Get(context.Background(), idemkv.ID{Tenant: "acct_1", Endpoint: "POST /v1/payments", Key: "order-1"})
	require.NoError(t, err)
	assert.Equal(t, idemkv.StateUncertain, rec.State)
	ch, ok, _ := f.p.Lookup(context.Background(), rec.OperationID.StepKey("charge"))
	assert.True(t, ok, "the processor was sent the record's OperationID as its key")
	assert.Equal(t, int64(5000), ch.Amount)
}

func TestProcessorUnavailableReleasesTheKey(t *testing.T) {
	f := newService(t, ProviderOptions{FailRate: 1})
	r := f.pay("acct_1", "order-1", order)
	problemOf(t, r, http.StatusServiceUnavailable, "provider-unavailable")
	_, err := f.eng.Get(context.Background(), idemkv.ID{Tenant: "acct_1", Endpoint: "POST /v1/payments", Key: "order-1"})
	assert.ErrorIs(t, err, idemkv.ErrNotFound, "nothing was charged, so a retry may run anew")
	assert.Zero(t, f.p.Stats().Charges)
}

func TestHealthAndMetrics(t *testing.T) {
	f := newService(t, ProviderOptions{})
	h := f.send("GET", "/healthz", "", "", "")
	assert.Equal(t, http.StatusOK, h.status)
	f.pay("acct_1", "order-1", order)
	f.pay("acct_1", "order-1", order)
	f.pay("acct_1", "order-1", `{"amount":1,"currency":"USD","card":"x"}`)
	m := string(f.send("GET", "/metrics", "", "", "").body)
	for _, want := range []string{
		`idemkv_http_requests_total{disposition="stored",endpoint="POST /v1/payments"} 1`,
		`idemkv_http_requests_total{disposition="replayed",endpoint="POST /v1/payments"} 1`,
		`idemkv_http_requests_total{disposition="mismatch",endpoint="POST /v1/payments"} 1`,
		`idemkv_payments_created_total 1`,
		`idemkv_provider_calls_total{result="charged"} 1`,
		`idemkv_http_request_duration_seconds_count{disposition="stored"} 1`,
		`idemkv_engine_claims_total 3`,
		`idemkv_engine_commit_writes_total `,
		`idemkv_engine_commit_seconds_total `,
		`idemkv_engine_claim_filter_skips_total `, // 0 or 1: the filter's first build races the first claim
		`idemkv_engine_l0_files `,
		`idemkv_engine_compaction_debt_bytes `,
	} {
		assert.Contains(t, m, want)
	}
	require.NoError(t, f.eng.Close())
	problemOf(t, f.send("GET", "/healthz", "", "", ""), http.StatusServiceUnavailable, httpidem.ProblemStoreUnavailable)
	problemOf(t, f.pay("acct_1", "order-9", order), http.StatusServiceUnavailable, httpidem.ProblemStoreUnavailable)
	assert.Contains(t, string(f.send("GET", "/metrics", "", "", "").body), `idemkv_http_store_errors_total 1`)
}

// A payment charged but whose outcome cannot commit (the store closed
// under it) is not counted as created: the counter follows the commit.
func TestCreatedCountsCommittedPaymentsOnly(t *testing.T) {
	var eng *engine.Engine
	f := newService(t, ProviderOptions{Fault: func(context.Context, string) error { return eng.Close() }})
	eng = f.eng
	r := f.pay("acct_1", "order-1", order)
	require.GreaterOrEqual(t, r.status, 500, "%s", r.body)
	m := string(f.send("GET", "/metrics", "", "", "").body)
	assert.Contains(t, m, `idemkv_provider_calls_total{result="charged"} 1`)
	assert.Contains(t, m, "idemkv_payments_created_total 0")
}

// TestConcurrentDuplicatesCreateOnePayment sends 50 requests with one key
// at once, with and without waiting: exactly one payment is created and
// charged, and every answer is that payment (or a 409 to retry).
func TestConcurrentDuplicatesCreateOnePayment(t *testing.T) {
	for _, wait := range []time.Duration{0, time.Minute} {
		t.Run(fmt.Sprintf("wait=%v", wait), func(t *testing.T) {
			f := newServiceWait(t, ProviderOptions{Latency: time.Millisecond}, wait)
			replies := make([]reply, 50)
			var wg sync.WaitGroup
			for i := range replies {
				wg.Go(func() { replies[i] = f.pay("acct_1", "order-1", order) })
			}
			wg.Wait()
			var created []byte
			conflicts := 0
			for _, r := range replies {
				switch r.status {
				case http.StatusCreated:
					if created == nil {
						created = r.body
					}
					assert.Equal(t, created, r.body, "every 201 is the same payment")
				case http.StatusConflict:
					conflicts++
				default:
					t.Fatalf("unexpected %d: %s", r.status, r.body)
				}
			}
			if wait > 0 {
				assert.Zero(t, conflicts, "waiting duplicates get the outcome")
			}
			list := decode[struct {
				Data []Payment `json:"data"`
			}](t, f.send("GET", "/v1/payments", "acct_1", "", ""))
			assert.Len(t, list.Data, 1)
			assert.Equal(t, 1, f.p.Stats().Charges)
			assert.Equal(t, 1, f.p.Stats().Calls)
		})
	}
}

// TestFailingDiskAnswers503: when a sync of the store's log fails, which
// Pebble would answer by stopping the process, the service stays up and
// answers 503 problems (payments, reads and /healthz alike), and no card
// is charged for a payment whose claim could not be made durable.
func TestFailingDiskAnswers503(t *testing.T) {
	var armed atomic.Bool
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if armed.Load() && strings.HasSuffix(op.Path, ".log") &&
			(op.Kind == errorfs.OpFileSync || op.Kind == errorfs.OpFileSyncData || op.Kind == errorfs.OpFileSyncTo) {
			return errorfs.ErrInjected
		}
		return nil
	})
	eng, err := engine.Open(t.TempDir(), &engine.Options{FS: errorfs.Wrap(vfs.Default, inj), NoBackgroundSweep: true})
	require.NoError(t, err)
	p := NewProvider(ProviderOptions{Rand: rand.New(rand.NewPCG(1, 2))})
	svc, err := New(Config{Store: eng, Processor: p})
	require.NoError(t, err)
	srv := httptest.NewServer(svc.Handler())
	defer srv.Close()
	f := &svcFixture{t: t, eng: eng, srv: srv, p: p}

	ok := f.pay("acct_1", "k-before", order)
	require.Equal(t, http.StatusCreated, ok.status, "body: %s", ok.body)
	paid := decode[map[string]any](t, ok)

	armed.Store(true)
	pr := problemOf(t, f.pay("acct_1", "k-during", order), http.StatusServiceUnavailable, httpidem.ProblemStoreUnavailable)
	require.NotEmpty(t, pr.Detail)
	require.Equal(t, 1, p.Stats().Charges, "the failed claim must not reach the processor")
	armed.Store(false) // the disk is back, but this process stays failed
	problemOf(t, f.pay("acct_1", "k-during", order), http.StatusServiceUnavailable, httpidem.ProblemStoreUnavailable)
	problemOf(t, f.send("GET", "/v1/payments/"+paid["id"].(string), "acct_1", "", ""), http.StatusServiceUnavailable, httpidem.ProblemStoreUnavailable)
	require.Equal(t, http.StatusServiceUnavailable, f.send("GET", "/healthz", "", "", "").status)
	require.Equal(t, 1, p.Stats().Charges)
	require.ErrorIs(t, eng.Close(), idemkv.ErrFailed)
}

// TestListPages: the listing pages newest first with starting_after,
// every payment exactly once, and refuses a cursor that names no payment
// of the caller's.
func TestListPages(t *testing.T) {
	f := newService(t, ProviderOptions{})
	var made []string
	for i := range 5 {
		r := f.pay("acct_1", fmt.Sprintf("k%d", i), order)
		require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
		made = append(made, decode[Payment](t, r).ID)
	}
	other := decode[Payment](t, f.pay("acct_2", "k0", order)).ID

	type page struct {
		Data    []Payment `json:"data"`
		HasMore bool      `json:"has_more"`
	}
	var seen []string
	after := ""
	for range 10 {
		path := "/v1/payments?limit=2"
		if after != "" {
			path += "&starting_after=" + after
		}
		r := f.send("GET", path, "acct_1", "", "")
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		p := decode[page](t, r)
		for _, x := range p.Data {
			seen = append(seen, x.ID)
		}
		if !p.HasMore {
			break
		}
		after = p.Data[len(p.Data)-1].ID
	}
	want := slices.Clone(made)
	slices.Reverse(want) // newest first
	require.Equal(t, want, seen)

	for _, cursor := range []string{"pay_nope", other} {
		problemOf(t, f.send("GET", "/v1/payments?starting_after="+cursor, "acct_1", "", ""), http.StatusBadRequest, "invalid-query")
	}
}

// A method a path has no route for answers 405 with the methods it has;
// a path with no route answers 404.
func TestWrongMethodIs405(t *testing.T) {
	f := newService(t, ProviderOptions{})
	for _, tc := range []struct{ method, path, allow string }{
		{"PUT", "/v1/payments", "GET, HEAD, POST"},
		{"DELETE", "/v1/payments", "GET, HEAD, POST"},
		{"PATCH", "/v1/payments/pay_1", "GET, HEAD"},
		{"POST", "/healthz", "GET, HEAD"},
	} {
		r := f.send(tc.method, tc.path, "acct_1", "k1", order)
		p := problemOf(t, r, http.StatusMethodNotAllowed, "method-not-allowed")
		require.Equal(t, tc.allow, r.header.Get("Allow"), "%s %s", tc.method, tc.path)
		require.Contains(t, p.Detail, tc.allow)
	}
	problemOf(t, f.send("GET", "/v1/nope", "acct_1", "", ""), http.StatusNotFound, "not-found")
	problemOf(t, f.send("PUT", "/v1/nope", "acct_1", "", ""), http.StatusNotFound, "not-found")
	require.Empty(t, decode[struct{ Data []any }](t, f.send("GET", "/v1/payments", "acct_1", "", "")).Data,
		"the refused requests created nothing")
}

// The handler acts on what the fingerprint binds: numbers a double cannot
// tell apart are refused before anything runs; 5000.0 and 5000 are the
// same payment; member names match exactly and values keep their JSON
// type, so a case variant or a string amount is a problem, never a charge.
func TestBodyMeansWhatTheFingerprintSays(t *testing.T) {
	f := newService(t, ProviderOptions{})
	for i, amount := range []string{"9007199254740993", "1000000000000000001", "5000.0000000000001"} {
		r := f.pay("acct_1", fmt.Sprintf("exact-%d", i), `{"amount":`+amount+`,"currency":"USD","card":"tok"}`)
		p := problemOf(t, r, http.StatusBadRequest, httpidem.ProblemInvalidBody)
		require.Contains(t, p.Detail, "not exact", amount)
	}

	first := f.pay("acct_1", "decimal", `{"amount":5000.0,"currency":"USD","card":"tok"}`)
	require.Equal(t, http.StatusCreated, first.status, "%s", first.body)
	again := f.pay("acct_1", "decimal", `{"amount":5000,"currency":"USD","card":"tok"}`)
	require.Equal(t, http.StatusCreated, again.status)
	require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	require.Equal(t, decode[Payment](t, first).ID, decode[Payment](t, again).ID)
	require.EqualValues(t, 5000, decode[Payment](t, again).Amount)

	n := 0
	for body, want := range map[string]string{
		`{"amount":5000,"currency":"USD","card":"tok","AMOUNT":1}`: `unknown member "AMOUNT"`,
		`{"Amount":5000,"currency":"USD","card":"tok"}`:            `unknown member "Amount"`,
		`{"amount":"5000","currency":"USD","card":"tok"}`:          "amount must be a JSON number",
		`{"amount":5000,"currency":840,"card":"tok"}`:              "currency must be a JSON string",
		`{"amount":1.5,"currency":"USD","card":"tok"}`:             "whole number",
	} {
		n++
		p := problemOf(t, f.pay("acct_1", fmt.Sprintf("strict-%d", n), body), http.StatusUnprocessableEntity, "invalid-payment")
		require.Contains(t, p.Detail, want, body)
		require.NotContains(t, p.Detail, "Go ", "no Go type names")
	}
	p := problemOf(t, f.pay("acct_1", "array", `[5000]`), http.StatusBadRequest, "invalid-payment")
	require.NotContains(t, p.Detail, "Go ")
	list := decode[struct{ Data []Payment }](t, f.send("GET", "/v1/payments", "acct_1", "", ""))
	require.Len(t, list.Data, 1, "only the 5000 payment was made")
}

// TestBackgroundErrorAnswers503UntilItClears: a flush that cannot create
// its sstable (an error injected through the filesystem, as a full disk or
// no file descriptors gives) makes /healthz answer 503 with the reason and
// new payments 503 at once, while replays go on; once a flush succeeds,
// both answer as before, without a restart.
func TestBackgroundErrorAnswers503UntilItClears(t *testing.T) {
	var armed atomic.Bool
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if armed.Load() && op.Kind == errorfs.OpCreate && strings.HasSuffix(op.Path, ".sst") {
			return errorfs.ErrInjected
		}
		return nil
	})
	logs := &healthSignals{unhealthy: make(chan struct{}, 1), healthy: make(chan struct{}, 1)}
	eng, err := engine.Open(t.TempDir(), &engine.Options{FS: errorfs.Wrap(vfs.Default, inj), NoBackgroundSweep: true, Logger: logs})
	require.NoError(t, err)
	svc, err := New(Config{Store: eng})
	require.NoError(t, err)
	srv := httptest.NewServer(svc.Handler())
	defer srv.Close()
	defer eng.Close()
	defer armed.Store(false) // first, so that a failing test's flush ends
	f := &svcFixture{t: t, eng: eng, srv: srv}
	order := `{"amount":5000,"currency":"USD","card":"tok_123"}`
	require.Equal(t, http.StatusCreated, f.pay("acct_1", "k-before", order).status)

	armed.Store(true)
	flushed := make(chan error, 1)
	go func() { flushed <- eng.Flush() }() // Pebble retries the flush until it succeeds
	<-logs.unhealthy
	h := f.send("GET", "/healthz", "", "", "")
	require.Equal(t, http.StatusServiceUnavailable, h.status)
	require.Contains(t, string(h.body), "injected", "the reason")
	problemOf(t, f.pay("acct_1", "k-during", order), http.StatusServiceUnavailable, httpidem.ProblemStoreUnavailable)
	replay := f.pay("acct_1", "k-before", order)
	require.Equal(t, http.StatusCreated, replay.status, "replays go on")
	require.Equal(t, "true", replay.header.Get("Idempotent-Replayed"))

	armed.Store(false)
	require.NoError(t, <-flushed)
	<-logs.healthy
	require.Equal(t, http.StatusOK, f.send("GET", "/healthz", "", "", "").status)
	require.Equal(t, http.StatusCreated, f.pay("acct_1", "k-during", order).status)
}

// healthSignals is an engine Logger that signals the engine's health
// messages (once each) and drops the rest.
type healthSignals struct{ unhealthy, healthy chan struct{} }

func (l *healthSignals) Infof(string, ...any) {}
func (l *healthSignals) Errorf(format string, _ ...any) {
	c := l.healthy
	switch {
	case strings.HasPrefix(format, "idemkv: store unhealthy"):
		c = l.unhealthy
	case !strings.HasPrefix(format, "idemkv: store healthy again"):
		return
	}
	select {
	case c <- struct{}{}:
	default:
	}
}
func (l *healthSignals) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }

// The charge's downstream key and the payment's id both derive from the
// record's operation id, which every attempt and takeover resumes.
func TestIDsDeriveFromTheOperation(t *testing.T) {
	f := newService(t, ProviderOptions{})
	p := decode[Payment](t, f.pay("acct_1", "order-1", order))
	rec, err := f.eng.Get(context.Background(), idemkv.ID{Tenant: "acct_1", Endpoint: "POST /v1/payments", Key: "order-1"})
	require.NoError(t, err)
	require.Equal(t, "pay_"+rec.OperationID.StepKey("payment")[:24], p.ID)
	ch, ok, _ := f.p.Lookup(context.Background(), rec.OperationID.StepKey("charge"))
	require.True(t, ok)
	require.Equal(t, ch.ID, p.Charge)
}

// failingReads is a store whose data reads fail while fail is set.
type failingReads struct {
	*engine.Engine
	fail atomic.Bool
}

func (s *failingReads) GetData(ctx context.Context, k []byte) ([]byte, error) {
	if s.fail.Load() {
		return nil, fmt.Errorf("read tcp: connection reset by peer")
	}
	return s.Engine.GetData(ctx, k)
}

// TestReplayDuringAStoreFailureIsRetried: a replay whose payment cannot
// be read for a store failure is answered 503, not as a replay (a 201
// with no payment would be the client's final answer), and the retry
// once the store is back replays the payment.
func TestReplayDuringAStoreFailureIsRetried(t *testing.T) {
	eng, err := engine.Open(t.TempDir(), &engine.Options{NoBackgroundSweep: true})
	require.NoError(t, err)
	st := &failingReads{Engine: eng}
	clock := newTicking()
	svc, err := New(Config{Store: st, Processor: NewProvider(ProviderOptions{Clock: clock.still()}), Clock: clock})
	require.NoError(t, err)
	srv := httptest.NewServer(svc.Handler())
	t.Cleanup(func() {
		srv.Close()
		eng.Close()
	})
	f := &svcFixture{t: t, eng: eng, srv: srv, svc: svc}
	first := f.pay("acct_1", "order-1", order)
	require.Equal(t, http.StatusCreated, first.status, "%s", first.body)

	st.fail.Store(true)
	during := f.pay("acct_1", "order-1", order)
	problemOf(t, during, http.StatusServiceUnavailable, httpidem.ProblemStoreUnavailable)
	require.Empty(t, during.header.Get("Idempotent-Replayed"))
	require.NotEmpty(t, during.header.Get("Retry-After"))

	st.fail.Store(false)
	after := f.pay("acct_1", "order-1", order)
	require.Equal(t, http.StatusCreated, after.status)
	require.Equal(t, "true", after.header.Get("Idempotent-Replayed"))
	require.Equal(t, first.body, after.body)
}

// The default processor tells the service's time, which the calls'
// deadlines are in: on a store whose clock is not the system's (a test's,
// or an engine that has not followed a step of the wall clock yet), it
// charges rather than refuse every call as late.
func TestDefaultProcessorKeepsTheServicesTime(t *testing.T) {
	clock := fakeclock.New(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)) // long before any system clock this runs on
	eng, err := engine.Open(t.TempDir(), &engine.Options{Clock: clock, NoBackgroundSweep: true})
	require.NoError(t, err)
	defer eng.Close()
	svc, err := New(Config{Store: eng})
	require.NoError(t, err)
	srv := httptest.NewServer(svc.Handler())
	defer srv.Close()
	f := &svcFixture{t: t, eng: eng, srv: srv, svc: svc}
	r := f.pay("acct_1", "k1", order)
	assert.Equal(t, http.StatusCreated, r.status, "%s", r.body)
}
