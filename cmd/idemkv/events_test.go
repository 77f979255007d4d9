package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/examples/payments"
	"github.com/idemkv/idemkv/internal/logtest"
	"github.com/idemkv/idemkv/natsjs"
	"github.com/idemkv/idemkv/natsjs/natstest"
	"github.com/idemkv/idemkv/outbox"
	"github.com/idemkv/idemkv/reconcile"
)

// TestServeEventsToJetStream runs serve --events against a real JetStream
// server: every payment, and only a payment (never its retries), puts one
// payments.created message in the stream, with the event id as
// Nats-Msg-Id.
func TestServeEventsToJetStream(t *testing.T) {
	for _, sc := range storeCases {
		t.Run(sc.name, func(t *testing.T) { testServeEventsToJetStream(t, sc) })
	}
}

func testServeEventsToJetStream(t *testing.T, sc storeCase) {
	ns := natstest.Start(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var out logtest.Log
	done := make(chan error, 1)
	cfg := sc.config(t)
	cfg.events, cfg.reconcile = ns.URL(), reconcile.Options{Interval: time.Second, Grace: time.Second}
	go func() { done <- serve(ctx, ln, cfg, &out) }()
	url := "http://" + ln.Addr().String()

	c := client.New(nil, nil)
	pay := func(account, key string, amount int) string {
		req, _ := http.NewRequest("POST", url+"/v1/payments", strings.NewReader(fmt.Sprintf(`{"amount":%d,"currency":"USD","card":"tok_1"}`, amount)))
		req.Header.Set("Authorization", "Bearer "+account)
		req.Header.Set("Idempotency-Key", key)
		resp, err := c.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)
		var p payments.Payment
		require.NoError(t, json.Unmarshal(body, &p))
		return p.ID
	}
	ids := []string{pay("acct_1", "k1", 100), pay("acct_2", "k1", 200), pay("acct_1", "k2", 300)}
	require.Equal(t, ids[0], pay("acct_1", "k1", 100), "a retry replays")

	nc := ns.Connect(t)
	p, err := natsjs.New(nc, nil)
	require.NoError(t, err)
	var msgs []natsjs.Message
	require.Eventually(t, func() bool { // the relay publishes on its own goroutine
		msgs, err = natsjs.ReadAll(ctx, p.JetStream(), eventsStream, 1)
		return err == nil && len(msgs) >= 3
	}, 10*time.Second, 10*time.Millisecond)
	require.Len(t, msgs, 3, "one message per payment, none for the retry")
	for i, m := range msgs {
		var ev payments.CreatedEvent
		require.NoError(t, json.Unmarshal(m.Data, &ev))
		assert.Equal(t, ids[i], ev.Payment)
		assert.Equal(t, payments.TopicCreated, m.Subject)
		assert.Equal(t, m.Header.Get(outbox.HeaderEventID), m.Header.Get("Nats-Msg-Id"))
		assert.Equal(t, ev.Account, m.Header.Get(outbox.HeaderEntityKey))
	}
	assert.Equal(t, "2", msgs[2].Header.Get(outbox.HeaderEntitySeq), "acct_1's second payment")

	for start := time.Now(); outboxLag(t, url) != 0; { // the relay acks after the broker does
		require.Less(t, time.Since(start), 10*time.Second)
	}
	mresp, err := http.Get(url + "/metrics")
	require.NoError(t, err)
	metrics, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	assert.Contains(t, string(metrics), "idemkv_outbox_published_total 3\n")
	cancel()
	require.NoError(t, <-done)
	assert.Contains(t, out.String(), "publishing payments.created events to "+ns.URL())
	sc.check(t, cfg)
}

func TestServeRefusesABadEventsFlag(t *testing.T) {
	var out, errb strings.Builder
	assert.Equal(t, exitUsage, run(context.Background(), []string{"serve", "--events", "http://x"}, &out, &errb))
	assert.Contains(t, errb.String(), "nats://HOST:PORT")
}

// TestServeEventsEmbedded: --events embedded starts JetStream in the
// process, with its store under --data, and publishes to it.
func TestServeEventsEmbedded(t *testing.T) {
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	out := &logtest.Log{}
	done := make(chan error, 1)
	cfg := serveConfig{dir: dir, events: "embedded", reconcile: reconcile.Options{Interval: time.Second, Grace: time.Second}}
	go func() { done <- serve(ctx, ln, cfg, out) }()
	req, _ := http.NewRequest("POST", "http://"+ln.Addr().String()+"/v1/payments", strings.NewReader(`{"amount":100,"currency":"USD","card":"tok_1"}`))
	req.Header.Set("Authorization", "Bearer acct_1")
	req.Header.Set("Idempotency-Key", "k1")
	resp, err := client.New(nil, nil).Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)

	_, rest, ok := strings.Cut(out.String(), "publishing payments.created events to ")
	require.True(t, ok, out.String())
	natsURL, _, _ := strings.Cut(rest, " ")
	p, err := natsjs.Connect(natsURL, nil)
	require.NoError(t, err)
	defer p.Close()
	require.Eventually(t, func() bool {
		msgs, err := natsjs.ReadAll(ctx, p.JetStream(), eventsStream, 1)
		return err == nil && len(msgs) == 1
	}, 10*time.Second, 10*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
}
