package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/admin"
	"github.com/idemkv/idemkv/engine"
	"github.com/stretchr/testify/require"
)

var ctx = context.Background()

const token = "0123456789abcdef-test-token"

func id(key string) idemkv.ID {
	return idemkv.ID{Tenant: "acct_1", Endpoint: "POST /v1/payments", Key: key}
}

// serve runs the admin API over an engine on loopback HTTP.
func serve(t *testing.T) (*engine.Engine, *httptest.Server) {
	t.Helper()
	e, err := engine.Open(t.TempDir(), &engine.Options{NoBackgroundSweep: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	h, err := admin.New(e, &admin.Options{Token: token,
		Check: func(ctx context.Context) (any, int, error) {
			rep, err := e.Check(ctx)
			return rep, rep.ProblemCount, err
		},
		Sweep:  func(ctx context.Context) (any, error) { return e.Sweep(ctx) },
		Backup: e.Backup,
		Stats:  func(context.Context) (any, error) { return e.Stats() },
	})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return e, srv
}

func call(t *testing.T, srv *httptest.Server, method, path, body, tok string) (int, map[string]any, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	require.NoError(t, err)
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out map[string]any
	require.NoError(t, json.Unmarshal(b, &out), "%s %s: %s", method, path, b)
	return resp.StatusCode, out, resp.Header
}

func complete(t *testing.T, e *engine.Engine, key string) {
	t.Helper()
	c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id(key), Fingerprint: []byte{1}})
	require.NoError(t, err)
	require.NoError(t, e.Complete(ctx, c.Lease, idemkv.Result{Status: 201, Pointer: "/v1/payments/" + key, Body: []byte("{}")},
		func(fx idemkv.Effects) error { return fx.Set([]byte("pay/"+key), []byte("x")) }))
}

func recordPath(key string) string {
	return "/admin/v1/record?" + url.Values{"tenant": {"acct_1"}, "endpoint": {"POST /v1/payments"}, "key": {key}}.Encode()
}

// TestAuthentication: every endpoint, known or not, refuses a call
// without the token or with another, and does nothing for it.
func TestAuthentication(t *testing.T) {
	e, srv := serve(t)
	complete(t, e, "p1")
	dir := filepath.Join(t.TempDir(), "b")
	for _, tc := range []struct{ method, path, body string }{
		{"GET", recordPath("p1"), ""},
		{"GET", "/admin/v1/records", ""},
		{"GET", "/admin/v1/pending", ""},
		{"GET", "/admin/v1/export", ""},
		{"POST", "/admin/v1/resolve", `{"tenant":"acct_1","endpoint":"POST /v1/payments","key":"p1","no_effect":true,"note":"x"}`},
		{"POST", "/admin/v1/evict", `{"tenant":"acct_1","endpoint":"POST /v1/payments","key":"p1","reason":"x"}`},
		{"GET", "/admin/v1/stats", ""},
		{"POST", "/admin/v1/check", ""},
		{"POST", "/admin/v1/sweep", ""},
		{"POST", "/admin/v1/backup", fmt.Sprintf(`{"dir": %q}`, dir)},
		{"GET", "/nowhere", ""},
	} {
		for _, tok := range []string{"", "wrong", token + "x", strings.ToUpper(token)} {
			status, body, h := call(t, srv, tc.method, tc.path, tc.body, tok)
			require.Equal(t, http.StatusUnauthorized, status, "%s %s with %q", tc.method, tc.path, tok)
			require.Contains(t, body["type"], "unauthenticated")
			require.Contains(t, h.Get("WWW-Authenticate"), "Bearer")
			require.Equal(t, "application/problem+json", h.Get("Content-Type"))
		}
	}
	require.NoDirExists(t, dir, "a refused backup made nothing")
	_, err := admin.New(e, &admin.Options{Token: "short"})
	require.ErrorIs(t, err, idemkv.ErrInvalidArgument)
}

// TestRecordsAndOperations: with the token, a record is looked up, the
// pending records listed, the store checked and swept, and a backup taken
// while the store serves opens as a store with the outcome.
func TestRecordsAndOperations(t *testing.T) {
	e, srv := serve(t)
	complete(t, e, "p1")
	c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id("p2"), Fingerprint: []byte{1}, Mode: idemkv.ModeRemote})
	require.NoError(t, err)
	require.NoError(t, e.MarkUncertain(ctx, c.Lease, "timed out"))

	status, rec, _ := call(t, srv, "GET", recordPath("p1"), "", token)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "completed", rec["state"])
	require.Equal(t, "/v1/payments/p1", rec["pointer"])
	require.EqualValues(t, 2, rec["body_bytes"])
	require.NotContains(t, rec, "body")

	status, page, _ := call(t, srv, "GET", "/admin/v1/pending?limit=10", "", token)
	require.Equal(t, http.StatusOK, status)
	records := page["records"].([]any)
	require.Len(t, records, 1)
	require.Equal(t, "p2", records[0].(map[string]any)["key"])
	require.Equal(t, "timed out", records[0].(map[string]any)["note"])

	status, st, _ := call(t, srv, "GET", "/admin/v1/stats", "", token)
	require.Equal(t, http.StatusOK, status)
	require.NotEmpty(t, st)
	status, chk, _ := call(t, srv, "POST", "/admin/v1/check", "", token)
	require.Equal(t, http.StatusOK, status)
	require.EqualValues(t, 0, chk["problems"])
	status, _, _ = call(t, srv, "POST", "/admin/v1/sweep", "", token)
	require.Equal(t, http.StatusOK, status)

	dir := filepath.Join(t.TempDir(), "backup")
	status, out, _ := call(t, srv, "POST", "/admin/v1/backup", fmt.Sprintf(`{"dir": %q}`, dir), token)
	require.Equal(t, http.StatusCreated, status, "%v", out)
	status, out, _ = call(t, srv, "POST", "/admin/v1/backup", fmt.Sprintf(`{"dir": %q}`, dir), token)
	require.Equal(t, http.StatusConflict, status, "%v", out)
	mistyped := filepath.Join(t.TempDir(), "no-such-dir", "backup")
	status, out, _ = call(t, srv, "POST", "/admin/v1/backup", fmt.Sprintf(`{"dir": %q}`, mistyped), token)
	require.Equal(t, http.StatusBadRequest, status, "%v", out)
	require.NoDirExists(t, filepath.Dir(mistyped), "no tree of directories made for a mistyped path")
	b, err := engine.Open(dir, &engine.Options{ReadOnly: true, NoBackgroundSweep: true})
	require.NoError(t, err)
	defer b.Close()
	got, err := b.Get(ctx, id("p1"))
	require.NoError(t, err)
	require.Equal(t, "/v1/payments/p1", got.Result.Pointer)
}

// TestBadInput: malformed parameters and bodies are refused with a
// problem+json 4xx, and change nothing.
func TestBadInput(t *testing.T) {
	e, srv := serve(t)
	complete(t, e, "p1")
	rel := filepath.Join("relative", "dir")
	for _, tc := range []struct {
		method, path, body string
		status             int
	}{
		{"GET", "/admin/v1/record?tenant=acct_1&endpoint=POST+%2Fv1%2Fpayments&key=nope", "", 404},
		{"GET", "/admin/v1/record?tenant=&endpoint=&key=", "", 400},
		{"GET", "/admin/v1/record?tenant=t&endpoint=e&key=" + strings.Repeat("k", 1000), "", 400},
		{"GET", "/admin/v1/records?limit=0", "", 400},
		{"GET", "/admin/v1/records?limit=abc", "", 400},
		{"GET", "/admin/v1/pending?escalated=maybe", "", 400},
		{"GET", "/admin/v1/pending?after=%21%21", "", 400},
		{"GET", "/admin/v1/records?after=%21%21", "", 400},
		{"GET", "/admin/v1/records?state=done", "", 400},
		{"GET", "/admin/v1/records?older_than=yesterday", "", 400},
		{"GET", "/admin/v1/records?older_than=-1h", "", 400},
		{"GET", "/admin/v1/records?stat=uncertain", "", 400},
		{"GET", "/admin/v1/records?limit=1001", "", 400},
		{"GET", "/admin/v1/export?outbox=perhaps", "", 400},
		{"GET", "/admin/v1/export?outbx=true", "", 400},
		{"GET", "/admin/v1/pending?escalted=true", "", 400},
		{"POST", "/admin/v1/resolve", `{"tenant":"acct_1","endpoint":"POST /v1/payments","key":"p1","note":"x"}`, 404}, // no audit log
		{"POST", "/admin/v1/evict", `{"tenant":"acct_1","endpoint":"POST /v1/payments","key":"p1","reason":"x"}`, 404},
		{"POST", "/admin/v1/record", "", 405},
		{"DELETE", "/admin/v1/records", "", 405},
		{"POST", "/admin/v1/check", "{}", 400},
		{"POST", "/admin/v1/backup", "", 400},
		{"POST", "/admin/v1/backup", `{"dir": 7}`, 400},
		{"POST", "/admin/v1/backup", `{"dir": "/tmp/x", "extra": 1}`, 400},
		{"POST", "/admin/v1/backup", `{"dir": "/tmp/x"} {}`, 400},
		{"POST", "/admin/v1/backup", fmt.Sprintf(`{"dir": %q}`, rel), 400},
		{"POST", "/admin/v1/backup", `{"dir": "/tmp/../etc/x"}`, 400},
		{"POST", "/admin/v1/backup", `{"dir": "` + strings.Repeat("a", 70<<10) + `"}`, 413},
		{"GET", "/admin/v2/record", "", 404},
	} {
		req, err := http.NewRequest(tc.method, srv.URL+tc.path, strings.NewReader(tc.body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, tc.status, resp.StatusCode, "%s %s %.80s: %s", tc.method, tc.path, tc.body, b)
		require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"), "%s %s", tc.method, tc.path)
	}
	rep, err := e.Check(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, rep.Completed)
}

// FuzzAdmin sends the admin API arbitrary methods, paths, queries and
// bodies, with the token: it never panics or answers 5xx, every refusal is
// problem+json, and the store's record is unchanged unless a well-formed
// eviction removed it.
func FuzzAdmin(f *testing.F) {
	for _, seed := range []struct{ method, target, body string }{
		{"GET", "/admin/v1/record?tenant=acct_1&endpoint=POST+%2Fv1%2Fpayments&key=p1", ""},
		{"GET", "/admin/v1/pending?limit=5&escalated=true&after=eyJ9", ""},
		{"GET", "/admin/v1/records?state=completed&older_than=1h&limit=3", ""},
		{"GET", "/admin/v1/export?outbox=true", ""},
		{"POST", "/admin/v1/evict", `{"tenant":"acct_1","endpoint":"POST /v1/payments","key":"p1","reason":"fuzz"}`},
		{"POST", "/admin/v1/backup", `{"dir":"/nonexistent/deeper/x"}`},
		{"POST", "/admin/v1/check", ""},
		{"GET", "/admin/v1/stats", ""},
		{"PUT", "/admin/v1/../v1/record", "{"},
	} {
		f.Add(seed.method, seed.target, seed.body)
	}
	e, err := engine.Open(f.TempDir(), &engine.Options{NoBackgroundSweep: true})
	require.NoError(f, err)
	defer e.Close()
	completeP1 := func(t require.TestingT) {
		c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id("p1"), Fingerprint: []byte{1}})
		require.NoError(t, err)
		require.NoError(t, e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, func(fx idemkv.Effects) error { return fx.Set([]byte("pay/p1"), []byte("x")) }))
	}
	completeP1(f)
	audit, err := admin.OpenAuditLog(filepath.Join(f.TempDir(), "audit.log"))
	require.NoError(f, err)
	defer audit.Close()
	h, err := admin.New(e, &admin.Options{Token: token, Audit: audit,
		Check: func(ctx context.Context) (any, int, error) {
			rep, err := e.Check(ctx)
			return rep, rep.ProblemCount, err
		},
		Stats: func(context.Context) (any, error) { return e.Stats() },
		// No Backup: a fuzzed path must not write into the filesystem.
	})
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, method, target, body string) {
		req, err := http.NewRequest(method, "http://admin.test"+target, strings.NewReader(body))
		if err != nil {
			t.Skip() // not a request a client could send
		}
		req.Header.Set("Authorization", "Bearer "+token)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		require.Less(t, w.Code, 500, "%s %q %q: %s", method, target, body, w.Body.String())
		if w.Code >= 400 {
			require.Equal(t, "application/problem+json", w.Header().Get("Content-Type"), "%s %q", method, target)
		}
		rec, err := e.Get(ctx, id("p1"))
		if errors.Is(err, idemkv.ErrNotFound) {
			// Only a well-formed eviction of p1 may remove it: put it back.
			require.Equal(t, http.StatusOK, w.Code, "p1 gone after %s %q %q", method, target, body)
			require.Equal(t, "/admin/v1/evict", req.URL.Path)
			completeP1(t)
			return
		}
		require.NoError(t, err)
		require.Equal(t, idemkv.StateCompleted, rec.State)
	})
}
