package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/examples/payments"
	"github.com/idemkv/idemkv/reconcile"
	"github.com/stretchr/testify/require"
)

// TestServeOperatorCommands: on either store, an operator lists a
// running service's records by state and age, settles an uncertain
// payment (its retry then replays what was settled), evicts it (the
// next request runs anew), exports the store, and finds both writes in
// the audit log; a completed payment is evicted with its ledger entry
// kept, the store still checks clean, and its key runs anew. On the engine, the same commands then work on the closed
// store's directory.
func TestServeOperatorCommands(t *testing.T) {
	for _, sc := range storeCases {
		t.Run(sc.name, func(t *testing.T) { testServeOperatorCommands(t, sc) })
	}
}

func testServeOperatorCommands(t *testing.T, sc storeCase) {
	ctx := context.Background()
	cfg := sc.config(t)
	cfg.adminTokenFile = filepath.Join(t.TempDir(), "admin-token")
	require.NoError(t, os.WriteFile(cfg.adminTokenFile, []byte("operator-test-admin-token\n"), 0o600))
	audit := filepath.Join(cfg.dir, "audit.log")
	if cfg.store != "" {
		audit = filepath.Join(t.TempDir(), "audit.log")
		cfg.adminAuditLog = audit
	}
	aln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cfg.adminLn = aln
	// The first and the third charge time out; the reconciler waits:
	// the operator settles by hand.
	var calls atomic.Int32
	cfg.provider = payments.ProviderOptions{Fault: func(context.Context, string) error {
		if n := calls.Add(1); n == 1 || n == 3 {
			return payments.ErrProviderTimeout
		}
		return nil
	}}
	cfg.reconcile = reconcile.Options{Interval: time.Hour, Grace: time.Hour, MaxAttempts: 20, MaxAge: 24 * time.Hour}
	url, stop := startServeOn(t, cfg)
	server := []string{"--server", "http://" + aln.Addr().String(), "--token-file", cfg.adminTokenFile}
	cli := func(want int, args ...string) string {
		t.Helper()
		var out, errOut bytes.Buffer
		require.Equal(t, want, run(ctx, args, &out, &errOut), "%v: %s%s", args, out.String(), errOut.String())
		return out.String() + errOut.String()
	}
	id := []string{"--tenant", "acct_1", "--endpoint", "POST /v1/payments", "--key", "order-u"}

	status, _, body := payOnce(t, url, "order-u")
	require.NotEqual(t, http.StatusCreated, status, body)
	var page listPage
	require.NoError(t, json.Unmarshal([]byte(cli(exitOK, append([]string{"list", "--state", "uncertain", "--json"}, server...)...)), &page))
	require.Len(t, page.Records, 1)
	require.Equal(t, "order-u", page.Records[0].Key)
	require.Contains(t, cli(exitOK, append([]string{"list", "--older-than", "1h"}, server...)...), "AGE") // the header only
	require.Contains(t, cli(exitUsage, append([]string{"list", "--state", "done"}, server...)...), "state")

	out := cli(exitOK, append(append([]string{"resolve", "--applied", "--status", "201", "--pointer", "/v1/payments/pay_x",
		"--note", "ops: charge seen at the processor", "--json"}, id...), server...)...)
	require.Contains(t, out, `"was": "uncertain"`)
	status, replayed, _ := payOnce(t, url, "order-u")
	require.Equal(t, http.StatusCreated, status)
	require.Equal(t, "true", replayed)
	require.Contains(t, cli(exitFail, append(append([]string{"resolve", "--no-effect", "--note", "again"}, id...), server...)...), "409")
	out = cli(exitOK, append(append([]string{"inspect"}, id...), server...)...)
	require.Contains(t, out, "history")
	require.Contains(t, out, "ops: charge seen at the processor")

	require.Contains(t, cli(exitOK, append(append([]string{"evict", "--reason", "ops: undo test"}, id...), server...)...), "removed")
	require.Contains(t, cli(exitFail, append(append([]string{"evict", "--reason", "again"}, id...), server...)...), "404")
	require.Contains(t, cli(exitFail, append(append([]string{"inspect"}, id...), server...)...), "evict done (removed")
	// The evicted key runs anew under the same operation id, derived
	// from the request: it finds the payment the resolution wrote, and
	// charges nothing again.
	status, replayed, body = payOnce(t, url, "order-u")
	require.Empty(t, replayed, "an evicted key runs anew")
	require.Equal(t, http.StatusCreated, status, body)

	// A completed payment: its ledger entry stays when it is evicted,
	// and the store checks clean.
	status, _, body = payOnce(t, url, "order-ok")
	require.Equal(t, http.StatusCreated, status, body)
	idOK := []string{"--tenant", "acct_1", "--endpoint", "POST /v1/payments", "--key", "order-ok"}
	require.NoError(t, json.Unmarshal([]byte(cli(exitOK, append([]string{"list", "--state", "completed", "--json"}, server...)...)), &page))
	require.Len(t, page.Records, 2)
	out = cli(exitOK, append(append([]string{"evict", "--reason", "ops: refund issued, customer retries", "--json"}, idOK...), server...)...)
	require.Contains(t, out, `"was": "completed"`)
	require.Contains(t, cli(exitOK, append([]string{"check"}, server...)...), "every invariant holds")
	status, _, body = payOnce(t, url, "order-ok")
	require.Equal(t, http.StatusCreated, status, "the evicted payment's key runs anew: %s", body)
	status, _, body = payOnce(t, url, "order-late") // left uncertain, for the closed store below
	require.Equal(t, http.StatusGatewayTimeout, status, body)
	idLate := []string{"--tenant", "acct_1", "--endpoint", "POST /v1/payments", "--key", "order-late"}

	file := filepath.Join(t.TempDir(), "export.jsonl")
	require.Contains(t, cli(exitOK, append([]string{"export", "--out", file}, server...)...), "exported 3 records")
	lines := readLines(t, file)
	require.Len(t, lines, 3)
	keys := map[any]map[string]any{}
	for _, l := range lines {
		require.Equal(t, "record", l["kind"])
		require.NotEmpty(t, l["fingerprint"])
		keys[l["key"]] = l
	}
	require.Equal(t, "completed", keys["order-u"]["state"])
	require.Equal(t, "uncertain", keys["order-late"]["state"])
	require.NotEmpty(t, keys["order-ok"]["body"], "a completed record's stored response")
	require.Contains(t, cli(exitFail, append([]string{"export", "--out", file}, server...)...), "exists")

	var done []map[string]any
	for _, e := range readLines(t, audit) {
		if e["phase"] == "done" {
			done = append(done, e)
		}
	}
	require.Len(t, done, 3)
	require.Equal(t, "resolve", done[0]["action"])
	require.Equal(t, "evict", done[1]["action"])
	require.Equal(t, "ops: undo test", done[1]["note"])
	require.Equal(t, "completed", done[2]["was"])
	backup := filepath.Join(t.TempDir(), "backup")
	if cfg.store == "" {
		// An online backup holds the audit log as of its copy of the
		// store.
		cli(exitOK, append([]string{"backup", "--to", backup}, server...)...)
		require.Equal(t, readLines(t, audit), readLines(t, filepath.Join(backup, "audit.log")))
	}
	require.NoError(t, stop())
	sc.check(t, cfg)
	if cfg.store != "" {
		return
	}
	restored := filepath.Join(t.TempDir(), "restored")
	cli(exitOK, "restore", "--from", backup, "--data", restored)
	fi, err := os.Stat(filepath.Join(restored, "audit.log"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "the restored audit log is its owner's only, as the service's")
	require.Contains(t, cli(exitOK, append(append([]string{"inspect"}, id...), "--data", restored)...), "ops: charge seen at the processor",
		"the restored store keeps its history")

	data := []string{"--data", cfg.dir}
	require.Contains(t, cli(exitOK, append([]string{"list"}, data...)...), "order-late")
	require.Contains(t, cli(exitOK, append([]string{"export"}, data...)...), `"kind":"record"`)
	require.Contains(t, cli(exitOK, append(append([]string{"resolve", "--no-effect", "--note", "ops: never charged"}, idLate...), data...)...), "removed")
	last := readLines(t, audit)
	require.Equal(t, "resolve", last[len(last)-1]["action"])
	require.Equal(t, "done", last[len(last)-1]["phase"])
	require.Contains(t, cli(exitFail, append(append([]string{"evict", "--reason", "gone"}, idLate...), data...)...), "not found")
	require.Contains(t, cli(exitFail, append(append([]string{"inspect"}, idLate...), data...)...), "ops: never charged")
}

// readLines reads a file of JSON lines.
func readLines(t *testing.T, path string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m), "%s", sc.Text())
		out = append(out, m)
	}
	require.NoError(t, sc.Err())
	return out
}

// TestDataCommandOnAHeldStore: an operator's command given --data of a
// store another process holds says so, and how to reach it, rather than
// the lock's errno.
func TestDataCommandOnAHeldStore(t *testing.T) {
	dir := t.TempDir()
	e, err := engine.Open(dir, &engine.Options{NoBackgroundSweep: true})
	require.NoError(t, err)
	defer e.Close()
	var out, errOut strings.Builder
	require.Equal(t, exitFail, run(context.Background(), []string{"list", "--data", dir}, &out, &errOut))
	require.Contains(t, errOut.String(), "open in another process")
	require.Contains(t, errOut.String(), "--server URL")
}
