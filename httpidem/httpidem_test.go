package httpidem_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/fingerprint"
	"github.com/idemkv/idemkv/httpidem"
	"github.com/idemkv/idemkv/ttl"
)

// fixture is a real engine on disk behind a real loopback HTTP server.
type fixture struct {
	t       *testing.T
	eng     *engine.Engine
	clock   *timerClock
	srv     *httptest.Server
	reports chan httpidem.Report
}

const route = "/v1/things"

// newFixture serves h, protected by route rt, at POST (and GET) /v1/things.
func newFixture(t *testing.T, rt httpidem.Route, h http.HandlerFunc) *fixture {
	t.Helper()
	return newFixtureWith(t, rt, h, nil)
}

// newFixtureWith is newFixture with the engine options adjusted by opt.
func newFixtureWith(t *testing.T, rt httpidem.Route, h http.HandlerFunc, opt func(*engine.Options)) *fixture {
	t.Helper()
	return buildFixture(t, rt, h, opt, nil)
}

// buildFixture is newFixture with the engine's options adjusted by eo and
// the middleware's by mo (either may be nil).
func buildFixture(t *testing.T, rt httpidem.Route, h http.HandlerFunc, eo func(*engine.Options), mo func(*httpidem.Options)) *fixture {
	t.Helper()
	f := &fixture{t: t, clock: newTimerClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)), reports: make(chan httpidem.Report, 100)}
	eopts := &engine.Options{
		Clock: f.clock, NoBackgroundSweep: true,
		RetentionClasses: ttl.Classes{"money": 30 * 24 * time.Hour},
	}
	if eo != nil {
		eo(eopts)
	}
	eng, err := engine.Open(t.TempDir(), eopts)
	require.NoError(t, err)
	f.eng = eng
	mopts := &httpidem.Options{
		Store:  eng,
		Tenant: bearer,
		Clock:  f.clock, // heartbeats beat only when a test advances it
		Observer: httpidem.ObserverFunc(func(r httpidem.Report) {
			select {
			case f.reports <- r:
			default: // a test that does not read reports must not block requests
			}
		}),
	}
	if mo != nil {
		mo(mopts)
	}
	m, err := httpidem.New(mopts)
	require.NoError(t, err)
	wrapped, err := m.Wrap(h, rt)
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle(route, wrapped)
	mux.Handle(route+"/{id}", wrapped)
	f.srv = httptest.NewServer(mux)
	t.Cleanup(func() {
		f.srv.Close()
		eng.Close()
	})
	return f
}

func bearer(r *http.Request) (string, error) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || tok == "" {
		return "", errors.New("no bearer token")
	}
	return tok, nil
}

type response struct {
	status int
	header http.Header
	body   []byte
}

// do sends a request with the given Idempotency-Key values (none if nil)
// as tenant "acct_1".
func (f *fixture) do(method, path, body string, keys ...string) response {
	return f.doAs("acct_1", method, path, body, keys...)
}

func (f *fixture) doAs(tenant, method, path, body string, keys ...string) response {
	f.t.Helper()
	req, err := http.NewRequest(method, f.srv.URL+path, strings.NewReader(body))
	require.NoError(f.t, err)
	if tenant != "" {
		req.Header.Set("Authorization", "Bearer "+tenant)
	}
	for _, k := range keys {
		req.Header.Add(httpidem.HeaderKey, k)
	}
	resp, err := f.srv.Client().Do(req)
	require.NoError(f.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(f.t, err)
	return response{resp.StatusCode, resp.Header, b}
}

// report returns the next report the middleware made.
func (f *fixture) report() httpidem.Report {
	f.t.Helper()
	select {
	case r := <-f.reports:
		return r
	case <-time.After(10 * time.Second):
		f.t.Fatal("no report from the middleware")
		return httpidem.Report{}
	}
}

// problem decodes a problem+json response and checks its type and status.
func problem(t *testing.T, r response, status int, kind string) httpidem.Problem {
	t.Helper()
	require.Equal(t, status, r.status, "body: %s", r.body)
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"))
	var p httpidem.Problem
	require.NoError(t, json.Unmarshal(r.body, &p))
	require.Equal(t, httpidem.ProblemBase+kind, p.Type)
	require.Equal(t, status, p.Status)
	require.NotEmpty(t, p.Title)
	return p
}

// counting returns a handler answering 201 with a JSON body naming the
// call, and the counter of its calls.
func counting() (http.HandlerFunc, *atomic.Int64) {
	var n atomic.Int64
	return func(w http.ResponseWriter, r *http.Request) {
		i := n.Add(1)
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/v1/things/t_%d", i))
		w.Header().Set("X-Attempt-Trace", fmt.Sprint(i))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"t_%d","echo":%q}`, i, body)
	}, &n
}

func TestFirstRunThenByteIdenticalReplay(t *testing.T) {
	h, calls := counting()
	f := newFixture(t, httpidem.Route{}, h)

	first := f.do("POST", route, `{"amount":5}`, "k1")
	require.Equal(t, http.StatusCreated, first.status)
	assert.Empty(t, first.header.Get(httpidem.HeaderReplayed))
	assert.Equal(t, "86400", first.header.Get(httpidem.HeaderRetention))
	assert.Equal(t, httpidem.Stored, f.report().Disposition)

	again := f.do("POST", route, `{"amount":5}`, "k1")
	require.Equal(t, http.StatusCreated, again.status)
	assert.Equal(t, first.body, again.body, "replayed body is byte-identical")
	assert.Equal(t, "true", again.header.Get(httpidem.HeaderReplayed))
	assert.Equal(t, first.header.Get("Content-Type"), again.header.Get("Content-Type"))
	assert.Equal(t, "/v1/things/t_1", again.header.Get("Location"))
	assert.Empty(t, again.header.Get("X-Attempt-Trace"), "undeclared headers are not replayed")
	assert.Empty(t, again.header.Get(httpidem.HeaderRetention))
	assert.Equal(t, httpidem.Replayed, f.report().Disposition)
	assert.EqualValues(t, 1, calls.Load())

	// A differently formatted but equal JSON body is the same request.
	same := f.do("POST", route, "{ \"amount\" : 5.0 }", "k1")
	assert.Equal(t, first.body, same.body)
	assert.EqualValues(t, 1, calls.Load())
}

func TestKeyForms(t *testing.T) {
	h, calls := counting()
	f := newFixture(t, httpidem.Route{}, h)

	// The draft's Structured Field string and a bare token name one key.
	first := f.do("POST", route, `{}`, `"8e03978e-40d5-43e8-bc93-6894a57f9324"`)
	require.Equal(t, http.StatusCreated, first.status)
	bare := f.do("POST", route, `{}`, `8e03978e-40d5-43e8-bc93-6894a57f9324`)
	assert.Equal(t, "true", bare.header.Get(httpidem.HeaderReplayed))
	escaped := f.do("POST", route, `{}`, `"a\"b\\c"`)
	require.Equal(t, http.StatusCreated, escaped.status)
	assert.EqualValues(t, 2, calls.Load())
}

func TestBadKeysAreRejectedAndStoreNothing(t *testing.T) {
	h, calls := counting()
	f := newFixture(t, httpidem.Route{}, h)
	long := strings.Repeat("k", 256)
	for name, keys := range map[string][]string{
		"two fields":        {"a", "b"},
		"empty string":      {`""`},
		"empty":             {""},
		"256 bytes":         {long},
		"256 bytes quoted":  {`"` + long + `"`},
		"list":              {"a, b"},
		"sf list":           {`"a", "b"`},
		"parameters":        {`"a";p=1`},
		"unterminated":      {`"abc`},
		"bad escape":        {`"a\nb"`},
		"space in bare key": {"a b"},
		"non-ascii":         {"clé"},
	} {
		t.Run(name, func(t *testing.T) {
			r := f.do("POST", route, `{}`, keys...)
			problem(t, r, http.StatusBadRequest, httpidem.ProblemInvalidKey)
			assert.Equal(t, httpidem.Rejected, f.report().Disposition)
		})
	}
	assert.Zero(t, calls.Load())
	// 255 bytes is the limit, inclusive.
	r := f.do("POST", route, `{}`, long[:255])
	assert.Equal(t, http.StatusCreated, r.status)
}

func TestRequiredAndOptionalKeys(t *testing.T) {
	var sawOp atomic.Bool
	h := func(w http.ResponseWriter, r *http.Request) {
		sawOp.Store(httpidem.FromContext(r.Context()) != nil)
		w.WriteHeader(http.StatusCreated)
	}
	t.Run("required", func(t *testing.T) {
		f := newFixture(t, httpidem.Route{Require: true}, h)
		problem(t, f.do("POST", route, `{}`), http.StatusBadRequest, httpidem.ProblemMissingKey)
	})
	t.Run("optional", func(t *testing.T) {
		f := newFixture(t, httpidem.Route{}, h)
		sawOp.Store(true)
		assert.Equal(t, http.StatusCreated, f.do("POST", route, `{}`).status)
		assert.False(t, sawOp.Load(), "a request without a key runs unprotected")
		assert.Equal(t, httpidem.Unprotected, f.report().Disposition)
		assert.Equal(t, http.StatusCreated, f.do("POST", route, `{}`, "k").status)
		assert.True(t, sawOp.Load())
	})
	t.Run("reads pass through", func(t *testing.T) {
		f := newFixture(t, httpidem.Route{Require: true}, h)
		sawOp.Store(true)
		assert.Equal(t, http.StatusCreated, f.do("GET", route, "", "not checked, \"").status)
		assert.False(t, sawOp.Load())
		select {
		case r := <-f.reports:
			t.Fatalf("a passed-through request was reported: %+v", r)
		default:
		}
	})
}

func TestUnauthenticatedNeverReachesStore(t *testing.T) {
	h, calls := counting()
	f := newFixture(t, httpidem.Route{}, h)
	problem(t, f.doAs("", "POST", route, `{}`, "k"), http.StatusUnauthorized, httpidem.ProblemUnauthenticated)
	assert.Zero(t, calls.Load())
	_, err := f.eng.Get(context.Background(), idemkv.ID{Tenant: "acct_1", Endpoint: "POST " + route, Key: "k"})
	assert.ErrorIs(t, err, idemkv.ErrNotFound)
}

func TestKeysAreScopedByTenantAndEndpoint(t *testing.T) {
	h, calls := counting()
	f := newFixture(t, httpidem.Route{Methods: []string{"POST", "PATCH"}}, h)
	a := f.doAs("acct_1", "POST", route, `{}`, "k")
	b := f.doAs("acct_2", "POST", route, `{}`, "k")
	c := f.doAs("acct_1", "PATCH", route, `{}`, "k")
	d := f.doAs("acct_1", "POST", route+"/x", `{}`, "k")
	for _, r := range []response{a, b, c, d} {
		assert.Equal(t, http.StatusCreated, r.status)
		assert.Empty(t, r.header.Get(httpidem.HeaderReplayed))
	}
	assert.EqualValues(t, 4, calls.Load())
}

func TestMismatch(t *testing.T) {
	h, calls := counting()
	t.Run("plain", func(t *testing.T) {
		f := newFixture(t, httpidem.Route{}, h)
		f.do("POST", route, `{"amount":5}`, "k")
		p := problem(t, f.do("POST", route, `{"amount":6}`, "k"), http.StatusUnprocessableEntity, httpidem.ProblemKeyMismatch)
		assert.Empty(t, p.Fields)
		assert.Equal(t, httpidem.Stored, f.report().Disposition)
		assert.Equal(t, httpidem.Mismatch, f.report().Disposition)
	})
	t.Run("path parameters are bound", func(t *testing.T) {
		f := newFixture(t, httpidem.Route{Pattern: route + "/{id}"}, h)
		f.do("POST", route+"/a", `{}`, "k")
		problem(t, f.do("POST", route+"/b", `{}`, "k"), http.StatusUnprocessableEntity, httpidem.ProblemKeyMismatch)
	})
	t.Run("diagnostics name fields, never values", func(t *testing.T) {
		f := newFixture(t, httpidem.Route{Fingerprint: &fingerprint.Options{Diagnostics: true}}, h)
		f.do("POST", route, `{"amount":5,"currency":"USD","card":"tok_secret"}`, "k")
		r := f.do("POST", route, `{"amount":6,"currency":"USD","card":"tok_other"}`, "k")
		p := problem(t, r, http.StatusUnprocessableEntity, httpidem.ProblemKeyMismatch)
		assert.ElementsMatch(t, []string{"body /amount", "body /card"}, p.Fields)
		assert.NotContains(t, string(r.body), "tok_")
		assert.NotContains(t, string(r.body), "6")
	})
	before := calls.Load()
	assert.EqualValues(t, 3, before)
}

func TestInvalidBodies(t *testing.T) {
	h, calls := counting()
	f := newFixture(t, httpidem.Route{Fingerprint: &fingerprint.Options{MaxBodySize: 64}}, h)
	problem(t, f.do("POST", route, `{"a":`, "k"), http.StatusBadRequest, httpidem.ProblemInvalidBody)
	problem(t, f.do("POST", route, `{"a":1,"a":2}`, "k"), http.StatusBadRequest, httpidem.ProblemInvalidBody)
	problem(t, f.do("POST", route, `"`+strings.Repeat("x", 64)+`"`, "k"), http.StatusRequestEntityTooLarge, httpidem.ProblemBodyTooLarge)
	assert.Zero(t, calls.Load())
	// Nothing was stored under the key: a valid request runs.
	r := f.do("POST", route, `{"a":1}`, "k")
	assert.Equal(t, http.StatusCreated, r.status)
	assert.Empty(t, r.header.Get(httpidem.HeaderReplayed))
}

// gate is a handler that blocks until released, counting its calls.
type gate struct {
	entered chan struct{}
	release chan struct{}
	calls   atomic.Int64
	status  int
}

func newGate(status int) *gate {
	return &gate{entered: make(chan struct{}, 10), release: make(chan struct{}), status: status}
}

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := g.calls.Add(1)
	g.entered <- struct{}{}
	<-g.release
	w.WriteHeader(g.status)
	fmt.Fprintf(w, "call %d", n)
}

func TestConcurrentDuplicateIsConflict(t *testing.T) {
	g := newGate(http.StatusCreated)
	f := newFixture(t, httpidem.Route{}, g.ServeHTTP)
	first := make(chan response)
	go func() { first <- f.do("POST", route, `{}`, "k") }()
	<-g.entered

	r := f.do("POST", route, `{}`, "k")
	problem(t, r, http.StatusConflict, httpidem.ProblemInProgress)
	assert.NotEmpty(t, r.header.Get("Retry-After"))
	close(g.release)
	assert.Equal(t, http.StatusCreated, (<-first).status)
	assert.Equal(t, "call 1", string(f.do("POST", route, `{}`, "k").body))
	assert.EqualValues(t, 1, g.calls.Load())
}

func TestWaitForInProcessHolder(t *testing.T) {
	for _, tc := range []struct {
		name         string
		status       int
		wantReplayed bool
		wantCalls    int64
	}{
		{"replays the holder's outcome", http.StatusCreated, true, 1},
		{"runs when the holder released the key", http.StatusServiceUnavailable, false, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGate(tc.status)
			f := newFixture(t, httpidem.Route{Wait: time.Minute}, g.ServeHTTP)
			waiting := make(chan struct{})
			defer httpidem.SetTestHookWaiting(func() { close(waiting) })()

			first := make(chan response)
			go func() { first <- f.do("POST", route, `{}`, "k") }()
			<-g.entered
			second := make(chan response)
			go func() { second <- f.do("POST", route, `{}`, "k") }()
			select {
			case <-waiting:
			case <-time.After(30 * time.Second):
				t.Fatal("the duplicate never waited for the holder")
			}
			httpidem.SetTestHookWaiting(nil)
			close(g.release) // the first finishes; the second wakes
			r1, r2 := <-first, <-second
			assert.Equal(t, tc.status, r1.status)
			assert.Equal(t, tc.status, r2.status)
			assert.Equal(t, tc.wantReplayed, r2.header.Get(httpidem.HeaderReplayed) == "true")
			assert.Equal(t, tc.wantCalls, g.calls.Load())
		})
	}
}

func TestTransientOutcomesAreReleased(t *testing.T) {
	for _, status := range []int{500, 502, 503, 504, 408, 425, 429} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			var calls atomic.Int64
			f := newFixture(t, httpidem.Route{}, func(w http.ResponseWriter, r *http.Request) {
				if calls.Add(1) == 1 {
					w.WriteHeader(status)
					return
				}
				w.WriteHeader(http.StatusCreated)
			})
			assert.Equal(t, status, f.do("POST", route, `{}`, "k").status)
			assert.Equal(t, httpidem.Released, f.report().Disposition)
			assert.Equal(t, http.StatusCreated, f.do("POST", route, `{}`, "k").status)
			assert.EqualValues(t, 2, calls.Load())
		})
	}
	t.Run("4xx is final", func(t *testing.T) {
		var calls atomic.Int64
		f := newFixture(t, httpidem.Route{}, func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			http.Error(w, "declined", http.StatusPaymentRequired)
		})
		f.do("POST", route, `{}`, "k")
		r := f.do("POST", route, `{}`, "k")
		assert.Equal(t, http.StatusPaymentRequired, r.status)
		assert.Equal(t, "true", r.header.Get(httpidem.HeaderReplayed))
		assert.EqualValues(t, 1, calls.Load())
	})
}

// A validation failure is released, and the writes the handler added
// with Op.Apply go with it: nothing of the refused request is kept, and
// the corrected request runs under the same key.
func TestValidationFailureKeepsNothing(t *testing.T) {
	for _, mode := range []idemkv.Mode{idemkv.ModeLocal, idemkv.ModeRemote} {
		t.Run(mode.String(), func(t *testing.T) {
			var calls atomic.Int64
			f := newFixture(t, httpidem.Route{Mode: mode}, func(w http.ResponseWriter, r *http.Request) {
				n := calls.Add(1)
				body, _ := io.ReadAll(r.Body)
				httpidem.FromContext(r.Context()).Apply(func(fx idemkv.Effects) error {
					return fx.Set(fmt.Appendf(nil, "row-%d", n), body)
				})
				if strings.Contains(string(body), "-5") {
					w.WriteHeader(http.StatusUnprocessableEntity)
					return
				}
				w.WriteHeader(http.StatusCreated)
			})
			assert.Equal(t, http.StatusUnprocessableEntity, f.do("POST", route, `{"amount":-5}`, "k").status)
			rep := f.report()
			assert.Equal(t, httpidem.Released, rep.Disposition)
			assert.Equal(t, http.StatusUnprocessableEntity, rep.Status)
			_, err := f.eng.GetData(t.Context(), []byte("row-1"))
			assert.ErrorIs(t, err, idemkv.ErrNotFound, "the refused request's writes are dropped")
			_, err = f.eng.Get(t.Context(), idemkv.ID{Tenant: "acct_1", Endpoint: "POST " + route, Key: "k"})
			assert.ErrorIs(t, err, idemkv.ErrNotFound, "nothing is kept under the key, not even uncertain")

			assert.Equal(t, http.StatusCreated, f.do("POST", route, `{"amount":5}`, "k").status)
			v, err := f.eng.GetData(t.Context(), []byte("row-2"))
			require.NoError(t, err)
			assert.Equal(t, `{"amount":5}`, string(v))
			assert.EqualValues(t, 2, calls.Load())
		})
	}
}

func TestPanicNeverLeavesKeyStuck(t *testing.T) {
	t.Run("local: released", func(t *testing.T) {
		var calls atomic.Int64
		f := newFixture(t, httpidem.Route{}, func(w http.ResponseWriter, r *http.Request) {
			op := httpidem.FromContext(r.Context())
			op.Apply(func(fx idemkv.Effects) error { return fx.Set([]byte("row"), []byte("x")) })
			if calls.Add(1) == 1 {
				panic("boom")
			}
			w.WriteHeader(http.StatusCreated)
		})
		problem(t, f.do("POST", route, `{}`, "k"), http.StatusInternalServerError, httpidem.ProblemHandlerPanic)
		assert.Equal(t, httpidem.Panicked, f.report().Disposition)
		_, err := f.eng.GetData(t.Context(), []byte("row"))
		assert.ErrorIs(t, err, idemkv.ErrNotFound, "a panicked attempt's effects are not committed")
		assert.Equal(t, http.StatusCreated, f.do("POST", route, `{}`, "k").status)
		assert.EqualValues(t, 2, calls.Load())
	})
	t.Run("remote: uncertain", func(t *testing.T) {
		var calls atomic.Int64
		f := newFixture(t, httpidem.Route{Mode: idemkv.ModeRemote}, func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			panic("boom after the downstream call")
		})
		problem(t, f.do("POST", route, `{}`, "k"), http.StatusInternalServerError, httpidem.ProblemHandlerPanic)
		problem(t, f.do("POST", route, `{}`, "k"), http.StatusConflict, httpidem.ProblemReconciling)
		assert.EqualValues(t, 1, calls.Load(), "an uncertain operation is never re-run")
	})
}

func TestUncertainOutcome(t *testing.T) {
	var calls atomic.Int64
	f := newFixture(t, httpidem.Route{Mode: idemkv.ModeRemote}, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		op := httpidem.FromContext(r.Context())
		assert.False(t, op.Lease().OperationID.IsZero())
		op.Uncertain("provider timed out")
		w.WriteHeader(http.StatusGatewayTimeout)
	})
	assert.Equal(t, http.StatusGatewayTimeout, f.do("POST", route, `{}`, "k").status)
	assert.Equal(t, httpidem.Uncertain, f.report().Disposition)
	r := f.do("POST", route, `{}`, "k")
	problem(t, r, http.StatusConflict, httpidem.ProblemReconciling)
	assert.Equal(t, "5", r.header.Get("Retry-After"))
	rec, err := f.eng.Get(context.Background(), idemkv.ID{Tenant: "acct_1", Endpoint: "POST " + route, Key: "k"})
	require.NoError(t, err)
	assert.Equal(t, idemkv.StateUncertain, rec.State)
	assert.Equal(t, "provider timed out", rec.Note)
	assert.EqualValues(t, 1, calls.Load())
}

func TestClientDisconnectStillRecordsOutcome(t *testing.T) {
	handlerSawCancel := make(chan struct{})
	entered := make(chan struct{})
	var calls atomic.Int64
	f := newFixture(t, httpidem.Route{}, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		close(entered)
		<-r.Context().Done() // the client has gone; the work finishes anyway
		close(handlerSawCancel)
		httpidem.FromContext(r.Context()).Apply(func(fx idemkv.Effects) error { return fx.Set([]byte("row"), []byte("done")) })
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "created")
	})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", f.srv.URL+route, strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer acct_1")
	req.Header.Set(httpidem.HeaderKey, "k")
	errc := make(chan error)
	go func() {
		_, err := f.srv.Client().Do(req)
		errc <- err
	}()
	<-entered
	cancel()
	assert.Error(t, <-errc)
	<-handlerSawCancel
	assert.Equal(t, httpidem.Stored, f.report().Disposition)

	r := f.do("POST", route, `{}`, "k")
	assert.Equal(t, "created", string(r.body))
	assert.Equal(t, "true", r.header.Get(httpidem.HeaderReplayed))
	v, err := f.eng.GetData(t.Context(), []byte("row"))
	require.NoError(t, err)
	assert.Equal(t, "done", string(v))
	assert.EqualValues(t, 1, calls.Load())
}

func TestStoreDown(t *testing.T) {
	h, calls := counting()
	t.Run("fails closed", func(t *testing.T) {
		f := newFixture(t, httpidem.Route{}, h)
		require.NoError(t, f.eng.Close())
		r := f.do("POST", route, `{}`, "k")
		problem(t, r, http.StatusServiceUnavailable, httpidem.ProblemStoreUnavailable)
		assert.Equal(t, "1", r.header.Get("Retry-After"))
		rep := f.report()
		assert.Equal(t, httpidem.StoreError, rep.Disposition)
		assert.ErrorIs(t, rep.Err, idemkv.ErrClosed)
		assert.Zero(t, calls.Load())
	})
	t.Run("fail-open route runs", func(t *testing.T) {
		f := newFixture(t, httpidem.Route{FailOpen: true}, h)
		require.NoError(t, f.eng.Close())
		assert.Equal(t, http.StatusCreated, f.do("POST", route, `{}`, "k").status)
		assert.Equal(t, httpidem.Unprotected, f.report().Disposition)
		assert.EqualValues(t, 1, calls.Load())
	})
}

// toggleDisk reports no free space while full is set.
type toggleDisk struct {
	vfs.FS
	full atomic.Bool
}

func (d *toggleDisk) GetDiskUsage(path string) (vfs.DiskUsage, error) {
	u, err := d.FS.GetDiskUsage(path)
	if d.full.Load() {
		u.AvailBytes = 0
	}
	return u, err
}

// TestDiskFullAnswers503: a store low on disk refuses new requests with
// 503 and Retry-After, keeps replaying what it stored, and takes new
// requests again once space returns.
func TestDiskFullAnswers503(t *testing.T) {
	h, calls := counting()
	disk := &toggleDisk{FS: vfs.Default}
	f := newFixtureWith(t, httpidem.Route{}, h, func(o *engine.Options) { o.FS = disk })
	first := f.do("POST", route, `{}`, "k1")
	require.Equal(t, http.StatusCreated, first.status)

	disk.full.Store(true)
	f.clock.Advance(time.Second)
	r := f.do("POST", route, `{}`, "k2")
	problem(t, r, http.StatusServiceUnavailable, httpidem.ProblemStoreUnavailable)
	assert.NotEmpty(t, r.header.Get("Retry-After"))
	again := f.do("POST", route, `{}`, "k1")
	assert.Equal(t, first.body, again.body, "stored outcomes still replay")
	assert.Equal(t, "true", again.header.Get(httpidem.HeaderReplayed))

	disk.full.Store(false)
	f.clock.Advance(time.Second)
	assert.Equal(t, http.StatusCreated, f.do("POST", route, `{}`, "k2").status)
	assert.EqualValues(t, 2, calls.Load())
}

func TestEffectsCommitWithTheOutcome(t *testing.T) {
	var fail atomic.Bool
	var calls atomic.Int64
	f := newFixture(t, httpidem.Route{}, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		op := httpidem.FromContext(r.Context())
		require.NoError(t, op.Apply(func(fx idemkv.Effects) error {
			if fail.Load() {
				return errors.New("ledger refused the write")
			}
			return fx.Set([]byte("row"), []byte("v"))
		}))
		w.WriteHeader(http.StatusCreated)
	})
	fail.Store(true)
	problem(t, f.do("POST", route, `{}`, "k"), http.StatusServiceUnavailable, httpidem.ProblemStoreUnavailable)
	_, err := f.eng.GetData(t.Context(), []byte("row"))
	assert.ErrorIs(t, err, idemkv.ErrNotFound)

	fail.Store(false) // the key was released: the retry runs and commits
	assert.Equal(t, http.StatusCreated, f.do("POST", route, `{}`, "k").status)
	v, err := f.eng.GetData(t.Context(), []byte("row"))
	require.NoError(t, err)
	assert.Equal(t, "v", string(v))
	assert.EqualValues(t, 2, calls.Load())
}

func TestLargeResponseStoresPointer(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789"), 100)
	h := func(w http.ResponseWriter, r *http.Request) {
		op := httpidem.FromContext(r.Context())
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Location", "/v1/things/big")
		w.WriteHeader(http.StatusCreated)
		w.Write(big[:500])
		assert.ErrorIs(t, op.Apply(func(idemkv.Effects) error { return nil }), httpidem.ErrSettled)
		w.Write(big[500:])
	}
	t.Run("default replay", func(t *testing.T) {
		f := newFixture(t, httpidem.Route{MaxStoredBody: 100}, h)
		first := f.do("POST", route, `{}`, "k")
		assert.Equal(t, big, first.body, "the first response streams in full")
		r := f.do("POST", route, `{}`, "k")
		assert.Equal(t, http.StatusCreated, r.status)
		assert.Equal(t, "true", r.header.Get(httpidem.HeaderReplayed))
		assert.Equal(t, "/v1/things/big", r.header.Get("Location"))
		assert.Equal(t, "application/octet-stream", r.header.Get("Content-Type"))
		assert.Empty(t, r.body)
	})
	t.Run("rebuilt from the pointer", func(t *testing.T) {
		f := newFixture(t, httpidem.Route{MaxStoredBody: 100, Rebuild: func(w http.ResponseWriter, r *http.Request, res idemkv.Result) {
			w.WriteHeader(res.Status)
			io.WriteString(w, "rebuilt from "+res.Pointer)
		}}, h)
		f.do("POST", route, `{}`, "k")
		r := f.do("POST", route, `{}`, "k")
		assert.Equal(t, "rebuilt from /v1/things/big", string(r.body))
	})
}

// TestPointerOnly stores the compact record (status, headers, pointer)
// and rebuilds replays from the object the pointer names.
func TestPointerOnly(t *testing.T) {
	var objects sync.Map // pointer -> body
	var calls atomic.Int64
	h := func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		loc := fmt.Sprintf("/v1/things/t_%d", n)
		body := fmt.Sprintf(`{"id":"t_%d","padding":%q}`, n, strings.Repeat("p", 300))
		objects.Store(loc, body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", loc)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, body)
	}
	rebuild := func(w http.ResponseWriter, r *http.Request, res idemkv.Result) {
		body, _ := objects.Load(res.Pointer)
		w.WriteHeader(res.Status)
		io.WriteString(w, body.(string))
	}
	f := newFixture(t, httpidem.Route{PointerOnly: true, Rebuild: rebuild}, h)
	first := f.do("POST", route, `{}`, "k")
	require.Equal(t, http.StatusCreated, first.status)
	again := f.do("POST", route, `{}`, "k")
	assert.Equal(t, first.body, again.body, "rebuilt byte for byte")
	assert.Equal(t, "true", again.header.Get(httpidem.HeaderReplayed))
	assert.Equal(t, "/v1/things/t_1", again.header.Get("Location"))
	assert.EqualValues(t, 1, calls.Load())

	rec, err := f.eng.Get(context.Background(), idemkv.ID{Tenant: "acct_1", Endpoint: "POST " + route, Key: "k"})
	require.NoError(t, err)
	assert.Equal(t, "/v1/things/t_1", rec.Result.Pointer)
	assert.Less(t, len(rec.Result.Body), 64, "only the headers are stored, not the %d-byte body", len(first.body))

	// An outcome without a pointer keeps its body: there is nothing to
	// rebuild it from.
	f2 := newFixture(t, httpidem.Route{PointerOnly: true, Rebuild: rebuild}, func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "declined: card expired", http.StatusPaymentRequired)
	})
	declined := f2.do("POST", route, `{}`, "k")
	replayed := f2.do("POST", route, `{}`, "k")
	assert.Equal(t, "true", replayed.header.Get(httpidem.HeaderReplayed))
	assert.Equal(t, declined.body, replayed.body)
}

func TestExpiredKeyRunsAsNew(t *testing.T) {
	h, calls := counting()
	f := newFixture(t, httpidem.Route{Retention: "money"}, h)
	first := f.do("POST", route, `{}`, "k")
	assert.Equal(t, fmt.Sprint(30*24*3600), first.header.Get(httpidem.HeaderRetention))
	f.clock.Advance(30*24*time.Hour - time.Second)
	assert.Equal(t, "true", f.do("POST", route, `{}`, "k").header.Get(httpidem.HeaderReplayed))
	f.clock.Advance(2 * time.Second)
	r := f.do("POST", route, `{}`, "k")
	assert.Empty(t, r.header.Get(httpidem.HeaderReplayed))
	assert.EqualValues(t, 2, calls.Load())
}

func TestLeaseLost(t *testing.T) {
	g := newGate(http.StatusCreated)
	// Without heartbeats, a handler that outlives its lease is like one
	// that stalled: a retry takes it over.
	f := newFixture(t, httpidem.Route{Lease: time.Second, Heartbeat: -1}, g.ServeHTTP)
	first := make(chan response)
	go func() { first <- f.do("POST", route, `{}`, "k") }()
	<-g.entered
	f.clock.Advance(2 * time.Second) // the first holder's lease runs out
	second := make(chan response)
	go func() { second <- f.do("POST", route, `{}`, "k") }()
	<-g.entered
	g.release <- struct{}{}
	g.release <- struct{}{}
	r1, r2 := <-first, <-second
	// Whichever finished first stored the outcome; only the taker-over can.
	problem(t, r1, http.StatusConflict, httpidem.ProblemLeaseLost)
	assert.Equal(t, http.StatusCreated, r2.status)
	r := f.do("POST", route, `{}`, "k")
	assert.Equal(t, r2.body, r.body)
}

func TestConfigurationErrors(t *testing.T) {
	eng, err := engine.Open(t.TempDir(), &engine.Options{NoBackgroundSweep: true})
	require.NoError(t, err)
	defer eng.Close()
	_, err = httpidem.New(nil)
	assert.ErrorContains(t, err, "required")
	_, err = httpidem.New(&httpidem.Options{Store: eng})
	assert.ErrorContains(t, err, "Tenant is required")
	_, err = httpidem.New(&httpidem.Options{Tenant: bearer})
	assert.Error(t, err)
	m, err := httpidem.New(&httpidem.Options{Store: eng, Tenant: bearer})
	require.NoError(t, err)
	h := http.NotFoundHandler()
	for name, rt := range map[string]httpidem.Route{
		"unknown class":                {Retention: "nope"},
		"lower method":                 {Methods: []string{"post"}},
		"bad mode":                     {Mode: 7},
		"bad fp options":               {Fingerprint: &fingerprint.Options{Mode: fingerprint.ModeFields}},
		"negative wait":                {Wait: -1},
		"pointer-only without rebuild": {PointerOnly: true},
	} {
		_, err := m.Wrap(h, rt)
		assert.Error(t, err, name)
	}
}

func TestConcurrentSameKeyRunsOnce(t *testing.T) {
	h, calls := counting()
	f := newFixture(t, httpidem.Route{Wait: time.Minute}, h)
	var wg sync.WaitGroup
	bodies := make([][]byte, 32)
	for i := range bodies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bodies[i] = f.do("POST", route, `{"n":1}`, "same").body
		}()
	}
	wg.Wait()
	assert.EqualValues(t, 1, calls.Load())
	for _, b := range bodies {
		assert.Equal(t, bodies[0], b)
	}
}
