package natsjs_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/inbox"
	"github.com/idemkv/idemkv/internal/logtest"
	"github.com/idemkv/idemkv/natsjs"
	"github.com/idemkv/idemkv/natsjs/natstest"
	"github.com/idemkv/idemkv/outbox"
	"github.com/idemkv/idemkv/ttl"
)

// The tests of Consume: an inbox consumer on a real store (the engine, in
// a temporary directory) fed by a real JetStream server (natstest), with
// events published as the outbox relay publishes them.

// consumeTimeout bounds each Consume test's broker calls and waits. It
// only turns a hang into a failure; nothing waits for it to pass.
const consumeTimeout = 20 * time.Second

const paymentsStream = "PAYMENTS"

// t0 anchors the events' times: event i was created i seconds after it.
var t0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

// broker is a real JetStream server with the stream PAYMENTS capturing
// "payments.>", and an outbox Publisher on it.
type broker struct {
	t   *testing.T
	ctx context.Context
	js  jetstream.JetStream
	pub *natsjs.Publisher
}

func newBroker(t *testing.T) *broker {
	ctx, cancel := context.WithTimeout(context.Background(), consumeTimeout)
	t.Cleanup(cancel)
	srv := natstest.Start(t)
	p, err := natsjs.New(srv.Connect(t), nil)
	require.NoError(t, err)
	_, err = natsjs.EnsureStream(ctx, p.JetStream(), paymentsStream, []string{"payments.>"}, 0)
	require.NoError(t, err)
	return &broker{t: t, ctx: ctx, js: p.JetStream(), pub: p}
}

// payment is the stored event i of the test outbox: a credit of i to
// acct_1 or acct_2.
func payment(i int) idemkv.StoredEvent {
	return idemkv.StoredEvent{
		Event: idemkv.Event{
			Topic:   "payments.created",
			Key:     account(i),
			Payload: payload(account(i), int64(i)),
		},
		ID:        fmt.Sprintf("ev-%d", i),
		Seq:       uint64(i),
		EntitySeq: uint64(i+1) / 2,
		Created:   t0.Add(time.Duration(i) * time.Second),
	}
}

func account(i int) string { return "acct_" + strconv.Itoa(1+i%2) }

// publish publishes events through the outbox publisher, as the relay
// does: with Nats-Msg-Id, so that the stream absorbs a republish within
// its duplicate window.
func (b *broker) publish(events ...idemkv.StoredEvent) {
	for _, ev := range events {
		require.NoError(b.t, b.pub.Publish(b.ctx, ev))
	}
}

// publishCopy stores another copy of ev in the stream: what a relay's
// republish after the duplicate window does (the stream no longer knows
// the id, so it stores the message again).
func (b *broker) publishCopy(ev idemkv.StoredEvent) {
	h := nats.Header{}
	h.Set(outbox.HeaderEventID, ev.ID)
	_, err := b.js.PublishMsg(b.ctx, &nats.Msg{Subject: ev.Topic, Header: h, Data: ev.Payload})
	require.NoError(b.t, err)
}

// publishRaw publishes data with no id at all.
func (b *broker) publishRaw(data []byte) {
	_, err := b.js.Publish(b.ctx, "payments.created", data)
	require.NoError(b.t, err)
}

func (b *broker) lastSeq() uint64 {
	s, err := b.js.Stream(b.ctx, paymentsStream)
	require.NoError(b.t, err)
	info, err := s.Info(b.ctx)
	require.NoError(b.t, err)
	return info.State.LastSeq
}

// driver is one Consume in a goroutine, with the outcomes it
// reported.
type driver struct {
	cancel context.CancelFunc
	done   chan error

	mu       sync.Mutex
	outcomes map[uint64]inbox.Outcome // by position
	reached  chan struct{}            // closed once the position is reached
	until    uint64
}

// run starts Consume on a context of parent (b.ctx, or one of its
// own); it stops by itself (ctx cancelled) once it has settled the
// message at position until (if not 0).
func (b *broker) run(parent context.Context, c *inbox.Consumer, h inbox.Handler, until uint64, opts *natsjs.ConsumeOptions) *driver {
	ctx, cancel := context.WithCancel(parent)
	d := &driver{cancel: cancel, done: make(chan error, 1), outcomes: map[uint64]inbox.Outcome{}, reached: make(chan struct{}), until: until}
	var o natsjs.ConsumeOptions
	if opts != nil {
		o = *opts
	}
	o.Processed = func(m inbox.Message, out inbox.Outcome) {
		d.mu.Lock()
		defer d.mu.Unlock()
		d.outcomes[m.Position] = out
		if m.Position == d.until {
			close(d.reached)
			cancel()
		}
	}
	go func() { d.done <- natsjs.Consume(ctx, b.js, paymentsStream, c, h, &o) }()
	return d
}

// wait waits for the driver to stop, and requires that it stopped for
// its context.
func (d *driver) wait(t *testing.T) {
	t.Helper()
	d.stopsWith(t, context.Canceled)
}

// stopsWith waits for the driver to stop, and requires that Consume
// returned want.
func (d *driver) stopsWith(t *testing.T, want error) {
	t.Helper()
	select {
	case err := <-d.done:
		require.ErrorIs(t, err, want)
	case <-time.After(consumeTimeout):
		d.cancel()
		t.Fatalf("the driver did not stop with %v", want)
	}
}

// recreate deletes the stream and creates it again, empty: its messages
// are numbered from 1 again. The server may still be removing the old
// stream's files when the delete returns, and then refuses to create
// the new one (err_code 10049) until it is done: the creation is retried.
func (b *broker) recreate() {
	require.NoError(b.t, b.js.DeleteStream(b.ctx, paymentsStream))
	require.EventuallyWithT(b.t, func(c *assert.CollectT) {
		_, err := natsjs.EnsureStream(b.ctx, b.js, paymentsStream, []string{"payments.>"}, 0)
		assert.NoError(c, err, "creating the stream again")
	}, consumeTimeout, 10*time.Millisecond)
}

// requireReplaced waits for the driver to stop, and requires that
// Consume refused the stream as replaced.
func (d *driver) requireReplaced(t *testing.T) {
	t.Helper()
	d.stopsWith(t, natsjs.ErrStreamReplaced)
}

func (d *driver) outcome(pos uint64) inbox.Outcome {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.outcomes[pos]
}

// ledger is what the book must hold after applying each of events once.
func (v *env) requireLedger(events []idemkv.StoredEvent) {
	v.t.Helper()
	total, count := map[string]int64{}, map[string]int{}
	for _, ev := range events {
		total[ev.Key] += int64(ev.Seq)
		count[ev.Key]++
	}
	for acct := range total {
		require.Equal(v.t, strconv.FormatInt(total[acct], 10), v.data("total/"+acct), acct)
		require.Equal(v.t, strconv.Itoa(count[acct]), v.data("count/"+acct), acct)
	}
}

// TestConsumeStopsAndResumes publishes events, runs the driver,
// stops it midway (its context cancelled from inside a handler, mid
// commit), restarts the store and a new consumer, republishes every
// event and stores late copies of some, and checks that each event was
// applied exactly once and that the position covers the whole stream.
func TestConsumeStopsAndResumes(t *testing.T) {
	v, br := newEnv(t), newBroker(t)
	var events []idemkv.StoredEvent
	for i := 1; i <= 10; i++ {
		events = append(events, payment(i))
	}
	br.publish(events...)

	b := &book{}
	c := v.consumer()
	runCtx, stop := context.WithCancel(br.ctx)
	defer stop()
	h := func(ctx context.Context, fx idemkv.Effects, m inbox.Message) error {
		if m.ID == "ev-6" {
			stop() // the process is told to stop while it applies ev-6
		}
		return b.handle(ctx, fx, m)
	}
	d := br.run(runCtx, c, h, 0, nil)
	d.wait(t)

	// ev-6's commit may or may not have happened; the position and the
	// ledger agree either way.
	pos := v.position(c)
	t.Logf("stopped at position %d", pos)
	require.Contains(t, []uint64{5, 6}, pos)
	v.requireLedger(events[:pos])

	// A crash: the store is reopened, the consumer made anew.
	v.reopen()
	c = v.consumer()
	require.Equal(t, pos, v.position(c), "the position survives the restart")

	br.publish(events...) // the relay republishes everything: absorbed by the stream
	require.Equal(t, uint64(10), br.lastSeq())
	br.publishCopy(events[2]) // 11: a copy stored again, after the window
	br.publishCopy(events[8]) // 12
	events = append(events, payment(11), payment(12))
	br.publish(events[10:]...)                                  // 13, 14
	br.publishRaw(payload("acct_3", 1000))                      // 15: no id
	br.publishRaw([]byte(`{"amount":1000,"account":"acct_3"}`)) // 16: the same event, spelled otherwise
	require.Equal(t, uint64(16), br.lastSeq())

	d = br.run(br.ctx, c, b.handle, 16, nil)
	d.wait(t)
	assert.Equal(t, uint64(16), v.position(c))
	v.requireLedger(events)
	assert.Equal(t, "1000", v.data("total/acct_3"))
	assert.Equal(t, "1", v.data("count/acct_3"))
	for _, pos := range []uint64{11, 12, 16} {
		assert.True(t, d.outcome(pos).Duplicate, "position %d", pos)
	}
	assert.True(t, d.outcome(15).Applied())
	// The handler ran for ev-1 to ev-6 in the first run, then for every
	// event not applied yet and the first copy of the id-less one.
	assert.Equal(t, 6+(10-int(pos))+2+1, b.n(), "one run per event applied (and ev-6's stopped commit)")

	// A third run has nothing to do: it reads from 17.
	d = br.run(br.ctx, c, b.handle, 0, nil)
	d.cancel()
	d.wait(t)
	v.requireLedger(events)
}

// TestConsumeRetriesFromPosition: a handler that fails stops the
// driver from going past its message: it backs off and reads again from
// the committed position, so the message is applied before any after it.
// A poison event is rejected and skipped.
func TestConsumeRetriesFromPosition(t *testing.T) {
	v, br := newEnv(t), newBroker(t)
	var events []idemkv.StoredEvent
	for i := 1; i <= 6; i++ {
		events = append(events, payment(i))
	}
	poison := payment(4)
	poison.Payload = []byte(`{"account":"acct_1","amount":"lots"}`)
	events[3] = poison
	br.publish(events...)

	b := &book{}
	var seen []string
	failed := false
	h := func(ctx context.Context, fx idemkv.Effects, m inbox.Message) error {
		seen = append(seen, m.ID)
		if m.ID == "ev-3" && !failed {
			failed = true
			return fmt.Errorf("ledger: a dependency is down")
		}
		return b.handle(ctx, fx, m)
	}
	var waits []time.Duration
	now := make(chan time.Time, 1)
	after := func(d time.Duration) <-chan time.Time {
		waits = append(waits, d)
		now <- t0
		return now
	}
	d := br.run(br.ctx, v.consumer(), h, 6, &natsjs.ConsumeOptions{After: after, MinBackoff: time.Second})
	d.wait(t)

	assert.Equal(t, []string{"ev-1", "ev-2", "ev-3", "ev-3", "ev-4", "ev-5", "ev-6"}, seen)
	assert.Equal(t, []time.Duration{time.Second}, waits)
	out := d.outcome(4)
	assert.True(t, out.Rejected)
	assert.Contains(t, out.Reason, "not a credit")
	v.requireLedger([]idemkv.StoredEvent{events[0], events[1], events[2], events[4], events[5]})
	assert.Equal(t, uint64(6), v.position(v.consumer()))
}

func TestConsumeInvalid(t *testing.T) {
	v := newEnv(t)
	c := v.consumer()
	ctx := context.Background()
	err := natsjs.Consume(ctx, nil, paymentsStream, c, (&book{}).handle, nil)
	require.ErrorIs(t, err, idemkv.ErrInvalidArgument)
	br := newBroker(t)
	err = natsjs.Consume(ctx, br.js, paymentsStream, c, (&book{}).handle, &natsjs.ConsumeOptions{MinBackoff: -1})
	require.ErrorIs(t, err, idemkv.ErrInvalidArgument)
}

func TestInboxMessage(t *testing.T) {
	br := newBroker(t)
	br.publish(payment(1))
	_, err := br.js.PublishMsg(br.ctx, &nats.Msg{Subject: "payments.created", Data: []byte("x")}, jetstream.WithMsgID("producer-7"))
	require.NoError(t, err)
	br.publishRaw([]byte("y"))

	cons, err := br.js.OrderedConsumer(br.ctx, paymentsStream, jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	batch, err := cons.FetchNoWait(3)
	require.NoError(t, err)
	var got []inbox.Message
	for m := range batch.Messages() {
		msg, err := natsjs.InboxMessage(m)
		require.NoError(t, err)
		got = append(got, msg)
	}
	require.NoError(t, batch.Error())
	require.Len(t, got, 3)
	assert.Equal(t, "ev-1", got[0].ID, "the outbox's event id")
	assert.Equal(t, uint64(1), got[0].Position)
	assert.Equal(t, "payments.created", got[0].Subject)
	assert.Equal(t, "1", nats.Header(got[0].Header).Get(outbox.HeaderOutboxSeq))
	assert.Equal(t, string(payment(1).Payload), string(got[0].Data))
	assert.Equal(t, "producer-7", got[1].ID, "else the producer's Nats-Msg-Id")
	assert.Equal(t, "", got[2].ID, "else none")
	assert.Equal(t, uint64(3), got[2].Position)
}

// TestConsumeLogs: Consume logs a failed message to the consumer's
// Logger, by position and key hash, never by the event's id.
func TestConsumeLogs(t *testing.T) {
	v, br := newEnv(t), newBroker(t)
	events := []idemkv.StoredEvent{payment(1), payment(2)}
	br.publish(events...)
	logs, logger := logtest.New(slog.LevelInfo)
	c, err := inbox.New("ledger", v.e, &inbox.Options{Retention: "inbox", Logger: logger})
	require.NoError(t, err)
	b := &book{}
	failed := false
	h := func(ctx context.Context, fx idemkv.Effects, m inbox.Message) error {
		if m.Position == 2 && !failed {
			failed = true
			return errors.New("ledger: a dependency is down")
		}
		return b.handle(ctx, fx, m)
	}
	now := make(chan time.Time, 1)
	after := func(time.Duration) <-chan time.Time { now <- t0; return now }
	d := br.run(br.ctx, c, h, 2, &natsjs.ConsumeOptions{After: after})
	d.wait(t)

	var got []string
	var failure map[string]any
	for _, m := range logs.Records(t) {
		got = append(got, fmt.Sprint(m["msg"]))
		if m["msg"] == "inbox: reading the stream failed; retrying" {
			failure = m
		}
	}
	assert.Equal(t, []string{
		"inbox: event applied",
		"inbox: handler failed; the message is to be redelivered",
		"inbox: reading the stream failed; retrying",
		"inbox: event applied",
		"inbox: reading the stream again",
	}, got)
	require.NotNil(t, failure)
	assert.Equal(t, "inbox", failure["tenant"])
	assert.Equal(t, "ledger", failure["endpoint"])
	assert.Equal(t, paymentsStream, failure["stream"])
	assert.EqualValues(t, 1, failure["failures"])
	assert.Contains(t, failure["err"], "message 2 of stream")
	assert.Contains(t, failure["err"], "key_hash ")
	assert.NotContains(t, failure["err"], events[1].ID, "the event's id is not logged")
}

// TestConsumeLogsRecovery: after a failure, the first message settled
// logs that Consume reads the stream again, with the failures before it,
// as soon as it is settled, not at the next failure.
func TestConsumeLogsRecovery(t *testing.T) {
	v, br := newEnv(t), newBroker(t)
	br.publish(payment(1), payment(2), payment(3))
	logs, logger := logtest.New(slog.LevelInfo)
	c, err := inbox.New("ledger", v.e, &inbox.Options{Retention: "inbox", Logger: logger})
	require.NoError(t, err)
	b := &book{}
	failed := map[uint64]bool{}
	h := func(ctx context.Context, fx idemkv.Effects, m inbox.Message) error {
		if m.Position >= 2 && !failed[m.Position] {
			failed[m.Position] = true
			return errors.New("ledger: a dependency is down")
		}
		return b.handle(ctx, fx, m)
	}
	now := make(chan time.Time, 1)
	after := func(time.Duration) <-chan time.Time { now <- t0; return now }
	d := br.run(br.ctx, c, h, 3, &natsjs.ConsumeOptions{After: after})
	d.wait(t)

	var got []string
	var again map[string]any
	for _, m := range logs.Records(t) {
		got = append(got, fmt.Sprint(m["level"], " ", m["msg"], " ", m["failures"]))
		if m["msg"] == "inbox: reading the stream again" {
			again = m
		}
	}
	assert.Equal(t, []string{
		"INFO inbox: event applied <nil>",
		"WARN inbox: handler failed; the message is to be redelivered <nil>",
		"WARN inbox: reading the stream failed; retrying 1",
		"INFO inbox: event applied <nil>",
		"INFO inbox: reading the stream again 1",
		"WARN inbox: handler failed; the message is to be redelivered <nil>",
		"WARN inbox: reading the stream failed; retrying 1",
		"INFO inbox: event applied <nil>",
		"INFO inbox: reading the stream again 1",
	}, got)
	require.NotNil(t, again)
	assert.Equal(t, "inbox", again["tenant"])
	assert.Equal(t, "ledger", again["endpoint"])
	assert.Equal(t, paymentsStream, again["stream"])
}

// env is a real store, the engine in a temporary directory, with the
// retention class "inbox" for the consumers' dedup marks.
type env struct {
	t   *testing.T
	dir string
	e   *engine.Engine
}

func newEnv(t *testing.T) *env {
	v := &env{t: t, dir: t.TempDir()}
	v.open()
	t.Cleanup(func() { _ = v.e.Close() })
	return v
}

func (v *env) open() {
	e, err := engine.Open(v.dir, &engine.Options{
		RetentionClasses:  ttl.Classes{"inbox": 7 * 24 * time.Hour},
		NoBackgroundSweep: true,
		CacheSize:         8 << 20,
		MemTableSize:      4 << 20,
	})
	require.NoError(v.t, err)
	v.e = e
}

// reopen closes the store and opens it again, as a restart does.
func (v *env) reopen() {
	require.NoError(v.t, v.e.Close())
	v.open()
}

func (v *env) consumer() *inbox.Consumer {
	c, err := inbox.New("ledger", v.e, &inbox.Options{Retention: "inbox"})
	require.NoError(v.t, err)
	return c
}

func (v *env) position(c *inbox.Consumer) uint64 {
	p, err := c.Position(context.Background())
	require.NoError(v.t, err)
	return p
}

// data returns a business value, or "" if it is absent.
func (v *env) data(key string) string {
	b, err := v.e.GetData(context.Background(), []byte(key))
	if errors.Is(err, idemkv.ErrNotFound) {
		return ""
	}
	require.NoError(v.t, err)
	return string(b)
}

// credit is the payload the tests' handler applies.
type credit struct {
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

func payload(account string, amount int64) []byte {
	b, _ := json.Marshal(credit{Account: account, Amount: amount})
	return b
}

// book is the tests' handler: it adds each credit to its account's total
// and count ("total/<account>", "count/<account>", decimal), reading them
// through the commit, and counts its runs. A payload that is not a
// credit is rejected.
type book struct {
	mu   sync.Mutex
	runs int
}

func (b *book) handle(_ context.Context, fx idemkv.Effects, m inbox.Message) error {
	b.mu.Lock()
	b.runs++
	b.mu.Unlock()
	var c credit
	if err := json.Unmarshal(m.Data, &c); err != nil {
		return inbox.Reject(fmt.Errorf("not a credit: %w", err))
	}
	if c.Account == "" || c.Amount <= 0 {
		return inbox.Reject(errors.New("credit without an account or a positive amount"))
	}
	if err := add(fx, "total/"+c.Account, c.Amount); err != nil {
		return err
	}
	return add(fx, "count/"+c.Account, 1)
}

func (b *book) n() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.runs
}

func add(fx idemkv.Effects, key string, n int64) error {
	cur := int64(0)
	v, err := fx.Get([]byte(key))
	switch {
	case errors.Is(err, idemkv.ErrNotFound):
	case err != nil:
		return err
	default:
		if cur, err = strconv.ParseInt(string(v), 10, 64); err != nil {
			return err
		}
	}
	return fx.Set([]byte(key), strconv.AppendInt(nil, cur+n, 10))
}

// TestConsumeReturnsWhatNoRetryPasses: a retention class the store lacks
// fails every Process; Consume returns that error at once instead of
// reading the stream again and again.
func TestConsumeReturnsWhatNoRetryPasses(t *testing.T) {
	v, br := newEnv(t), newBroker(t)
	br.publish(payment(1))
	c, err := inbox.New("ledger", v.e, &inbox.Options{Retention: "no-such-class"})
	require.NoError(t, err)
	b := &book{}
	retries := 0
	after := func(time.Duration) <-chan time.Time {
		retries++
		ch := make(chan time.Time, 1)
		ch <- t0
		return ch
	}
	d := br.run(br.ctx, c, b.handle, 0, &natsjs.ConsumeOptions{After: after})
	select {
	case err := <-d.done:
		require.ErrorIs(t, err, idemkv.ErrInvalidArgument)
	case <-time.After(consumeTimeout):
		d.cancel()
		t.Fatal("Consume kept retrying")
	}
	require.Zero(t, retries)
}

// TestConsumeRefusesAStreamBehindItsPosition: a consumer that has read
// through position 3 is given a stream that ends before it (recreated,
// or a broker restored without it): Consume returns ErrStreamReplaced
// rather than wait for new messages to number past 3 and skip the
// first of them.
func TestConsumeRefusesAStreamBehindItsPosition(t *testing.T) {
	v, br := newEnv(t), newBroker(t)
	br.publish(payment(1), payment(2), payment(3))
	c, err := inbox.New("ledger", v.e, &inbox.Options{Retention: "inbox"})
	require.NoError(t, err)
	b := &book{}
	br.run(br.ctx, c, b.handle, 3, nil).wait(t)

	br.recreate()
	br.publish(payment(4))
	d := br.run(br.ctx, c, b.handle, 0, nil)
	d.requireReplaced(t)
}

// TestConsumeRefusesAStreamReplacedPastItsPosition: a consumer that has
// read through position 3 is stopped, and its stream is deleted and
// created again and grows past 3 before the consumer starts again (a
// broker restored without the stream, whose producer publishes on).
// Nothing in the new stream's numbers tells it apart: Consume refuses it
// by the stream recorded with the position, having settled none of its
// messages, rather than read on from 4 and skip its first three.
func TestConsumeRefusesAStreamReplacedPastItsPosition(t *testing.T) {
	v, br := newEnv(t), newBroker(t)
	br.publish(payment(1), payment(2), payment(3))
	c, err := inbox.New("ledger", v.e, &inbox.Options{Retention: "inbox"})
	require.NoError(t, err)
	b := &book{}
	br.run(br.ctx, c, b.handle, 3, nil).wait(t)
	src, err := c.Source(br.ctx)
	require.NoError(t, err)
	require.Contains(t, src, paymentsStream+"@", "the stream is recorded with the position")

	br.recreate()
	br.publish(payment(11), payment(12), payment(13), payment(14), payment(15))
	runs := b.n()
	d := br.run(br.ctx, c, b.handle, 0, nil)
	d.requireReplaced(t)
	pos, err := c.Position(br.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 3, pos)
	require.Equal(t, runs, b.n(), "no handler ran on the new stream")
	v.requireLedger([]idemkv.StoredEvent{payment(1), payment(2), payment(3)})

	// Its position reset to 0, the consumer reads the new stream from
	// its start.
	require.NoError(t, v.e.Update(br.ctx, func(fx idemkv.Effects) error { return fx.Set(c.PositionKey(), []byte("0")) }))
	br.run(br.ctx, c, b.handle, 5, nil).wait(t)
	v.requireLedger([]idemkv.StoredEvent{payment(1), payment(2), payment(3), payment(11), payment(12), payment(13), payment(14), payment(15)})
	now, err := c.Source(br.ctx)
	require.NoError(t, err)
	require.NotEqual(t, src, now, "the new stream is recorded")
}

// TestConsumeRefusesAStreamReplacedWhileItReads: the stream is deleted
// and created again while Consume reads it, and the new stream's messages
// are numbered from 1: the ordered consumer would go on from the next
// sequence and skip the new stream's first ones. Consume returns
// ErrStreamReplaced instead, having settled none of them.
func TestConsumeRefusesAStreamReplacedWhileItReads(t *testing.T) {
	v, br := newEnv(t), newBroker(t)
	br.publish(payment(1), payment(2), payment(3))
	c, err := inbox.New("ledger", v.e, &inbox.Options{Retention: "inbox"})
	require.NoError(t, err)
	b := &book{}
	d := br.run(br.ctx, c, b.handle, 0, nil)
	require.Eventually(t, func() bool {
		pos, err := c.Position(br.ctx)
		return err == nil && pos == 3
	}, consumeTimeout, 10*time.Millisecond)

	br.recreate()
	br.publish(payment(11), payment(12), payment(13), payment(14), payment(15))
	d.requireReplaced(t)
	pos, err := c.Position(br.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 3, pos, "none of the new stream's messages was settled")
}
