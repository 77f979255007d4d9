package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
)

// TestPendingAndResolve: an operator lists what awaits reconciliation and
// what was escalated, settles one record as applied and one as no effect,
// and finds the notes on the record and in the audit log; bad flags
// change nothing.
func TestPendingAndResolve(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	e, err := engine.Open(dir, nil)
	require.NoError(t, err)
	id := func(k string) idemkv.ID { return idemkv.ID{Tenant: "acct_1", Endpoint: "POST /v1/payments", Key: k} }
	for _, k := range []string{"timed-out", "gave-up"} {
		c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id(k), Fingerprint: []byte{1}, Mode: idemkv.ModeRemote})
		require.NoError(t, err)
		require.NoError(t, e.MarkUncertain(ctx, c.Lease, "processor timed out"))
		if k == "gave-up" {
			require.NoError(t, e.Escalate(ctx, idemkv.EscalateRequest{ID: id(k), Token: c.Lease.Token, Note: "20 attempts"}))
		}
	}
	require.NoError(t, e.Close())

	cmd := func(args ...string) (int, string) {
		var out, errOut bytes.Buffer
		code := run(context.Background(), args, &out, &errOut)
		return code, out.String() + errOut.String()
	}
	code, out := cmd("pending", "--data", dir)
	require.Equal(t, exitOK, code, out)
	assert.Contains(t, out, `"timed-out"`)
	assert.NotContains(t, out, "gave-up")
	code, out = cmd("pending", "--data", dir, "--escalated", "--json")
	require.Equal(t, exitOK, code, out)
	var listed map[string]any
	require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(out)), &listed))
	assert.Equal(t, "gave-up", listed["key"])
	assert.Equal(t, "escalated", listed["state"])
	assert.Equal(t, "20 attempts", listed["note"])

	for _, bad := range [][]string{
		{"resolve", "--data", dir, "--tenant", "acct_1", "--endpoint", "POST /v1/payments", "--key", "gave-up", "--status", "201"}, // no note
		{"resolve", "--data", dir, "--tenant", "acct_1", "--endpoint", "POST /v1/payments", "--key", "gave-up", "--note", "x"},     // no outcome
		{"resolve", "--data", dir, "--tenant", "acct_1", "--endpoint", "POST /v1/payments", "--key", "gave-up", "--status", "201", "--no-effect", "--note", "x"},
		{"resolve", "--data", dir, "--tenant", "acct_1", "--endpoint", "POST /v1/payments", "--key", "gave-up", "--applied", "--no-effect", "--note", "x"},
		{"resolve", "--data", dir, "--tenant", "acct_1", "--endpoint", "POST /v1/payments", "--key", "gave-up", "--status", "42", "--note", "x"},
		{"resolve", "--data", dir, "--tenant", "acct_1", "--endpoint", "POST /v1/payments", "--key", "", "--no-effect", "--note", "x"},
	} {
		code, out := cmd(bad...)
		assert.Equal(t, exitUsage, code, "%v: %s", bad, out)
	}
	code, out = cmd("resolve", "--data", dir, "--tenant", "acct_1", "--endpoint", "POST /v1/payments", "--key", "gave-up",
		"--status", "201", "--pointer", "/v1/payments/pay_1", "--note", "ops (ana): charge ch_9 seen in the processor's dashboard", "--token", "1")
	require.NotEqual(t, exitOK, code, "a token that is not the record's")
	assert.Contains(t, out, "fenced")
	code, out = cmd("resolve", "--data", dir, "--tenant", "acct_1", "--endpoint", "POST /v1/payments", "--key", "gave-up",
		"--applied", "--status", "201", "--pointer", "/v1/payments/pay_1", "--note", "ops (ana): charge ch_9 seen in the processor's dashboard")
	require.Equal(t, exitOK, code, out)
	code, out = cmd("resolve", "--data", dir, "--tenant", "acct_1", "--endpoint", "POST /v1/payments", "--key", "timed-out",
		"--no-effect", "--note", "ops (ana): no charge at the processor")
	require.Equal(t, exitOK, code, out)

	e, err = engine.Open(dir, &engine.Options{ReadOnly: true})
	require.NoError(t, err)
	rec, err := e.Get(ctx, id("gave-up"))
	require.NoError(t, err)
	assert.Equal(t, idemkv.StateCompleted, rec.State)
	assert.Equal(t, "ops (ana): charge ch_9 seen in the processor's dashboard", rec.Note)
	_, err = e.Get(ctx, id("timed-out"))
	assert.ErrorIs(t, err, idemkv.ErrNotFound)
	require.NoError(t, e.Close())

	audit, err := os.ReadFile(filepath.Join(dir, "audit.log"))
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(audit)), "\n")
	require.Len(t, lines, 4, "each resolve begun, then done")
	assert.Contains(t, lines[3], `"phase":"done"`)
	assert.Contains(t, lines[3], `"note":"ops (ana): no charge at the processor"`)
	code, out = cmd("pending", "--data", dir)
	require.Equal(t, exitOK, code, out)
	assert.Equal(t, 1, strings.Count(out, "\n"), "only the header is left: %s", out)
	code, out = cmd("check", "--data", dir)
	assert.Equal(t, exitOK, code, out)
}

// TestResolveRaw: --raw stores the body as it is (a saga step's output),
// not as an HTTP response.
func TestResolveRaw(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	e, err := engine.Open(dir, nil)
	require.NoError(t, err)
	id := idemkv.ID{Tenant: "acct_1", Endpoint: "saga/order/do/authorize", Key: "ord_1"}
	c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: []byte{1}, Mode: idemkv.ModeRemote})
	require.NoError(t, err)
	require.NoError(t, e.MarkUncertain(ctx, c.Lease, "timeout"))
	require.NoError(t, e.Close())
	body := filepath.Join(t.TempDir(), "out")
	require.NoError(t, os.WriteFile(body, []byte("ch_42"), 0o600))
	var out, errOut bytes.Buffer
	code := run(ctx, []string{"resolve", "--data", dir, "--tenant", "acct_1", "--endpoint", "saga/order/do/authorize",
		"--key", "ord_1", "--applied", "--raw", "--body-file", body, "--note", "ops: seen at the processor"}, &out, &errOut)
	require.Equal(t, exitOK, code, "%s%s", out.String(), errOut.String())
	e, err = engine.Open(dir, &engine.Options{ReadOnly: true})
	require.NoError(t, err)
	defer e.Close()
	rec, err := e.Get(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, idemkv.Result{Status: 200, Body: []byte("ch_42")}, rec.Result)
}
