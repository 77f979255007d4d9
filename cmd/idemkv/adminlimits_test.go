package main

// The admin surface is held to the public one's rules (issue: "the
// connection and time limits, authentication and problem+json of the
// public API apply; no secrets or raw keys in logs; fuzz the admin API's
// inputs; a test per rule"). The tests below check each rule against the
// admin server serve starts, over loopback. Rules other tests cover
// already:
//
//   - A missing or wrong token (none, another, one byte longer, upper
//     case) is answered 401 problem+json with WWW-Authenticate on every
//     endpoint and an unknown path, and does nothing:
//     admin.TestAuthentication (the handler over loopback httptest);
//     through serve, TestServeAdminAPI (no token; the CLI with another).
//     TestAdminRefusesOtherCredentials adds a prefix of the token and
//     the token anywhere but the Authorization header.
//   - A body over 64 KiB is answered 413 problem+json: admin.TestBadInput
//     (backup); TestAdminRefusesOversizeBodies adds resolve and evict,
//     through serve.
//   - Another method is answered 405 problem+json: admin.TestBadInput;
//     its Allow header: TestAdminWrongMethodSaysAllow.
//   - A non-loopback --admin-addr is refused without --admin-allow-remote:
//     TestServeAdminAPI (0.0.0.0:0); the other spellings of "every
//     interface": TestAdminAddrMustBeLoopback.
//   - admin.New refuses a token under admin.MinTokenLen:
//     admin.TestAuthentication; serve's refusal:
//     TestAdminTokenNeverFromAFlag.
//   - How the limits behave on any handler: TestServerLimitsCutOffSlowClients
//     and TestConnLimiterClosesIdleConnectionsFirst (httpserver_test.go).
//   - Arbitrary methods, paths, queries and bodies: admin.FuzzAdmin.

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/internal/logtest"
	"github.com/idemkv/idemkv/reconcile"
)

const adminTestToken = "adm1n-t0ken-9f8e7d6c5b4a"

// adminRig is serve with its admin API on loopback: addr is the admin
// listener's, url the payments service's, logs what serve logged.
type adminRig struct {
	addr, url string
	logs      *logtest.Log
}

// startAdmin runs serve with the admin API, its limits l (nil: serve's
// own), and its log captured.
func startAdmin(t *testing.T, l *serverLimits, mods ...func(*serveConfig)) *adminRig {
	t.Helper()
	tokFile := filepath.Join(t.TempDir(), "admin-token")
	require.NoError(t, os.WriteFile(tokFile, []byte(adminTestToken+"\n"), 0o600))
	aln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	r := &adminRig{addr: aln.Addr().String(), logs: &logtest.Log{}}
	cfg := serveConfig{dir: t.TempDir(), adminLn: aln, adminTokenFile: tokFile, adminLimits: l, log: logFlags{out: r.logs}}
	for _, mod := range mods {
		mod(&cfg)
	}
	r.url, _ = startServeOn(t, cfg)
	return r
}

// dial opens a raw connection to the admin API.
func (r *adminRig) dial(t *testing.T) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", r.addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	// A guard against a hang, not a synchronization: every read below
	// ends long before it.
	require.NoError(t, c.SetDeadline(time.Now().Add(30*time.Second)))
	return c
}

// do sends one admin call with the Authorization header auth (none if
// empty) and returns the answer, its body read.
func (r *adminRig) do(t *testing.T, method, target, body, auth string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+r.addr+target, strings.NewReader(body))
	require.NoError(t, err)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

// TestAdminServerHasThePublicLimits: serve builds the admin server with
// the public server's limits on header and body time, idle time and
// header bytes, a write time longer by what an admin call may take, and
// a connection cap of its own, all applied to its listener.
func TestAdminServerHasThePublicLimits(t *testing.T) {
	e, err := engine.Open(t.TempDir(), &engine.Options{NoBackgroundSweep: true})
	require.NoError(t, err)
	defer e.Close()
	t.Setenv(adminTokenEnv, adminTestToken)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	c := serveConfig{dir: t.TempDir(), adminLn: ln}
	srv, aln, closeAudit, err := c.adminServerFor(&service{st: servedStore{store: e}}, slog.New(slog.DiscardHandler), log.New(io.Discard, "", 0))
	require.NoError(t, err)
	defer closeAudit()

	public := defaultLimits(0, 1)
	require.Equal(t, public.readHeader, srv.ReadHeaderTimeout)
	require.Equal(t, public.read, srv.ReadTimeout)
	require.Equal(t, public.idle, srv.IdleTimeout)
	require.Equal(t, public.maxHeader, srv.MaxHeaderBytes)
	require.Equal(t, public.write+adminCallTime, srv.WriteTimeout)
	require.NotNil(t, srv.ConnState, "the connection cap tracks connections")
	ll, ok := aln.(*limitedListener)
	require.True(t, ok, "the admin listener is capped")
	require.Equal(t, adminConns, ll.c.max)
}

// TestAdminCutsOffSlowClients: a client that does not finish its headers,
// or its body, in time, or idles on a kept-alive connection, is cut off
// (the limits shortened: serve's own are seconds).
func TestAdminCutsOffSlowClients(t *testing.T) {
	l := defaultLimits(adminCallTime, adminConns)
	l.readHeader, l.read, l.idle = 200*time.Millisecond, 300*time.Millisecond, 200*time.Millisecond
	r := startAdmin(t, &l)

	half := r.dial(t) // headers never finished
	_, err := io.WriteString(half, "GET /admin/v1/stats HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+adminTestToken+"\r\n")
	require.NoError(t, err)
	requireClosed(t, half)

	trickle := r.dial(t) // a body that never arrives in full
	_, err = fmt.Fprintf(trickle, "POST /admin/v1/backup HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: 100\r\n\r\n{", adminTestToken)
	require.NoError(t, err)
	requireClosed(t, trickle)

	idle := r.dial(t) // a keep-alive connection left idle
	_, err = fmt.Fprintf(idle, "GET /admin/v1/stats HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", adminTestToken)
	require.NoError(t, err)
	br := bufio.NewReader(idle)
	require.Equal(t, http.StatusOK, readStatus(t, br))
	_, err = br.ReadByte()
	require.Error(t, err, "the idle connection was closed")
}

// TestAdminRefusesOversizeHeaders: headers past the public server's 32
// KiB are answered 431 before any handler runs (so in net/http's plain
// text, not problem+json), with serve's own limits.
func TestAdminRefusesOversizeHeaders(t *testing.T) {
	r := startAdmin(t, nil)
	c := r.dial(t)
	// The server may answer before it has read all of this.
	_, _ = fmt.Fprintf(c, "GET /admin/v1/stats HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nX-Big: %s\r\n\r\n",
		adminTestToken, strings.Repeat("a", 64<<10))
	require.Equal(t, http.StatusRequestHeaderFieldsTooLarge, readStatus(t, bufio.NewReader(c)))
}

// TestAdminConnectionCap: with serve's own limits, adminConns connections
// are served at once, and one more closes the one idle longest to make
// room: an operator's tools are never locked out by connections left
// open, and no more than adminConns descriptors go to the admin API.
func TestAdminConnectionCap(t *testing.T) {
	r := startAdmin(t, nil)
	stats := fmt.Sprintf("GET /admin/v1/stats HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", adminTestToken)
	type conn struct {
		c  net.Conn
		br *bufio.Reader
	}
	conns := make([]conn, adminConns)
	for i := range conns {
		c := r.dial(t)
		conns[i] = conn{c, bufio.NewReader(c)}
	}
	// Two rounds of calls on every connection: all adminConns were open
	// together, and none was closed for another.
	for range 2 {
		for _, c := range conns {
			_, err := io.WriteString(c.c, stats)
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, readStatus(t, c.br))
		}
	}

	extra := r.dial(t)
	_, err := io.WriteString(extra, stats)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, readStatus(t, bufio.NewReader(extra)), "one past the cap is served")

	// It took the slot of one idle connection, closed when it was
	// accepted: a call there fails; every other is still served.
	closed := 0
	for _, c := range conns {
		if _, err := io.WriteString(c.c, stats); err != nil {
			closed++
			continue
		}
		resp, err := http.ReadResponse(c.br, nil)
		if err != nil {
			closed++
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	require.Equal(t, 1, closed, "one connection made room for the one past the cap")
}

// TestAdminRefusesOversizeBodies: every endpoint that takes a body
// answers one past its limit (64 KiB; a resolve's, which may carry a
// response body to store, 24 MiB) 413 problem+json, having read no more
// of it.
func TestAdminRefusesOversizeBodies(t *testing.T) {
	r := startAdmin(t, nil)
	big := strings.Repeat("a", 70<<10)
	huge := strings.Repeat("a", 25<<20)
	for _, tc := range []struct{ path, body string }{
		{"/admin/v1/backup", `{"dir": "/` + big + `"}`},
		{"/admin/v1/resolve", `{"tenant": "acct_1", "endpoint": "POST /v1/payments", "key": "k", "no_effect": true, "note": "` + huge + `"}`},
		{"/admin/v1/evict", `{"tenant": "acct_1", "endpoint": "POST /v1/payments", "key": "k", "reason": "` + big + `"}`},
	} {
		resp, body := r.do(t, "POST", tc.path, tc.body, "Bearer "+adminTestToken)
		require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, "%s: %s", tc.path, body)
		require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"), tc.path)
	}
}

// adminEndpoints are the admin API's endpoints and the one method each
// takes.
var adminEndpoints = []struct{ path, method string }{
	{"/admin/v1/record", "GET"},
	{"/admin/v1/records", "GET"},
	{"/admin/v1/pending", "GET"},
	{"/admin/v1/export", "GET"},
	{"/admin/v1/resolve", "POST"},
	{"/admin/v1/evict", "POST"},
	{"/admin/v1/stats", "GET"},
	{"/admin/v1/check", "POST"},
	{"/admin/v1/sweep", "POST"},
	{"/admin/v1/backup", "POST"},
}

// TestAdminRefusesOtherCredentials: on every endpoint and an unknown
// path, a prefix of the token, the token under another scheme, in the
// query or in another header are answered 401 problem+json with
// WWW-Authenticate, as no token is.
func TestAdminRefusesOtherCredentials(t *testing.T) {
	r := startAdmin(t, nil)
	paths := []struct{ path, method string }{{"/nowhere", "GET"}, {"/admin/v1/nowhere", "POST"}}
	paths = append(paths, adminEndpoints...)
	for _, p := range paths {
		for _, tc := range []struct{ target, auth string }{
			{p.path, ""},
			{p.path, "Bearer " + adminTestToken[:len(adminTestToken)-1]},
			{p.path, "Bearer " + adminTestToken[:8]},
			{p.path, "Bearer"},
			{p.path, "Basic " + adminTestToken},
			{p.path, adminTestToken},
			{p.path + "?" + url.Values{"token": {adminTestToken}, "access_token": {adminTestToken}}.Encode(), ""},
		} {
			req, err := http.NewRequest(p.method, "http://"+r.addr+tc.target, nil)
			require.NoError(t, err)
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			req.Header.Set("X-Admin-Token", adminTestToken)
			req.AddCookie(&http.Cookie{Name: "token", Value: adminTestToken})
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			what := fmt.Sprintf("%s %s with %q", p.method, tc.target, tc.auth)
			require.Equal(t, http.StatusUnauthorized, resp.StatusCode, what)
			require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"), what)
			require.Contains(t, resp.Header.Get("WWW-Authenticate"), "Bearer", what)
			require.Contains(t, string(b), "unauthenticated", what)
		}
	}
}

// TestAdminWrongMethodSaysAllow: each endpoint answers another method
// 405 problem+json with an Allow header naming the one it takes.
func TestAdminWrongMethodSaysAllow(t *testing.T) {
	r := startAdmin(t, nil)
	for _, ep := range adminEndpoints {
		for _, m := range []string{"GET", "POST", "PUT", "DELETE", "PATCH"} {
			if m == ep.method {
				continue
			}
			resp, body := r.do(t, m, ep.path, "", "Bearer "+adminTestToken)
			what := m + " " + ep.path
			require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, what)
			require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"), what)
			require.Equal(t, ep.method, resp.Header.Get("Allow"), what)
			require.Contains(t, body, "admin-invalid-request", what)
		}
	}
}

// TestAdminAddrMustBeLoopback: every spelling of an address other than
// loopback is refused without --admin-allow-remote, before anything is
// opened; loopback ones pass that check.
func TestAdminAddrMustBeLoopback(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0", "[::]:0", "192.0.2.1:7070", "example.com:7070", "127.0.0.1"} {
		var out, errOut bytes.Buffer
		require.Equal(t, exitUsage, run(context.Background(), []string{"serve", "--addr", "127.0.0.1:0", "--data", t.TempDir(), "--admin-addr", addr}, &out, &errOut), addr)
		require.Contains(t, errOut.String(), "not a loopback address", addr)
	}
	for _, addr := range []string{"127.0.0.1:7070", "localhost:7070", "[::1]:7070"} {
		require.True(t, isLoopback(addr), addr)
	}
}

// TestAdminTokenNeverFromAFlag: no command takes a token or another
// secret as a flag value, which ps would show, only the name of a file
// holding it; serve without a token, or with one shorter than
// admin.MinTokenLen, does not serve.
func TestAdminTokenNeverFromAFlag(t *testing.T) {
	ctx := context.Background()
	t.Setenv(adminTokenEnv, "")
	for name, c := range commands {
		fs := flag.NewFlagSet(name, flag.ContinueOnError)
		c.flags(fs)
		fs.VisitAll(func(f *flag.Flag) {
			if g, ok := f.Value.(flag.Getter); ok && isUint64(g.Get()) {
				return // a number: a record's fencing token (resolve, evict --token)
			}
			for _, secret := range []string{"token", "secret", "password"} {
				if strings.Contains(f.Name, secret) {
					assert.True(t, strings.HasSuffix(f.Name, "-file"), "idemkv %s --%s takes a secret as its value", name, f.Name)
				}
			}
		})
	}
	for _, args := range [][]string{
		{"serve", "--addr", "127.0.0.1:0", "--data", t.TempDir(), "--admin-addr", "127.0.0.1:0", "--admin-token", adminTestToken},
		{"inspect", "--server", "http://127.0.0.1:1", "--token", adminTestToken, "--tenant", "t", "--endpoint", "e", "--key", "k"},
	} {
		var out, errOut bytes.Buffer
		require.Equal(t, exitUsage, run(ctx, args, &out, &errOut), "%v", args[:2])
		require.Contains(t, errOut.String(), "flag provided but not defined", "%v", args[:2])
	}

	var out, errOut bytes.Buffer
	require.Equal(t, exitFail, run(ctx, []string{"serve", "--addr", "127.0.0.1:0", "--data", t.TempDir(), "--admin-addr", "127.0.0.1:0"}, &out, &errOut))
	require.Contains(t, errOut.String(), "the admin API needs a token")
	short := filepath.Join(t.TempDir(), "short")
	require.NoError(t, os.WriteFile(short, []byte("too-short"), 0o600))
	errOut.Reset()
	require.Equal(t, exitFail, run(ctx, []string{"serve", "--addr", "127.0.0.1:0", "--data", t.TempDir(), "--admin-addr", "127.0.0.1:0", "--admin-token-file", short}, &out, &errOut))
	require.Contains(t, errOut.String(), "at least 16 bytes")
}

// TestAdminLogsNoSecrets: serve's log, through calls that succeed (a
// lookup, a listing, a resolve, which is logged), are refused (a wrong
// token, a missing record, an invalid key) and fail, never holds the
// admin token, a token offered in its place, or a record's key; and an
// admin call the store fails (a 500) is logged, by path, with the
// store's error.
func TestAdminLogsNoSecrets(t *testing.T) {
	// Every charge times out: the payment is left uncertain, for an
	// operator to resolve (the reconciler waits out its grace first).
	r := startAdmin(t, nil, func(c *serveConfig) {
		c.provider.TimeoutRate = 1
		c.reconcile = reconcile.Options{Interval: time.Hour, Grace: time.Hour, MaxAttempts: 20, MaxAge: 24 * time.Hour}
	})
	const key, missing, wrong = "order-Zx9Qv7-secretish", "order-Kq3Lm8-absent", "wrong-T0ken-Pz4Rs2-never-logged"
	status, _, body := payOnce(t, r.url, key)
	require.GreaterOrEqual(t, status, 500, body)
	bearer := "Bearer " + adminTestToken
	record := func(k string) string {
		return "/admin/v1/record?" + url.Values{"tenant": {"acct_1"}, "endpoint": {"POST /v1/payments"}, "key": {k}}.Encode()
	}

	resp, body := r.do(t, "GET", record(key), "", bearer)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Contains(t, body, key)
	resp, _ = r.do(t, "GET", record(missing), "", bearer)
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	resp, _ = r.do(t, "GET", record(key), "", "Bearer "+wrong)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	resp, _ = r.do(t, "GET", record(strings.Repeat(key, 40)), "", bearer) // an invalid key: 400
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	resp, _ = r.do(t, "GET", "/admin/v1/records?tenant="+url.QueryEscape(key), "", bearer)
	require.Equal(t, http.StatusOK, resp.StatusCode)

	resp, body = r.do(t, "POST", "/admin/v1/resolve", fmt.Sprintf(`{"tenant": "acct_1", "endpoint": "POST /v1/payments", "key": %q, "no_effect": true, "note": "test: nothing to settle"}`, missing), bearer)
	require.Equal(t, http.StatusNotFound, resp.StatusCode, body)
	resp, body = r.do(t, "POST", "/admin/v1/evict", fmt.Sprintf(`{"tenant": "acct_1", "endpoint": "POST /v1/payments", "key": %q, "reason": "test: the log keeps no key"}`, missing), bearer)
	require.Equal(t, http.StatusNotFound, resp.StatusCode, body)
	resp, body = r.do(t, "POST", "/admin/v1/resolve", fmt.Sprintf(`{"tenant": "acct_1", "endpoint": "POST /v1/payments", "key": %q, "no_effect": true, "note": "test: the log keeps no key"}`, key), bearer)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)

	// A backup where no directory can be made, even by root: the store
	// fails the call.
	file := "/proc/idemkv-backup"
	resp, body = r.do(t, "POST", "/admin/v1/backup", fmt.Sprintf(`{"dir": %q}`, file), bearer)
	require.Equal(t, http.StatusInternalServerError, resp.StatusCode, body)
	require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
	require.NotContains(t, body, file, "the answer says only that it failed")

	logs := r.logs.String()
	require.Contains(t, logs, `"msg":"admin: resolve","tenant":"acct_1"`, "the resolve is logged, by tenant and endpoint")
	require.Contains(t, logs, "admin call failed", "the 500 is logged")
	require.Contains(t, logs, `"path":"/admin/v1/backup"`)
	require.Contains(t, logs, file, "with the store's error")
	for _, secret := range []string{adminTestToken, wrong, key, missing} {
		require.NotContains(t, logs, secret)
	}
}

func isUint64(v any) bool {
	_, ok := v.(uint64)
	return ok
}
