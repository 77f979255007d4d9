package main

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/logtest"
)

// TestServeLogsStateChangesAsJSON: serve logs, as JSON, one record per
// state change of a payment's key, naming it by hash and by the
// caller's request id, and never by the key.
func TestServeLogsStateChangesAsJSON(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var logs, out logtest.Log
	c := serveConfig{dir: t.TempDir(), log: logFlags{format: "json", out: &logs}}
	done := make(chan error, 1)
	go func() { done <- serve(ctx, ln, c, &out) }()

	const key = "order-jane.doe@example.com"
	for range 2 {
		req, err := http.NewRequest("POST", "http://"+ln.Addr().String()+"/v1/payments",
			strings.NewReader(`{"amount":5000,"currency":"USD","card":"tok_123"}`))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer acct_1")
		req.Header.Set("Idempotency-Key", `"`+key+`"`)
		req.Header.Set("X-Request-Id", "req-42")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusCreated, resp.StatusCode)
	}
	cancel()
	require.NoError(t, <-done) // the server has stopped: every record is written

	hash := idemkv.ID{Tenant: "acct_1", Endpoint: "POST /v1/payments", Key: key}.Hash()
	var msgs []string
	for _, rec := range logs.Records(t) { // a JSON object a line
		if rec["key_hash"] == hash {
			assert.Equal(t, "req-42", rec["request_id"])
			msgs = append(msgs, rec["msg"].(string))
		}
	}
	assert.Equal(t, []string{"httpidem: key claimed", "httpidem: outcome stored"}, msgs, "the replay is Debug: not at the default level")
	assert.NotContains(t, logs.String(), "jane.doe")
}

func TestServeRejectsABadLogFormat(t *testing.T) {
	var out, errOut bytes.Buffer
	assert.Equal(t, exitUsage, run(context.Background(), []string{"serve", "--log-format", "xml"}, &out, &errOut))
	assert.Equal(t, exitUsage, run(context.Background(), []string{"serve", "--log-level", "loud"}, &out, &errOut))
}
