package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/examples/payments"
	"github.com/idemkv/idemkv/examples/processor"
	"github.com/idemkv/idemkv/internal/logtest"
	"github.com/idemkv/idemkv/reconcile"
)

// TestServeOverLoopback runs the command's server on a loopback port,
// pays twice with one key, restarts it on the same store and checks that
// the retry still replays.
func TestServeOverLoopback(t *testing.T) {
	dir := t.TempDir()
	start := func() (url string, stop func() error) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		var out logtest.Log
		done := make(chan error, 1)
		go func() { done <- serve(ctx, ln, serveConfig{dir: dir}, &out) }()
		return "http://" + ln.Addr().String(), func() error {
			cancel()
			err := <-done
			assert.Contains(t, out.String(), "payments service on http://"+ln.Addr().String())
			return err
		}
	}
	pay := func(url string) (int, string, string) {
		req, _ := http.NewRequest("POST", url+"/v1/payments", strings.NewReader(`{"amount":5000,"currency":"USD","card":"tok_123"}`))
		req.Header.Set("Authorization", "Bearer acct_1")
		req.Header.Set("Idempotency-Key", `"order-1"`)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), string(b)
	}

	url, stop := start()
	status, replayed, first := pay(url)
	assert.Equal(t, http.StatusCreated, status, first)
	assert.Empty(t, replayed)
	require.NoError(t, stop(), "a graceful shutdown")

	url, stop = start()
	status, replayed, again := pay(url)
	assert.Equal(t, http.StatusCreated, status)
	assert.Equal(t, "true", replayed)
	assert.Equal(t, first, again, "the replay after a restart is byte-identical")
	require.NoError(t, stop())

	var out, errOut bytes.Buffer
	assert.Equal(t, exitOK, run(context.Background(), []string{"check", "--data", dir}, &out, &errOut), "%s%s", out.String(), errOut.String())
}

func TestServeRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"serve", "--provider-fail-rate", "1.5"},
		{"serve", "--provider-fail-rate", "0.6", "--provider-timeout-rate", "0.6"},
		{"serve", "--provider-latency", "-1s"},
		{"serve", "--addr", "0.0.0.0:0"}, // not loopback, and no --api-keys
		{"serve", "--addr", ":0"},
		{"serve", "--processor", "localhost:8081"}, // no scheme
		{"serve", "--reconcile-interval", "-1s"},
		{"serve", "--reconcile-max-age", "-1h"},
		{"serve", "--reconcile-max-attempts", "0"},
		{"processor", "--addr", "0.0.0.0:0"},
		{"processor", "--fail-rate", "0.7", "--timeout-rate", "0.7"},
	} {
		var out, errOut bytes.Buffer
		assert.Equal(t, exitUsage, run(context.Background(), args, &out, &errOut), "%v", args)
	}
}

// With --background-nice, serve exports how many compactions ran at the
// lowered priority; without it, the family is absent.
func TestServeLowPriorityMetric(t *testing.T) {
	for _, nice := range []int{0, 19} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- serve(ctx, ln, serveConfig{dir: t.TempDir(), bg: backgroundFlags{nice: nice}}, io.Discard)
		}()
		resp, err := http.Get("http://" + ln.Addr().String() + "/metrics")
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		if nice == 0 {
			require.NotContains(t, string(body), "idemkv_low_priority_compactions_total")
		} else {
			require.Contains(t, string(body), "idemkv_low_priority_compactions_total 0")
		}
		cancel()
		require.NoError(t, <-done)
	}
}

// With --metrics-addr, /metrics is served there and not on the service's
// address.
func TestServeMetricsOnTheirOwnAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	mln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var out logtest.Log
	go func() { done <- serve(ctx, ln, serveConfig{dir: t.TempDir(), metricsLn: mln}, &out) }()
	get := func(url string) (int, string) {
		resp, err := http.Get(url)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	status, _ := get("http://" + ln.Addr().String() + "/metrics")
	require.Equal(t, http.StatusNotFound, status)
	status, body := get("http://" + mln.Addr().String() + "/metrics")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, "idemkv_engine_claims_total")
	status, _ = get("http://" + mln.Addr().String() + "/v1/payments")
	require.Equal(t, http.StatusNotFound, status, "the metrics address serves metrics only")
	cancel()
	require.NoError(t, <-done)
	require.Contains(t, out.String(), "metrics on http://"+mln.Addr().String()+"/metrics")
}

// With --api-keys, a caller is the account its secret maps to: a token
// that is not a key, an account name included, is 401, and one account
// cannot see another's payments. A key file others may read is refused.
func TestServeAuthenticatesWithAPIKeys(t *testing.T) {
	keys := filepath.Join(t.TempDir(), "keys")
	require.NoError(t, os.WriteFile(keys, []byte("# secret account\nsk_alice_0123456789abcdef alice\nsk_bob_0123456789abcdef0 bob\n"), 0o600))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var out logtest.Log
	go func() { done <- serve(ctx, ln, serveConfig{dir: t.TempDir(), apiKeys: keys}, &out) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
		require.NotContains(t, out.String(), "demo mode")
	}()
	url := "http://" + ln.Addr().String()
	do := func(method, path, token, key string) (int, string) {
		req, _ := http.NewRequest(method, url+path, strings.NewReader(`{"amount":5000,"currency":"USD","card":"tok_123"}`))
		req.Header.Set("Authorization", "Bearer "+token)
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	status, body := do("POST", "/v1/payments", "sk_alice_0123456789abcdef", "k1")
	require.Equal(t, http.StatusCreated, status, body)
	for _, token := range []string{"alice", "bob", "sk_alice_0123456789abcdeX"} {
		status, body = do("GET", "/v1/payments", token, "")
		require.Equal(t, http.StatusUnauthorized, status, "%s: %s", token, body)
		status, body = do("POST", "/v1/payments", token, "k1")
		require.Equal(t, http.StatusUnauthorized, status, "%s: %s", token, body)
	}
	status, body = do("GET", "/v1/payments", "sk_bob_0123456789abcdef0", "")
	require.Equal(t, http.StatusOK, status)
	require.JSONEq(t, `{"data":[],"has_more":false}`, body, "bob sees none of alice's payments")
	status, body = do("GET", "/v1/payments", "sk_alice_0123456789abcdef", "")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, `"amount":5000`)

	require.NoError(t, os.Chmod(keys, 0o644))
	ln2, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	err = serve(context.Background(), ln2, serveConfig{dir: t.TempDir(), apiKeys: keys}, io.Discard)
	require.ErrorContains(t, err, "chmod 600")
}

// TestServeReconcilesATimedOutPayment is the issue as a user met it: with
// every processor call timing out after charging, a payment answers 504,
// then 409 while uncertain; serve's reconciler asks the processor, finds
// the charge and writes the payment, and the client's retries (package
// client, honouring Retry-After) end in a 201 replay. One charge in all.
func TestServeReconcilesATimedOutPayment(t *testing.T) {
	for _, sc := range storeCases {
		t.Run(sc.name, func(t *testing.T) { testServeReconcilesATimedOutPayment(t, sc) })
	}
}

func testServeReconcilesATimedOutPayment(t *testing.T, sc storeCase) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var out logtest.Log
	done := make(chan error, 1)
	cfg := sc.config(t)
	cfg.provider = payments.ProviderOptions{TimeoutRate: 1}
	cfg.reconcile = reconcile.Options{Interval: 20 * time.Millisecond, Grace: time.Millisecond}
	go func() { done <- serve(ctx, ln, cfg, &out) }()
	url := "http://" + ln.Addr().String()

	c := client.New(nil, &client.Options{MaxAttempts: 100, MaxInterval: 50 * time.Millisecond})
	req, _ := http.NewRequest("POST", url+"/v1/payments", strings.NewReader(`{"amount":5000,"currency":"USD","card":"tok_123"}`))
	req.Header.Set("Authorization", "Bearer acct_1")
	req.Header.Set("Idempotency-Key", "order-1")
	resp, err := c.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)
	assert.True(t, client.Replayed(resp), "the reconciler stored the outcome; the client got its replay")
	mresp, err := http.Get(url + "/metrics")
	require.NoError(t, err)
	metrics, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	prefix := "idemkv_engine_"
	if cfg.store != "" {
		prefix = "idemkv_pgstore_"
	}
	for _, line := range []string{`idemkv_reconcile_answers_total{verdict="applied"} 1`, prefix + "uncertain_records 0",
		prefix + "escalated_records 0"} {
		assert.Contains(t, string(metrics), line+"\n")
	}
	cancel()
	require.NoError(t, <-done)
	assert.Contains(t, out.String(), "reconciling uncertain payments every 20ms")
	sc.check(t, cfg)
}

// TestServeWithAnHTTPProcessor runs idemkv processor, timing out after
// every charge, and serve --processor against it: the client's retries end
// in the payment, reconciled by asking the processor over HTTP, and the
// processor's listing holds one charge.
func TestServeWithAnHTTPProcessor(t *testing.T) {
	pln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var pout, sout logtest.Log
	pdone := make(chan error, 1)
	go func() {
		pdone <- runProcessor(ctx, pln, processorConfig{dir: t.TempDir(), retention: time.Hour,
			o: processor.Options{TimeoutRate: 1, Hold: time.Hour}}, &pout)
	}()
	purl := "http://" + pln.Addr().String()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	sdone := make(chan error, 1)
	cfg := serveConfig{dir: t.TempDir(), processorURL: purl, processorTimeout: 100 * time.Millisecond,
		reconcile: reconcile.Options{Interval: 20 * time.Millisecond, Grace: time.Millisecond}}
	go func() { sdone <- serve(ctx, ln, cfg, &sout) }()

	c := client.New(nil, &client.Options{MaxAttempts: 100, MaxInterval: 50 * time.Millisecond})
	req, _ := http.NewRequest("POST", "http://"+ln.Addr().String()+"/v1/payments", strings.NewReader(`{"amount":5000,"currency":"USD","card":"tok_123"}`))
	req.Header.Set("Authorization", "Bearer acct_1")
	resp, err := c.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)

	resp, err = http.Get(purl + "/v1/charges")
	require.NoError(t, err)
	var all struct{ Charges []processor.Charge }
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&all))
	resp.Body.Close()
	require.Len(t, all.Charges, 1, "one charge for the payment, however many attempts")
	assert.Equal(t, int64(5000), all.Charges[0].Amount)
	cancel()
	require.NoError(t, <-sdone)
	require.NoError(t, <-pdone)
	assert.Contains(t, sout.String(), "charging the card processor at "+purl)
	assert.Contains(t, pout.String(), "card processor on "+purl)
}

// TestServeResumesAnOrderAfterItsAuthorizationTimedOut: an order whose
// authorization timed out reads "authorizing" (reconciling); serve's
// reconciler finds the charge and its order loop resumes the saga, and
// the order ends confirmed. The test polls the order's page, as a client
// would, until then (bounded).
func TestServeResumesAnOrderAfterItsAuthorizationTimedOut(t *testing.T) {
	for _, sc := range storeCases {
		t.Run(sc.name, func(t *testing.T) { testServeResumesAnOrder(t, sc) })
	}
}

func testServeResumesAnOrder(t *testing.T, sc storeCase) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var out logtest.Log
	done := make(chan error, 1)
	cfg := sc.config(t)
	cfg.lease, cfg.provider = 300*time.Millisecond, payments.ProviderOptions{TimeoutRate: 1}
	cfg.reconcile = reconcile.Options{Interval: 20 * time.Millisecond, Grace: time.Millisecond}
	go func() { done <- serve(ctx, ln, cfg, &out) }()
	url := "http://" + ln.Addr().String()
	do := func(method, path, key, body string) (int, payments.Order) {
		req, _ := http.NewRequest(method, url+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer acct_1")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var o payments.Order
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&o))
		return resp.StatusCode, o
	}
	status, o := do("POST", "/v1/orders", "ord-1", `{"amount":1200,"currency":"USD","sku":"pen"}`)
	require.Equal(t, http.StatusAccepted, status)
	assert.Equal(t, "authorizing", o.Status)
	assert.True(t, o.Reconciling)
	deadline := time.Now().Add(10 * time.Second)
	for o.Status != "confirmed" && time.Now().Before(deadline) {
		<-time.After(20 * time.Millisecond)
		_, o = do("GET", "/v1/orders/"+o.ID, "", "")
	}
	assert.Equal(t, "confirmed", o.Status)
	assert.NotEmpty(t, o.Charge)
	cancel()
	require.NoError(t, <-done)
	sc.check(t, cfg)
}

// TestServeSimulatorRemembersAcrossARestart is issue 36's item 3: a
// payment whose processor call timed out after charging, then a restart
// of serve. The simulated processor keeps its charges under
// DATA/processor, so the reconciler of the new process finds the charge
// and stores the payment, and the client's retry gets it replayed; an
// empty simulator would have said "never charged", and the retry would
// have charged again.
func TestServeSimulatorRemembersAcrossARestart(t *testing.T) {
	dir := t.TempDir()
	cfg := serveConfig{dir: dir, provider: payments.ProviderOptions{TimeoutRate: 1},
		reconcile: reconcile.Options{Interval: time.Hour, Grace: time.Hour}}
	url, stop := startServeOn(t, cfg)
	status, _, body := payOnce(t, url, "order-1")
	require.Equal(t, http.StatusGatewayTimeout, status, body)
	require.NoError(t, stop())

	charge := retryUntilSettled(t, serveConfig{dir: dir}, "order-1")
	charges := simulatorCharges(t, dir)
	require.Len(t, charges, 1, "one charge in all")
	assert.Equal(t, charges[0].ID, charge)
}

// TestServeBackupKeepsTheSimulatorsCharges: an online backup (the admin
// API) of a serve that charges the simulated processor copies the
// processor's charges with the store. A payment whose answer timed out
// before the backup is found charged by the restored service's
// reconciler, and its retry replays that charge; restored without them,
// the reconciler would hear "never charged" and the retry charge again.
func TestServeBackupKeepsTheSimulatorsCharges(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	tokFile := filepath.Join(t.TempDir(), "admin-token")
	require.NoError(t, os.WriteFile(tokFile, []byte("backup-ledger-admin-token\n"), 0o600))
	aln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	url, stop := startServeOn(t, serveConfig{dir: dir, adminLn: aln, adminTokenFile: tokFile,
		provider:  payments.ProviderOptions{TimeoutRate: 1},
		reconcile: reconcile.Options{Interval: time.Hour, Grace: time.Hour}})
	status, _, body := payOnce(t, url, "order-1")
	require.Equal(t, http.StatusGatewayTimeout, status, body)
	backup := filepath.Join(t.TempDir(), "backup")
	var out, errOut bytes.Buffer
	require.Equal(t, exitOK, run(ctx, []string{"backup", "--server", "http://" + aln.Addr().String(),
		"--token-file", tokFile, "--to", backup}, &out, &errOut), errOut.String())
	require.NoError(t, stop())

	restored := filepath.Join(t.TempDir(), "restored")
	require.Equal(t, exitOK, run(ctx, []string{"restore", "--from", backup, "--data", restored}, &out, &errOut), errOut.String())
	before := simulatorCharges(t, dir)
	require.Len(t, before, 1)
	charge := retryUntilSettled(t, serveConfig{dir: restored}, "order-1")
	assert.Equal(t, before[0].ID, charge, "the retry got the charge made before the backup")
	assert.Len(t, simulatorCharges(t, restored), 1, "and charged nothing more")
}

// retryUntilSettled starts serve with cfg, charging a simulated processor
// that answers, and a reconciler that asks at once; it retries key's
// payment until the answer is final, stops serve, and returns the
// payment's charge. The answer must be a replay: the reconciler found the
// charge of an earlier attempt.
func retryUntilSettled(t *testing.T, cfg serveConfig, key string) string {
	t.Helper()
	cfg.reconcile = reconcile.Options{Interval: 20 * time.Millisecond, Grace: time.Millisecond}
	url, stop := startServeOn(t, cfg)
	c := client.New(nil, &client.Options{MaxAttempts: 100, MaxInterval: 50 * time.Millisecond})
	req, _ := http.NewRequest("POST", url+"/v1/payments", strings.NewReader(`{"amount":5000,"currency":"USD","card":"tok_123"}`))
	req.Header.Set("Authorization", "Bearer acct_1")
	req.Header.Set("Idempotency-Key", key)
	resp, err := c.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)
	assert.True(t, client.Replayed(resp), "the reconciler found the charge made before")
	require.NoError(t, stop())
	var p payments.Payment
	require.NoError(t, json.Unmarshal(body, &p))
	return p.Charge
}

// simulatorCharges is every charge in the simulated processor's ledger
// under dir, which no process may hold.
func simulatorCharges(t *testing.T, dir string) []payments.Charge {
	t.Helper()
	ledger, err := engine.Open(filepath.Join(dir, simulatorDir), nil)
	require.NoError(t, err)
	defer ledger.Close()
	return payments.NewProvider(payments.ProviderOptions{Ledger: ledger}).Charges(t.Context())
}

// With --store, serve needs --processor: processes sharing a store cannot
// share the simulation in one of them.
func TestServeRefusesAStoreWithoutAProcessor(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"serve", "--addr", "127.0.0.1:0", "--store", "postgres://app@127.0.0.1:1/pay"}, &out, &errOut)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut.String(), "--store needs --processor URL")
	assert.Contains(t, errOut.String(), "idemkv processor")
}

// With --store, serve needs a NATS server's URL for --events: each
// process's embedded broker would get a share of the shared outbox's
// events. Rates and timeouts out of range are usage errors too.
func TestServeRefusesFlagsThatCannotHold(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--store", "postgres://app@127.0.0.1:1/pay", "--processor", "http://127.0.0.1:1", "--events", "embedded"}, "--store needs --events nats://"},
		{[]string{"--provider-fail-rate", "NaN"}, "are fractions"},
		{[]string{"--processor-timeout", "0s"}, "--processor-timeout must be positive"},
	} {
		var out, errOut bytes.Buffer
		code := run(context.Background(), append([]string{"serve", "--addr", "127.0.0.1:0", "--data", t.TempDir()}, tc.args...), &out, &errOut)
		assert.Equal(t, exitUsage, code, "%v", tc.args)
		assert.Contains(t, errOut.String(), tc.want, "%v", tc.args)
	}
}
