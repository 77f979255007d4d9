package httpidem_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fingerprint"
	"github.com/idemkv/idemkv/httpidem"
)

// servePaths serves a handler that answers with the path it ran for,
// wrapped with rt and registered by mount on a fresh mux, and returns
// the fixture and the handler's call count.
func servePaths(t *testing.T, rt httpidem.Route, mount func(mux *http.ServeMux, h http.Handler)) (*fixture, *atomic.Int32) {
	t.Helper()
	f := newFixture(t, rt, func(http.ResponseWriter, *http.Request) {})
	var calls atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "%s\n", r.URL.Path)
	})
	m, err := httpidem.New(&httpidem.Options{Store: f.eng, Tenant: bearer, Clock: f.clock, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	wrapped, err := m.Wrap(h, rt)
	require.NoError(t, err)
	mux := http.NewServeMux()
	mount(mux, wrapped)
	f.srv.Close()
	f.srv = httptest.NewServer(mux)
	return f, &calls
}

// TestKeyNeverCrossesResources: one key sent for two resources under one
// route pattern never answers the second with the first's response. A
// subtree pattern ("/v1/") and a pattern shorter than the path (a router
// mounted under Route.Pattern) fingerprint the path past the pattern, so
// the second is 422, also under http.StripPrefix; a request for the same
// resource replays, however its path is escaped.
func TestKeyNeverCrossesResources(t *testing.T) {
	for name, tc := range map[string]struct {
		rt    httpidem.Route
		mount string
		strip string // mounted with http.StripPrefix
	}{
		"subtree":                   {httpidem.Route{}, "/v1/", ""},
		"mounted router":            {httpidem.Route{Pattern: "/v1/payments"}, "/v1/payments/", ""},
		"subtree wildcard":          {httpidem.Route{}, "/v1/{acct}/", ""},
		"subtree, prefix stripped":  {httpidem.Route{}, "/v1/", "/v1"},
		"mounted, prefix stripped":  {httpidem.Route{Pattern: "/v1/payments"}, "/v1/payments/", "/v1/payments"},
		"wildcard, prefix stripped": {httpidem.Route{}, "/v1/{acct}/", "/v1"},
	} {
		t.Run(name, func(t *testing.T) {
			f, calls := servePaths(t, tc.rt, func(mux *http.ServeMux, h http.Handler) {
				if tc.strip != "" {
					h = http.StripPrefix(tc.strip, h)
				}
				mux.Handle(tc.mount, h)
			})
			a := f.do("POST", "/v1/payments/pay_A/refunds", `{"amount":1}`, "k")
			require.Equal(t, http.StatusCreated, a.status, "%s", a.body)
			problem(t, f.do("POST", "/v1/payments/pay_B/refunds", `{"amount":1}`, "k"), http.StatusUnprocessableEntity, httpidem.ProblemKeyMismatch)
			// The same resource, spelled with an escape a proxy may add or
			// remove, replays; an escaped "/" is another resource.
			for _, path := range []string{"/v1/payments/pay_A/refunds", "/v1/payments/pay_%41/refunds", "/v1/payments/pay_%41/ref%75nds"} {
				again := f.do("POST", path, `{"amount":1}`, "k")
				require.Equal(t, "true", again.header.Get(httpidem.HeaderReplayed), path)
				require.Equal(t, a.body, again.body)
			}
			problem(t, f.do("POST", "/v1/payments/pay_A%2Frefunds", `{"amount":1}`, "k"), http.StatusUnprocessableEntity, httpidem.ProblemKeyMismatch)
			require.EqualValues(t, 1, calls.Load())
		})
	}
}

// TestUnfilledWildcardIsMisconfigured: a Route.Pattern whose wildcard the
// router names otherwise would make every resource look alike; such a
// request is answered 500 misconfigured, and the handler does not run.
func TestUnfilledWildcardIsMisconfigured(t *testing.T) {
	f, calls := servePaths(t, httpidem.Route{Pattern: "/v1/payments/{id}/refunds"}, func(mux *http.ServeMux, h http.Handler) {
		mux.Handle("/v1/payments/{pid}/refunds", h)
	})
	problem(t, f.do("POST", "/v1/payments/pay_A/refunds", `{}`, "k"), http.StatusInternalServerError, httpidem.ProblemMisconfigured)
	require.Zero(t, calls.Load())

	// A {name...} wildcard may match nothing.
	f, calls = servePaths(t, httpidem.Route{}, func(mux *http.ServeMux, h http.Handler) { mux.Handle("/v1/files/{path...}", h) })
	require.Equal(t, http.StatusCreated, f.do("POST", "/v1/files/", `{}`, "k").status)
	problem(t, f.do("POST", "/v1/files/a/b", `{}`, "k"), http.StatusUnprocessableEntity, httpidem.ProblemKeyMismatch)
	require.EqualValues(t, 1, calls.Load())
}

// TestOutcomeStoredUnderAPathAsSpelled: an outcome stored before the
// path past the pattern was fingerprinted in its normal form (under the
// path as the client spelled it, "pay_%41") replays for its retry, which
// is not a mismatch after the upgrade.
func TestOutcomeStoredUnderAPathAsSpelled(t *testing.T) {
	f, calls := servePaths(t, httpidem.Route{}, func(mux *http.ServeMux, h http.Handler) { mux.Handle("/v1/", h) })
	const body = `{"amount":1}`
	old, err := fingerprint.Compute(fingerprint.Request{Tenant: "acct_1", Method: "POST", Route: "/v1/",
		Params: map[string]string{"...": "payments/pay_%41/refunds"}, Query: url.Values{}, Header: http.Header{}, Body: []byte(body)}, nil)
	require.NoError(t, err)
	id := idemkv.ID{Tenant: "acct_1", Endpoint: "POST /v1/", Key: "k"}
	c, err := f.eng.Claim(context.Background(), idemkv.ClaimRequest{ID: id, Fingerprint: old.Bytes})
	require.NoError(t, err)
	require.NoError(t, f.eng.Complete(context.Background(), c.Lease, httpidem.Outcome(http.StatusCreated, "", nil, []byte("stored before\n")), nil))

	again := f.do("POST", "/v1/payments/pay_%41/refunds", body, "k")
	require.Equal(t, http.StatusCreated, again.status, "%s", again.body)
	require.Equal(t, "true", again.header.Get(httpidem.HeaderReplayed))
	require.Equal(t, "stored before\n", string(again.body))
	problem(t, f.do("POST", "/v1/payments/pay_B/refunds", body, "k"), http.StatusUnprocessableEntity, httpidem.ProblemKeyMismatch)
	require.Zero(t, calls.Load())
}
