package processor

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
)

type fixture struct {
	t   *testing.T
	dir string
	e   *engine.Engine
	s   *Server
	srv *httptest.Server
}

func newFixture(t *testing.T, o Options) *fixture {
	f := &fixture{t: t, dir: t.TempDir()}
	f.start(o)
	t.Cleanup(func() {
		f.srv.Close()
		f.e.Close()
	})
	return f
}

func (f *fixture) start(o Options) {
	e, err := engine.Open(f.dir, &engine.Options{NoBackgroundSweep: true})
	require.NoError(f.t, err)
	o.Store = e
	s, err := New(o)
	require.NoError(f.t, err)
	f.e, f.s, f.srv = e, s, httptest.NewServer(s.Handler())
}

// restart stops the server and its store and starts them again, as a
// crash and restart of the processor would.
func (f *fixture) restart(o Options) {
	f.srv.Close()
	require.NoError(f.t, f.e.Close())
	f.start(o)
}

func (f *fixture) do(method, path, key, body string) (int, http.Header, string) {
	return f.doWith(method, path, key, body, nil)
}

// doWith sends a request with the extra headers h.
func (f *fixture) doWith(method, path, key, body string, h http.Header) (int, http.Header, string) {
	req, err := http.NewRequest(method, f.srv.URL+path, strings.NewReader(body))
	require.NoError(f.t, err)
	for k, v := range h {
		req.Header[k] = v
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := f.srv.Client().Do(req)
	require.NoError(f.t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

const charge = `{"amount":5000,"currency":"USD","description":"order 7"}`

// TestChargesAreDeduplicatedAndOutliveARestart: one charge per key,
// replayed to retries; another body under the key is refused; lookups and
// the listing find the charge, after a restart too.
func TestChargesAreDeduplicatedAndOutliveARestart(t *testing.T) {
	f := newFixture(t, Options{})
	status, _, first := f.do("POST", "/v1/charges", "k1", charge)
	require.Equal(t, http.StatusCreated, status, first)
	var c Charge
	require.NoError(t, json.Unmarshal([]byte(first), &c))
	assert.Equal(t, Charge{ID: c.ID, Key: "k1", Amount: 5000, Currency: "USD", Description: "order 7", Created: c.Created}, c)

	status, h, again := f.do("POST", "/v1/charges", "k1", charge)
	assert.Equal(t, http.StatusCreated, status)
	assert.Equal(t, "true", h.Get("Idempotent-Replayed"))
	assert.Equal(t, first, again)
	status, _, _ = f.do("POST", "/v1/charges", "k1", `{"amount":9000,"currency":"USD"}`)
	assert.Equal(t, http.StatusUnprocessableEntity, status, "a key is bound to its request")
	status, _, _ = f.do("POST", "/v1/charges", "", charge)
	assert.Equal(t, http.StatusBadRequest, status, "a charge needs a key")
	assert.Equal(t, Stats{Calls: 4, Charges: 1}, f.s.Stats())

	f.restart(Options{})
	status, _, got := f.do("GET", "/v1/charges/k1", "", "")
	assert.Equal(t, http.StatusOK, status)
	assert.JSONEq(t, first, got)
	status, _, _ = f.do("GET", "/v1/charges/k2", "", "")
	assert.Equal(t, http.StatusNotFound, status)
	status, _, list := f.do("GET", "/v1/charges", "", "")
	assert.Equal(t, http.StatusOK, status)
	var all struct{ Charges []Charge }
	require.NoError(t, json.Unmarshal([]byte(list), &all))
	require.Len(t, all.Charges, 1)
	assert.Equal(t, c.ID, all.Charges[0].ID)
	status, _, again = f.do("POST", "/v1/charges", "k1", charge)
	assert.Equal(t, http.StatusCreated, status)
	assert.Equal(t, first, again, "deduplicated across the restart")
}

// TestFaults: a refusal charges nothing; a timeout charges, commits, and
// answers 504 after the hold.
func TestFaults(t *testing.T) {
	var (
		mu    sync.Mutex
		fault error
	)
	setFault := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		fault = err
	}
	f := newFixture(t, Options{Hold: time.Millisecond, Fault: func(context.Context, string) error {
		mu.Lock()
		defer mu.Unlock()
		return fault
	}})
	setFault(ErrRefuse)
	status, h, _ := f.do("POST", "/v1/charges", "k1", charge)
	assert.Equal(t, http.StatusServiceUnavailable, status)
	assert.NotEmpty(t, h.Get("Retry-After"))
	status, _, _ = f.do("GET", "/v1/charges/k1", "", "")
	assert.Equal(t, http.StatusNotFound, status, "refused before charging")

	setFault(ErrTimeout)
	status, _, _ = f.do("POST", "/v1/charges", "k1", charge)
	assert.Equal(t, http.StatusGatewayTimeout, status)
	status, _, _ = f.do("GET", "/v1/charges/k1", "", "")
	assert.Equal(t, http.StatusOK, status, "charged before the answer was lost")
	setFault(nil)
	status, h, _ = f.do("POST", "/v1/charges", "k1", charge)
	assert.Equal(t, http.StatusCreated, status)
	assert.Equal(t, "true", h.Get("Idempotent-Replayed"), "the retry finds the charge the timeout made")
	setFault(ErrTimeout)
	status, _, _ = f.do("POST", "/v1/charges", "k1", charge)
	assert.Equal(t, http.StatusGatewayTimeout, status, "a replay's answer withheld")
	assert.Equal(t, Stats{Calls: 4, Refused: 1, Charges: 1, TimedOut: 1}, f.s.Stats(), "TimedOut counts charges made, not replays")
}

func TestBadOptionsAndInput(t *testing.T) {
	_, err := New(Options{})
	assert.Error(t, err)
	f := newFixture(t, Options{})
	_, err = New(Options{Store: f.e, FailRate: 0.7, TimeoutRate: 0.7})
	assert.Error(t, err)
	for _, body := range []string{`{`, `{"amount":-1,"currency":"USD"}`, `{"amount":1,"currency":"US"}`, `{"amount":1,"currency":"USD","x":1}`} {
		status, h, _ := f.do("POST", "/v1/charges", "bad-"+body, body)
		assert.Contains(t, []int{400, 422}, status, body)
		assert.Equal(t, "application/problem+json", h.Get("Content-Type"), body)
	}
	status, _, _ := f.do("GET", "/v1/charges/%01", "", "")
	assert.Equal(t, http.StatusBadRequest, status)
	assert.Zero(t, f.s.Stats().Charges)
}

// TestLookupWhileCharging: while a charge request under a key is being
// processed (its key claimed, its charge not yet committed), a lookup of
// the key answers 409, never "no charge".
func TestLookupWhileCharging(t *testing.T) {
	f := newFixture(t, Options{})
	id := idemkv.ID{Tenant: merchant, Endpoint: chargeEndpoint, Key: "k1"}
	c, err := f.e.Claim(context.Background(), idemkv.ClaimRequest{ID: id, Fingerprint: []byte{1}, Mode: idemkv.ModeLocal})
	require.NoError(t, err)
	status, _, _ := f.do("GET", "/v1/charges/k1", "", "")
	assert.Equal(t, http.StatusConflict, status, "a charge request holds the key")
	require.NoError(t, f.e.Release(context.Background(), c.Lease, nil))
	status, _, _ = f.do("GET", "/v1/charges/k1", "", "")
	assert.Equal(t, http.StatusNotFound, status)
}

// TestDeadlines: a charge request that arrives after the deadline its
// caller sent charges nothing and frees its key; one in time charges; a
// late retry of a key already charged gets the charge back; a deadline
// that does not parse is a 400.
func TestDeadlines(t *testing.T) {
	f := newFixture(t, Options{})
	deadline := func(d time.Duration) http.Header {
		return http.Header{HeaderDeadline: {f.e.Now().Add(d).Format(time.RFC3339Nano)}}
	}
	status, h, body := f.doWith("POST", "/v1/charges", "k1", charge, deadline(-time.Millisecond))
	assert.Equal(t, http.StatusServiceUnavailable, status, body)
	assert.Equal(t, "application/problem+json", h.Get("Content-Type"))
	assert.Contains(t, body, "#call-expired")
	status, _, _ = f.do("GET", "/v1/charges/k1", "", "")
	assert.Equal(t, http.StatusNotFound, status, "nothing charged, and the key is free")

	status, _, first := f.doWith("POST", "/v1/charges", "k1", charge, deadline(time.Minute))
	require.Equal(t, http.StatusCreated, status, first)
	status, h, again := f.doWith("POST", "/v1/charges", "k1", charge, deadline(-time.Minute))
	assert.Equal(t, http.StatusCreated, status, "a late call under a charged key gets the charge back")
	assert.Equal(t, "true", h.Get("Idempotent-Replayed"))
	assert.Equal(t, first, again)

	status, _, body = f.doWith("POST", "/v1/charges", "k2", charge, http.Header{HeaderDeadline: {"tomorrow"}})
	assert.Equal(t, http.StatusBadRequest, status, body)
	status, _, _ = f.do("GET", "/v1/charges/k2", "", "")
	assert.Equal(t, http.StatusNotFound, status)
	assert.Equal(t, Stats{Calls: 4, Expired: 1, Charges: 1}, f.s.Stats())
}

// TestLookupOfAChargeCommittingMeanwhile: a charge that commits while a
// lookup reads is found, never answered "no charge".
func TestLookupOfAChargeCommittingMeanwhile(t *testing.T) {
	f := newFixture(t, Options{})
	var once sync.Once
	f.s.betweenReads = func() {
		once.Do(func() {
			status, _, body := f.do("POST", "/v1/charges", "k1", charge)
			require.Equal(t, http.StatusCreated, status, body)
		})
	}
	status, _, body := f.do("GET", "/v1/charges/k1", "", "")
	assert.Contains(t, []int{http.StatusOK, http.StatusConflict}, status, "%s", body)
}
