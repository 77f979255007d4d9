package main

import (
	"context"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv/examples/payments"
	"github.com/idemkv/idemkv/internal/tier"
	"github.com/idemkv/idemkv/natsjs"
	"github.com/idemkv/idemkv/natsjs/natstest"
	"github.com/idemkv/idemkv/outbox"
)

// eventsKillCyclesEnv sets TestServeEventsKillLoop's kill cycles (default
// 5); IDEMKV_KILL_SEED its seed, as for TestServeKillLoop.
const eventsKillCyclesEnv = "IDEMKV_EVENTS_KILL_CYCLES"

// TestServeEventsKillLoop is the kill loop of the outbox: "idemkv serve
// --events URL" as a child process, relaying payments.created events to a
// real JetStream server in this process (so the stream outlives every
// kill), under clients that retry every key, killed with SIGKILL at random
// moments, between a commit and its publish or between the broker's
// acknowledgement and the store's among them. At the end every payment
// has reached the stream (at least once, and exactly once after the
// stream's deduplication on the event id), no message names a payment
// that was not stored, and idemkv check finds the outbox sound after
// every kill and at the end.
func TestServeEventsKillLoop(t *testing.T) {
	tier.Require(t, "starts and kills processes for several seconds")
	cycles, seed := killKnobs(t, eventsKillCyclesEnv)
	rng := rand.New(rand.NewPCG(seed, 0x65766e74))
	ns := natstest.Start(t)
	flags := []string{"--events", ns.URL()}

	dir := t.TempDir()
	keys := 120 * cycles
	q := newKeyQueue(keys)
	hc := retryingClient()
	cut := killCycles(t, dir, q, hc, cycles, func() time.Duration {
		return time.Duration(5+rng.IntN(75)) * time.Millisecond // short: kills land amid publishing
	}, flags...)
	srv := recoverKeys(t, dir, q, hc, flags...)
	lost, doubled := countPayments(t, hc, srv.url, q, keys)

	// The relay drains what the kills left in the outbox.
	start := time.Now()
	for lag := -1; lag != 0; {
		require.Less(t, time.Since(start), time.Minute, "the outbox did not drain")
		lag = outboxLag(t, srv.url)
	}
	drained := time.Since(start)

	msgs := requireOneMessagePerPayment(t, ns, q, keys)

	require.NoError(t, srv.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, srv.cmd.Wait(), "graceful shutdown")
	requireCheckClean(t, dir, "at the end")
	t.Logf("%d kill cycles, %d requests, %d payments acknowledged, lost %d, doubled %d, %d requests cut off by a kill; "+
		"stream: %d messages for %d payments; the outbox drained %v after recovery",
		cycles, q.sent.Load(), len(q.acked), lost, doubled, cut, msgs, len(q.acked), drained.Round(time.Millisecond))
}

// requireOneMessagePerPayment reads the events stream of ns and requires
// one message for each payment q was acknowledged (keys of them), each
// event id once, and none for a payment never stored. It returns the
// number of messages.
func requireOneMessagePerPayment(t *testing.T, ns *natstest.Server, q *keyQueue, keys int) int {
	t.Helper()
	nc := ns.Connect(t)
	pub, err := natsjs.New(nc, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	msgs, err := natsjs.ReadAll(ctx, pub.JetStream(), eventsStream, 1)
	require.NoError(t, err)
	stored := map[string]bool{}
	for _, id := range q.acked {
		stored[id] = true
	}
	perPayment, perEvent := map[string]int{}, map[string]int{}
	for _, m := range msgs {
		var ev payments.CreatedEvent
		require.NoError(t, json.Unmarshal(m.Data, &ev))
		require.True(t, stored[ev.Payment], "message %d names payment %s, which was never stored", m.Seq, ev.Payment)
		perPayment[ev.Payment]++
		perEvent[m.Header.Get(outbox.HeaderEventID)]++
	}
	for id := range stored {
		require.Equal(t, 1, perPayment[id], "messages for payment %s", id)
	}
	require.Len(t, perEvent, len(msgs), "the stream holds each event id once")
	require.Len(t, msgs, keys)
	return len(msgs)
}

var lagLine = regexp.MustCompile(`(?m)^idemkv_outbox_lag_events (\d+)$`)

// outboxLag reads serve's idemkv_outbox_lag_events, waiting for the
// relay's next step: the metric is read from a scrape, not a sleep.
func outboxLag(t *testing.T, url string) int {
	resp, err := http.Get(url + "/metrics")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := lagLine.FindSubmatch(body)
	require.NotNil(t, m, "no idemkv_outbox_lag_events in /metrics")
	n, err := strconv.Atoi(string(m[1]))
	require.NoError(t, err)
	if n > 0 {
		<-time.After(20 * time.Millisecond) // scrape again shortly
	}
	return n
}
