package ledger_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/examples/ledger"
	"github.com/idemkv/idemkv/inbox"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/natsjs"
	"github.com/idemkv/idemkv/natsjs/natstest"
	"github.com/idemkv/idemkv/outbox"
	"github.com/idemkv/idemkv/ttl"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

// testTimeout bounds the broker calls and waits; it only turns a hang
// into a failure.
const testTimeout = 20 * time.Second

// store is a real engine in a temporary directory, with the retention
// class "inbox", that a test can restart.
type store struct {
	t   *testing.T
	dir string
	e   *engine.Engine
}

func openStore(t *testing.T) *store {
	s := &store{t: t, dir: t.TempDir()}
	s.open()
	t.Cleanup(func() { _ = s.e.Close() })
	return s
}

func (s *store) open() {
	e, err := engine.Open(s.dir, &engine.Options{
		Clock: fakeclock.New(t0), NoBackgroundSweep: true, CacheSize: 8 << 20, MemTableSize: 4 << 20,
		RetentionClasses: ttl.Classes{"inbox": 7 * 24 * time.Hour},
	})
	require.NoError(s.t, err)
	s.e = e
}

func (s *store) restart() {
	require.NoError(s.t, s.e.Close())
	s.open()
}

func (s *store) consumer() *inbox.Consumer {
	c, err := ledger.New(s.e, &inbox.Options{Retention: "inbox"})
	require.NoError(s.t, err)
	return c
}

func (s *store) balance(account, currency string) ledger.Balance {
	b, err := ledger.Read(s.t.Context(), s.e, account, currency)
	require.NoError(s.t, err)
	return b
}

// created is a payments.created payload as the payments example emits it.
func created(payment, account string, amount int64, currency string) []byte {
	b, _ := json.Marshal(map[string]any{
		"payment": payment, "account": account, "amount": amount, "currency": currency,
		"charge": "ch_" + payment, "created": t0,
	})
	return b
}

func TestHandle(t *testing.T) {
	s := openStore(t)
	c := s.consumer()
	ctx := context.Background()
	pos := uint64(0)
	process := func(subject string, data []byte) inbox.Outcome {
		pos++
		out, err := c.Process(ctx, inbox.Message{ID: fmt.Sprintf("ev-%d", pos), Position: pos, Subject: subject, Data: data}, ledger.Handle)
		require.NoError(t, err)
		return out
	}
	assert.True(t, process("payments.created", created("p1", "acct_1", 500, "USD")).Applied())
	assert.True(t, process("idemkv.payments.created", created("p2", "acct_1", 250, "USD")).Applied(), "a relay's prefix")
	assert.True(t, process("payments.created", created("p3", "acct_1", 100, "EUR")).Applied())
	assert.True(t, process("payments.refunded", created("p4", "acct_1", 999, "USD")).Applied(), "another subject: settled")

	for _, bad := range []struct{ data, reason string }{
		{`not json`, "is not a payments.created event"},
		{string(created("p5", "", 1, "USD")), "no account"},
		{string(created("p6", "acct_1", 0, "USD")), "amount 0 is not above 0"},
		{string(created("p7", "acct_1", -5, "USD")), "amount -5"},
		{string(created("p8", "acct_1", 5, "usd")), `currency "usd"`},
		{string(created("p9", strings.Repeat("a", 256), 5, "USD")), "invalid scope"},
		{`{"payment":"p10","account":"acct_1","amount":"5","currency":"USD"}`, "cannot unmarshal"},
	} {
		out := process("payments.created", []byte(bad.data))
		assert.True(t, out.Rejected, bad.data)
		assert.Contains(t, out.Reason, bad.reason)
	}
	assert.Equal(t, ledger.Balance{Total: 750, Count: 2}, s.balance("acct_1", "USD"))
	assert.Equal(t, ledger.Balance{Total: 100, Count: 1}, s.balance("acct_1", "EUR"))
	assert.Equal(t, ledger.Balance{}, s.balance("acct_2", "USD"))

	// A total that would overflow is rejected, and the balance kept.
	assert.True(t, process("payments.created", created("big", "acct_9", 1<<62, "USD")).Applied())
	out := process("payments.created", created("bigger", "acct_9", 1<<62, "USD"))
	assert.True(t, out.Rejected)
	assert.Contains(t, out.Reason, "would overflow")
	assert.Equal(t, ledger.Balance{Total: 1 << 62, Count: 1}, s.balance("acct_9", "USD"))
}

// TestExactlyOnceOverJetStream publishes payments.created events through
// the outbox publisher (with the relay's prefix) onto a real JetStream
// stream, runs the ledger, stops it after some events, restarts the
// store, republishes every event (the stream absorbs them) and stores
// late copies of some (as a republish after the duplicate window does),
// runs the ledger to the end, then delivers the whole stream once more
// through Process: each account's balance is exactly one application of
// each of its events.
func TestExactlyOnceOverJetStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	pub, err := natsjs.New(nc, &natsjs.Options{SubjectPrefix: "idemkv"})
	require.NoError(t, err)
	js := pub.JetStream()
	_, err = natsjs.EnsureStream(ctx, js, "IDEMKV", []string{"idemkv.>"}, 0)
	require.NoError(t, err)

	const n = 40
	want := map[string]ledger.Balance{}
	var events []idemkv.StoredEvent
	for i := 1; i <= n; i++ {
		acct := fmt.Sprintf("acct_%d", i%3)
		amount := int64(100 * i)
		events = append(events, idemkv.StoredEvent{
			Event:   idemkv.Event{Topic: ledger.Topic, Key: acct, Payload: created(fmt.Sprintf("pay_%d", i), acct, amount, "USD")},
			ID:      fmt.Sprintf("01J-event-%03d", i),
			Seq:     uint64(i),
			Created: t0.Add(time.Duration(i) * time.Second),
		})
		b := want[acct]
		b.Total += amount
		b.Count++
		want[acct] = b
	}
	for _, ev := range events {
		require.NoError(t, pub.Publish(ctx, ev))
	}

	// run runs the ledger until the consumer has settled position until.
	run := func(c *inbox.Consumer, until uint64) {
		t.Helper()
		rctx, stop := context.WithCancel(ctx)
		defer stop()
		var mu sync.Mutex
		opts := &natsjs.ConsumeOptions{Processed: func(m inbox.Message, out inbox.Outcome) {
			mu.Lock()
			defer mu.Unlock()
			assert.False(t, out.Rejected, "position %d", m.Position)
			if m.Position == until {
				stop()
			}
		}}
		err := natsjs.Consume(rctx, js, "IDEMKV", c, ledger.Handle, opts)
		require.ErrorIs(t, err, context.Canceled)
	}

	s := openStore(t)
	c := s.consumer()
	run(c, 17)
	pos, err := c.Position(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(17), pos)
	var count int64
	for acct := range want {
		count += s.balance(acct, "USD").Count
	}
	require.Equal(t, int64(17), count, "the ledger holds what the position covers")

	s.restart()
	c = s.consumer()
	for _, ev := range events {
		require.NoError(t, pub.Publish(ctx, ev)) // absorbed by the duplicate window
	}
	for _, i := range []int{3, 20, 39} { // copies stored again: positions 41-43
		h := nats.Header{}
		h.Set(outbox.HeaderEventID, events[i].ID)
		_, err := js.PublishMsg(ctx, &nats.Msg{Subject: "idemkv." + ledger.Topic, Header: h, Data: events[i].Payload})
		require.NoError(t, err)
	}
	run(c, n+3)

	for acct, b := range want {
		assert.Equal(t, b, s.balance(acct, "USD"), acct)
	}
	pos, err = c.Position(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(n+3), pos)

	// Every message of the stream, delivered once more: all duplicates.
	msgs, err := natsjs.ReadAll(ctx, js, "IDEMKV", 0)
	require.NoError(t, err)
	require.Len(t, msgs, n+3)
	for _, m := range msgs {
		out, err := c.Process(ctx, inbox.Message{ID: m.Header.Get(outbox.HeaderEventID), Position: m.Seq, Subject: m.Subject, Header: m.Header, Data: m.Data}, ledger.Handle)
		require.NoError(t, err)
		require.True(t, out.Duplicate, "position %d", m.Seq)
	}
	for acct, b := range want {
		assert.Equal(t, b, s.balance(acct, "USD"), acct)
	}
}
