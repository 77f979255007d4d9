package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	neturl "net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/examples/payments"
	"github.com/idemkv/idemkv/examples/processor"
	"github.com/idemkv/idemkv/internal/logtest"
	"github.com/idemkv/idemkv/reconcile"
)

// Operators settle payments through the payments service (issue 36, item
// 5): the payments below are left uncertain by a card processor that
// either charges and loses its answer (an idemkv processor), or loses the
// call on its way there (a proxy in front of it answers 504 and forwards
// nothing), with an account limit so that each holds its amount; serve's
// reconciler waits an hour, so the operator settles them.

// testProcessor runs an idemkv processor that makes every charge and
// loses its answer (504), behind a proxy that, while charge is false,
// answers a charge request 504 itself, uncharged. Lookups go through. It
// returns the proxy's URL.
func testProcessor(t *testing.T, charge *atomic.Bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var out logtest.Log
	go func() {
		done <- runProcessor(ctx, ln, processorConfig{dir: t.TempDir(), retention: time.Hour,
			o: processor.Options{Hold: time.Millisecond, Fault: func(context.Context, string) error { return processor.ErrTimeout }}}, &out)
	}()
	t.Cleanup(func() {
		// A connection a client dialled and never used would hold the
		// processor's shutdown: close them first.
		http.DefaultClient.CloseIdleConnections()
		cancel()
		require.NoError(t, <-done)
	})
	target, err := neturl.Parse("http://" + ln.Addr().String())
	require.NoError(t, err)
	forward := httputil.NewSingleHostReverseProxy(target)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && !charge.Load() {
			w.WriteHeader(http.StatusGatewayTimeout) // lost on the way: nothing charged
			return
		}
		forward.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	return proxy.URL
}

// uncertainPayment pays key through the service at url and checks that
// the payment is left uncertain (charged, if charge is set).
func uncertainPayment(t *testing.T, url, key string, charge *atomic.Bool, charged bool) {
	t.Helper()
	charge.Store(charged)
	status, _, body := payOnce(t, url, key)
	require.Equal(t, http.StatusGatewayTimeout, status, body)
	require.Contains(t, body, "payment-outcome-unknown")
}

// getJSON GETs path at url as acct_1 and decodes a 200's body into out.
func getJSON(t *testing.T, url, path string, out any) int {
	t.Helper()
	req, err := http.NewRequest("GET", url+path, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer acct_1")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		require.NoError(t, json.NewDecoder(resp.Body).Decode(out))
	}
	return resp.StatusCode
}

func spent(t *testing.T, url string) int64 {
	t.Helper()
	var a payments.Account
	require.Equal(t, http.StatusOK, getJSON(t, url, "/v1/account", &a))
	return a.Spent
}

// requirePaymentRow checks that key's replay is its payment, whole, and
// that the payment's own page has it.
func requirePaymentRow(t *testing.T, url, key string) payments.Payment {
	t.Helper()
	status, replayed, body := payOnce(t, url, key)
	require.Equal(t, http.StatusCreated, status, body)
	require.Equal(t, "true", replayed)
	var p payments.Payment
	require.NoError(t, json.Unmarshal([]byte(body), &p), "the replay is the payment: %q", body)
	require.NotEmpty(t, p.Charge)
	require.EqualValues(t, 5000, p.Amount)
	var got payments.Payment
	require.Equal(t, http.StatusOK, getJSON(t, url, "/v1/payments/"+p.ID, &got))
	require.Equal(t, p, got)
	return p
}

// cliFunc runs the CLI and checks its exit code.
func cliFunc(t *testing.T) func(want int, args ...string) string {
	return func(want int, args ...string) string {
		t.Helper()
		var out, errOut bytes.Buffer
		code := run(context.Background(), args, &out, &errOut)
		require.Equal(t, want, code, "%v: %s%s", args, out.String(), errOut.String())
		return out.String() + errOut.String()
	}
}

func paymentID(key string) []string {
	return []string{"--tenant", "acct_1", "--endpoint", "POST /v1/payments", "--key", key}
}

func args(parts ...[]string) []string {
	var out []string
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// TestResolveServerVerify: on the engine, with the real payments service
// and its admin API resolving through it (as serve runs it, given its
// service), resolve --server --verify refuses to release a payment the
// processor charged and to complete one it did not, and settles each the
// way the processor says: the charged one with its payment row, which
// its retry replays, the other with its hold given back. The audit log
// says each was verified and what the processor answered.
func TestResolveServerVerify(t *testing.T) {
	var charge atomic.Bool
	purl := testProcessor(t, &charge)
	dir := t.TempDir()
	e, err := engine.Open(dir, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	proc, err := payments.NewProcessorClient(purl, 300*time.Millisecond, nil)
	require.NoError(t, err)
	svc, err := payments.New(payments.Config{Store: e, Processor: proc, AccountLimit: 100_000, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	pub := httptest.NewServer(svc.Handler())
	t.Cleanup(pub.Close)

	tokFile := filepath.Join(t.TempDir(), "admin-token")
	require.NoError(t, os.WriteFile(tokFile, []byte("resolve-verify-admin-token\n"), 0o600))
	aln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cfg := serveConfig{dir: dir, adminLn: aln, adminTokenFile: tokFile}
	logger := slog.New(slog.DiscardHandler)
	asrv, aln2, closeAudit, err := cfg.adminServerFor(&service{st: servedStore{store: e}, svc: svc}, logger, log.New(os.Stderr, "", 0))
	require.NoError(t, err)
	go func() { _ = asrv.Serve(aln2) }()
	t.Cleanup(func() {
		_ = asrv.Close()
		closeAudit()
	})
	server := []string{"--server", "http://" + aln.Addr().String(), "--token-file", tokFile}
	cli := cliFunc(t)

	uncertainPayment(t, pub.URL, "order-c", &charge, true)
	uncertainPayment(t, pub.URL, "order-n", &charge, false)
	require.EqualValues(t, 10_000, spent(t, pub.URL), "each holds its amount")

	out := cli(exitFail, args([]string{"resolve", "--no-effect", "--verify", "--note", "ops: not charged, I think"}, paymentID("order-c"), server)...)
	require.Contains(t, out, "409")
	require.Contains(t, out, "says the operation happened")
	out = cli(exitFail, args([]string{"resolve", "--applied", "--verify", "--note", "ops: charged, I think"}, paymentID("order-n"), server)...)
	require.Contains(t, out, "409")
	require.Contains(t, out, "did not happen")
	for _, key := range []string{"order-c", "order-n"} {
		rec, err := e.Get(context.Background(), idemkv.ID{Tenant: "acct_1", Endpoint: "POST /v1/payments", Key: key})
		require.NoError(t, err)
		require.Equal(t, idemkv.StateUncertain, rec.State, "%s: refused, so unchanged", key)
	}
	require.EqualValues(t, 10_000, spent(t, pub.URL))
	require.Contains(t, cli(exitUsage, args([]string{"resolve", "--applied", "--verify", "--processor", purl, "--note", "x"}, paymentID("order-c"), server)...), "--data")

	out = cli(exitOK, args([]string{"resolve", "--applied", "--verify", "--status", "200", "--pointer", "/v1/payments/made_up", "--note", "ops: ask the processor"}, paymentID("order-c"), server)...)
	require.Contains(t, out, "verified, the downstream answered applied")
	p := requirePaymentRow(t, pub.URL, "order-c")
	require.NotEqual(t, "made_up", p.ID, "the processor's charge, not the operator's pointer")
	out = cli(exitOK, args([]string{"resolve", "--no-effect", "--verify", "--note", "ops: ask the processor"}, paymentID("order-n"), server)...)
	require.Contains(t, out, "verified, the downstream answered not applied")
	require.EqualValues(t, 5000, spent(t, pub.URL), "order-c's hold converted, order-n's given back")

	var verified []string
	for _, entry := range readLines(t, filepath.Join(dir, "audit.log")) {
		if entry["phase"] != "begun" {
			verified = append(verified, strings.Join([]string{entry["key"].(string), entry["phase"].(string), entry["downstream"].(string)}, " "))
			require.Equal(t, true, entry["verified"])
		}
	}
	require.Equal(t, []string{"order-c failed applied", "order-n failed not applied", "order-c done applied", "order-n done not applied"}, verified)
}

// TestResolveDataThroughTheService: a store serve left with uncertain
// payments is settled with resolve --data: --verify needs --processor;
// with it, a charged payment is not released and is completed with its
// payment row, an uncharged one released with its hold given back; and
// the restarted serve replays the charged one whole. Without --verify the
// resolutions go through the service's Settle, if package payments has
// it (another branch of issue 36): then the applied one writes its
// payment row too, and the no-effect one gives its hold back; without it
// they write the record alone, as before.
func TestResolveDataThroughTheService(t *testing.T) {
	var charge atomic.Bool
	purl := testProcessor(t, &charge)
	cfg := serveConfig{dir: t.TempDir(), processorURL: purl, processorTimeout: 300 * time.Millisecond, accountLimit: 100_000,
		reconcile: reconcile.Options{Interval: time.Hour, Grace: time.Hour, MaxAttempts: 20, MaxAge: 24 * time.Hour}}
	url, stop := startServeOn(t, cfg)
	uncertainPayment(t, url, "order-c", &charge, true)
	uncertainPayment(t, url, "order-n", &charge, false)
	uncertainPayment(t, url, "order-s", &charge, true)
	uncertainPayment(t, url, "order-z", &charge, false)
	require.EqualValues(t, 20_000, spent(t, url))
	require.NoError(t, stop())

	cli := cliFunc(t)
	data := []string{"--data", cfg.dir}
	withProc := []string{"--data", cfg.dir, "--processor", purl, "--account-limit", "100000"}
	require.Contains(t, cli(exitUsage, args([]string{"resolve", "--no-effect", "--verify", "--note", "x"}, paymentID("order-c"), data)...), "--processor")
	require.Contains(t, cli(exitFail, args([]string{"resolve", "--no-effect", "--verify", "--note", "ops: not charged, I think"}, paymentID("order-c"), withProc)...),
		"says the operation happened")
	require.Contains(t, cli(exitOK, args([]string{"resolve", "--applied", "--verify", "--note", "ops: ask the processor"}, paymentID("order-c"), withProc)...),
		"the downstream answered applied")
	require.Contains(t, cli(exitOK, args([]string{"resolve", "--no-effect", "--verify", "--note", "ops: ask the processor"}, paymentID("order-n"), withProc)...),
		"the downstream answered not applied")
	cli(exitOK, args([]string{"resolve", "--applied", "--status", "201", "--pointer", "/v1/payments/by_hand", "--note", "ops: seen in the dashboard"}, paymentID("order-s"), withProc)...)
	cli(exitOK, args([]string{"resolve", "--no-effect", "--note", "ops: not in the dashboard"}, paymentID("order-z"), withProc)...)

	url, _ = startServeOn(t, cfg)
	requirePaymentRow(t, url, "order-c")
	if _, settles := any(&payments.Service{}).(reconcile.Settler); settles {
		requirePaymentRow(t, url, "order-s")
		require.EqualValues(t, 10_000, spent(t, url), "order-c's and order-s's converted, order-n's and order-z's given back")
		return
	}
	// Without Settle the operator's word is stored alone: the outcome
	// replays with no payment behind it, and order-z keeps its hold.
	status, replayed, body := payOnce(t, url, "order-s")
	require.Equal(t, http.StatusCreated, status, body)
	require.Equal(t, "true", replayed)
	require.Empty(t, body)
	require.EqualValues(t, 15_000, spent(t, url), "order-c's and order-s's kept, order-n's given back, order-z's kept")
}
