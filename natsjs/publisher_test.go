package natsjs_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/natsjs"
	"github.com/idemkv/idemkv/natsjs/natstest"
	"github.com/idemkv/idemkv/outbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testTimeout bounds each test's broker calls. It only turns a hang into a
// failure; nothing waits for it to pass.
const testTimeout = 10 * time.Second

const streamName = "IDEMKV"

// setup starts a server, a Publisher on it with subject prefix "idemkv",
// and the stream capturing "idemkv.>".
func setup(t *testing.T, opts *natsjs.Options) (context.Context, *natstest.Server, *natsjs.Publisher, jetstream.Stream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	srv := natstest.Start(t)
	if opts == nil {
		opts = &natsjs.Options{SubjectPrefix: "idemkv"}
	}
	p, err := natsjs.New(srv.Connect(t), opts)
	require.NoError(t, err)
	s, err := natsjs.EnsureStream(ctx, p.JetStream(), streamName, []string{"idemkv.>"}, 0)
	require.NoError(t, err)
	return ctx, srv, p, s
}

func event(seq uint64, topic, key string, entitySeq uint64) idemkv.StoredEvent {
	return idemkv.StoredEvent{
		Event: idemkv.Event{
			Topic:   topic,
			Key:     key,
			Payload: []byte(fmt.Sprintf("payload %d", seq)),
		},
		ID:        fmt.Sprintf("ev-%d", seq),
		Seq:       seq,
		EntitySeq: entitySeq,
		Created:   time.Date(2026, 3, 1, 12, 0, 0, int(seq), time.FixedZone("CET", 3600)),
	}
}

func msgs(ctx context.Context, t *testing.T, s jetstream.Stream) uint64 {
	t.Helper()
	info, err := s.Info(ctx)
	require.NoError(t, err)
	return info.State.Msgs
}

// A published event is read back on its subject, with its payload, its
// own headers, every outbox header and Nats-Msg-Id.
func TestPublishReadBack(t *testing.T) {
	ctx, _, p, _ := setup(t, nil)
	ev := event(7, "payments.created", "pay_42", 3)
	ev.Headers = map[string]string{"Trace-Id": "abc", "Idemkv-Event-Id": "forged"}
	require.NoError(t, p.Publish(ctx, ev))

	got, err := natsjs.ReadAll(ctx, p.JetStream(), streamName, 0)
	require.NoError(t, err)
	require.Len(t, got, 1)
	m := got[0]
	require.Equal(t, uint64(1), m.Seq)
	require.Equal(t, "idemkv.payments.created", m.Subject)
	require.Equal(t, "payload 7", string(m.Data))
	require.False(t, m.Stored.IsZero())
	require.Equal(t, nats.Header{
		"Trace-Id":             {"abc"},
		outbox.HeaderEventID:   {"ev-7"}, // the store's, not the event's forged one
		outbox.HeaderEntityKey: {"pay_42"},
		outbox.HeaderEntitySeq: {"3"},
		outbox.HeaderOutboxSeq: {"7"},
		outbox.HeaderCreated:   {"2026-03-01T11:00:00.000000007Z"},
		jetstream.MsgIDHeader:  {"ev-7"},
	}, m.Header)
	created, err := time.Parse(time.RFC3339Nano, m.Header.Get(outbox.HeaderCreated))
	require.NoError(t, err)
	require.True(t, created.Equal(ev.Created))
}

// An event without a Key still carries the entity-key header, empty.
func TestPublishEmptyKey(t *testing.T) {
	ctx, _, p, _ := setup(t, nil)
	require.NoError(t, p.Publish(ctx, event(1, "t", "", 1)))
	got, err := natsjs.ReadAll(ctx, p.JetStream(), streamName, 0)
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, []string{""}, got[0].Header.Values(outbox.HeaderEntityKey))
}

// Publishing the same event id twice succeeds twice and stores one
// message: the first.
func TestPublishDuplicate(t *testing.T) {
	ctx, _, p, s := setup(t, nil)
	ev := event(1, "payments.created", "pay_1", 1)
	require.NoError(t, p.Publish(ctx, ev))
	again := ev
	again.Payload = []byte("a second attempt")
	require.NoError(t, p.Publish(ctx, again))
	require.Equal(t, uint64(1), msgs(ctx, t, s))

	// The second PubAck is a duplicate's, which Publish counts as success.
	ack, err := p.JetStream().Publish(ctx, "idemkv.payments.created", nil, jetstream.WithMsgID(ev.ID))
	require.NoError(t, err)
	require.True(t, ack.Duplicate)
	require.Equal(t, uint64(1), ack.Sequence)

	got, err := natsjs.ReadAll(ctx, p.JetStream(), streamName, 0)
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, "payload 1", string(got[0].Data))
}

// While the server is down Publish fails at once; after a restart on the
// same store it succeeds, and the stream still holds what it held.
func TestPublishBrokerOutage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	srv := natstest.Start(t)
	down, back := make(chan struct{}, 1), make(chan struct{}, 1)
	p, err := natsjs.Connect(srv.URL(), &natsjs.Options{SubjectPrefix: "idemkv"},
		nats.ReconnectWait(10*time.Millisecond),
		nats.ReconnectJitter(0, 0),
		nats.DisconnectErrHandler(func(*nats.Conn, error) { signal(down) }),
		nats.ReconnectHandler(func(*nats.Conn) { signal(back) }))
	require.NoError(t, err)
	defer p.Close()
	s, err := natsjs.EnsureStream(ctx, p.JetStream(), streamName, []string{"idemkv.>"}, 0)
	require.NoError(t, err)

	require.NoError(t, p.Publish(ctx, event(1, "orders", "o1", 1)))
	srv.Stop()
	<-down

	short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
	err = p.Publish(short, event(2, "orders", "o1", 2))
	cancelShort()
	require.ErrorIs(t, err, natsjs.ErrNotConnected)

	srv.Restart(t)
	<-back
	require.NoError(t, p.Publish(ctx, event(2, "orders", "o1", 2)))
	require.NoError(t, p.Publish(ctx, event(2, "orders", "o1", 2))) // absorbed
	require.Equal(t, uint64(2), msgs(ctx, t, s))
	got, err := natsjs.ReadAll(ctx, p.JetStream(), streamName, 0)
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.Equal(t, "payload 1", string(got[0].Data))
	require.Equal(t, "payload 2", string(got[1].Data))
}

// Publish gives up at its ctx's deadline, or at PublishTimeout, when no
// PubAck comes: here a plain subscriber, not a stream, takes the request
// and never answers.
func TestPublishTimeout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	sub, err := nc.SubscribeSync("silent.>")
	require.NoError(t, err)
	defer func() { require.NoError(t, sub.Unsubscribe()) }()
	require.NoError(t, nc.Flush())

	p, err := natsjs.New(nc, &natsjs.Options{SubjectPrefix: "silent"})
	require.NoError(t, err)
	short, cancelShort := context.WithTimeout(ctx, 100*time.Millisecond)
	err = p.Publish(short, event(1, "x", "", 1))
	cancelShort()
	require.ErrorIs(t, err, context.DeadlineExceeded)

	p, err = natsjs.New(nc, &natsjs.Options{SubjectPrefix: "silent", PublishTimeout: 100 * time.Millisecond})
	require.NoError(t, err)
	require.ErrorIs(t, p.Publish(ctx, event(1, "x", "", 1)), context.DeadlineExceeded)

	canceled, cancelNow := context.WithCancel(ctx)
	cancelNow()
	require.ErrorIs(t, p.Publish(canceled, event(1, "x", "", 1)), context.Canceled)
}

// A subject no stream captures is an error, not a silent drop.
func TestPublishNoStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	srv := natstest.Start(t)
	p, err := natsjs.New(srv.Connect(t), nil)
	require.NoError(t, err)
	require.ErrorIs(t, p.Publish(ctx, event(1, "nowhere", "", 1)), jetstream.ErrNoStreamResponse)
}

// Events that cannot be published fail with ErrInvalidEvent, naming the
// problem, and nothing reaches the stream.
func TestPublishInvalidEvent(t *testing.T) {
	ctx, _, p, s := setup(t, nil)
	withHeader := func(k, v string) idemkv.StoredEvent {
		ev := event(1, "t", "", 1)
		ev.Headers = map[string]string{k: v}
		return ev
	}
	withTopic := func(topic string) idemkv.StoredEvent { return event(1, topic, "", 1) }
	withKey := func(key string) idemkv.StoredEvent { return event(1, "t", key, 1) }
	for _, tc := range []struct {
		name string
		ev   idemkv.StoredEvent
		want string
	}{
		{"empty topic", withTopic(""), "empty topic"},
		{"space", withTopic("payments created"), "printable ASCII without spaces"},
		{"tab", withTopic("payments\tcreated"), "printable ASCII without spaces"},
		{"non-ASCII", withTopic("paiements.créés"), "printable ASCII without spaces"},
		{"star token", withTopic("payments.*"), "wildcard"},
		{"gt token", withTopic("payments.>"), "wildcard"},
		{"star inside", withTopic("pay*ments"), "wildcard"},
		{"leading dot", withTopic(".payments"), "empty token"},
		{"trailing dot", withTopic("payments."), "empty token"},
		{"double dot", withTopic("payments..created"), "empty token"},
		{"empty id", func() idemkv.StoredEvent { ev := event(1, "t", "", 1); ev.ID = ""; return ev }(), "empty event id"},
		{"newline in id", func() idemkv.StoredEvent { ev := event(1, "t", "", 1); ev.ID = "a\nb"; return ev }(), "CR or LF"},
		{"newline in key", withKey("a\r\nb"), "CR or LF"},
		{"reserved header", withHeader("Nats-Rollup", "all"), "reserved"},
		{"reserved header, lower case", withHeader("nats-msg-id", "x"), "reserved"},
		{"empty header name", withHeader("", "x"), "empty header name"},
		{"colon in header name", withHeader("a:b", "x"), "not allowed"},
		{"space in header name", withHeader("a b", "x"), "not allowed"},
		{"newline in header value", withHeader("A", "x\r\nNats-Rollup: all"), "CR or LF"},
		{"payload too large", func() idemkv.StoredEvent {
			ev := event(1, "t", "", 1)
			ev.Payload = make([]byte, 2<<20)
			return ev
		}(), "over the server's limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := p.Publish(ctx, tc.ev)
			require.ErrorIs(t, err, natsjs.ErrInvalidEvent)
			require.ErrorContains(t, err, tc.want)
		})
	}
	require.Zero(t, msgs(ctx, t, s))
}

func TestOptionsValidate(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	for _, o := range []natsjs.Options{
		{SubjectPrefix: "idemkv."},
		{SubjectPrefix: "a b"},
		{SubjectPrefix: "idemkv.>"},
		{PublishTimeout: -time.Second},
	} {
		_, err := natsjs.New(nc, &o)
		require.ErrorContains(t, err, "natsjs: invalid options", "%+v", o)
	}
	_, err := natsjs.New(nil, nil)
	require.Error(t, err)
	_, err = natsjs.Connect(srv.URL(), &natsjs.Options{SubjectPrefix: "a..b"})
	require.ErrorContains(t, err, "SubjectPrefix")
}

// Many events published one at a time, as the relay does, are stored in
// outbox order, and so each entity's in its order.
func TestPublishOrder(t *testing.T) {
	ctx, _, p, s := setup(t, nil)
	const n = 300
	keys := []string{"a", "b", "c"}
	entitySeq := map[string]uint64{}
	for i := uint64(1); i <= n; i++ {
		k := keys[(i*7)%3]
		entitySeq[k]++
		require.NoError(t, p.Publish(ctx, event(i, "orders."+k, k, entitySeq[k])))
	}
	require.Equal(t, uint64(n), msgs(ctx, t, s))

	got, err := natsjs.ReadAll(ctx, p.JetStream(), streamName, 0)
	require.NoError(t, err)
	require.Len(t, got, n)
	seen := map[string]uint64{}
	for i, m := range got {
		require.Equal(t, uint64(i+1), m.Seq)
		require.Equal(t, strconv.Itoa(i+1), m.Header.Get(outbox.HeaderOutboxSeq))
		k := m.Header.Get(outbox.HeaderEntityKey)
		seen[k]++
		require.Equal(t, strconv.FormatUint(seen[k], 10), m.Header.Get(outbox.HeaderEntitySeq), "entity %s", k)
		require.Equal(t, "orders."+k, strings.TrimPrefix(m.Subject, "idemkv."))
	}
	require.Equal(t, entitySeq, seen)
}

// signal sends on c without blocking nats.go's callback goroutine.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
