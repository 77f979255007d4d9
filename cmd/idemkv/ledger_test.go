package main

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/examples/ledger"
	"github.com/idemkv/idemkv/examples/payments"
	"github.com/idemkv/idemkv/inbox"
	"github.com/idemkv/idemkv/natsjs"
	"github.com/idemkv/idemkv/natsjs/natstest"
	"github.com/idemkv/idemkv/outbox"
	"github.com/idemkv/idemkv/ttl"
)

// TestLedgerRefusesAReplacedStream: a ledger that has read two events of
// its stream is started after the stream was deleted and created again
// and has grown past its position (a broker restored without it). It
// refuses the new stream, applying none of it, and says what to do.
func TestLedgerRefusesAReplacedStream(t *testing.T) {
	ctx := context.Background()
	ns := natstest.Start(t)
	pub, err := natsjs.New(ns.Connect(t), nil)
	require.NoError(t, err)
	js := pub.JetStream()
	publish := func(ids ...string) {
		for _, id := range ids {
			body, _ := json.Marshal(payments.CreatedEvent{Payment: "pay_" + id, Account: "acct_a", Amount: 100, Currency: "USD"})
			m := nats.NewMsg(payments.TopicCreated)
			m.Data = body
			m.Header.Set(outbox.HeaderEventID, id)
			_, err := js.PublishMsg(ctx, m)
			require.NoError(t, err)
		}
	}
	_, err = natsjs.EnsureStream(ctx, js, eventsStream, []string{"payments.>"}, time.Second)
	require.NoError(t, err)
	publish("ev-1", "ev-2")

	dir := t.TempDir()
	e, err := engine.Open(dir, &engine.Options{RetentionClasses: ttl.Classes{ledgerClass: time.Hour}})
	require.NoError(t, err)
	c, err := ledger.New(e, &inbox.Options{Retention: ledgerClass})
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	err = natsjs.Consume(rctx, js, eventsStream, c, ledger.Handle, &natsjs.ConsumeOptions{
		Processed: func(m inbox.Message, _ inbox.Outcome) {
			if m.Position == 2 {
				cancel()
			}
		}})
	require.ErrorIs(t, err, context.Canceled)
	require.NoError(t, e.Close())

	require.NoError(t, js.DeleteStream(ctx, eventsStream))
	// The server may still be removing the old stream's files, and
	// refuse to create the new one until it is done.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		_, err := natsjs.EnsureStream(ctx, js, eventsStream, []string{"payments.>"}, time.Second)
		assert.NoError(c, err, "creating the stream again")
	}, 10*time.Second, 10*time.Millisecond)
	publish("ev-10", "ev-11", "ev-12", "ev-13")

	var out, errOut bytes.Buffer
	bounded, stop := context.WithTimeout(ctx, 30*time.Second) // a ledger that reads on runs until stopped
	defer stop()
	require.Equal(t, exitFail, run(bounded, []string{"ledger", "--events", ns.URL(), "--data", dir}, &out, &errOut), out.String())
	require.Contains(t, errOut.String(), "give --data a new directory")
	out.Reset()
	require.Equal(t, exitOK, run(ctx, []string{"ledger", "--data", dir, "--balances", "acct_a"}, &out, &errOut), errOut.String())
	var bal struct {
		Position uint64 `json:"position"`
		Balances map[string]struct {
			Total, Count int64
		} `json:"balances"`
	}
	require.NoError(t, json.Unmarshal(out.Bytes(), &bal), out.String())
	require.EqualValues(t, 2, bal.Position)
	require.EqualValues(t, 2, bal.Balances["acct_a"].Count, "only the old stream's two events: %s", out.String())
}
