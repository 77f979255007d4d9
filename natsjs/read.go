package natsjs

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A Message is one message of a stream, as Read delivers it.
type Message struct {
	// Seq is the message's stream sequence: its place in the stream,
	// increasing, with gaps where messages were deleted.
	Seq uint64
	// Subject is the subject it was published on.
	Subject string
	// Header holds its headers (the outbox headers, the event's own,
	// Nats-Msg-Id). The caller owns it.
	Header nats.Header
	// Data is its payload. The caller owns it.
	Data []byte
	// Stored is when the stream stored it.
	Stored time.Time
}

// Read calls fn with each message of stream whose sequence is from or
// later (0 and 1 both mean the start), in stream order, and returns nil
// once it has delivered the last message the stream held: it reads until
// caught up, not for ever. A message published while Read runs may or may
// not be delivered. If fn returns an error, Read stops and returns it.
//
// Read uses an ordered consumer: ephemeral, without acknowledgements, and
// deleted when Read returns (or, if that fails, by the server after five
// minutes of inactivity). It changes nothing in the stream, so any number
// of Reads may run, and it is not an inbox: a reader that must resume
// where it stopped keeps the last Seq it processed and passes Seq+1.
func Read(ctx context.Context, js jetstream.JetStream, stream string, from uint64, fn func(Message) error) error {
	cfg := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy}
	if from > 1 {
		cfg = jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: from}
	}
	cons, err := js.OrderedConsumer(ctx, stream, cfg)
	if err != nil {
		return fmt.Errorf("natsjs: read stream %q: %w", stream, err)
	}
	defer deleteConsumer(ctx, js, stream, cons)
	// The consumer's count of pending messages, at its creation, says
	// whether there is anything to wait for; without it Next would block
	// on an empty stream until ctx ends.
	if info := cons.CachedInfo(); info == nil || info.NumPending == 0 {
		return nil
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("natsjs: read stream %q: %w", stream, err)
	}
	defer it.Stop()
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return fmt.Errorf("natsjs: read stream %q: %w", stream, err)
		}
		md, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("natsjs: read stream %q: %w", stream, err)
		}
		if err := fn(Message{
			Seq:     md.Sequence.Stream,
			Subject: m.Subject(),
			Header:  m.Headers(),
			Data:    m.Data(),
			Stored:  md.Timestamp,
		}); err != nil {
			return err
		}
		// NumPending counts the messages after this one, as the server
		// saw when it delivered it.
		if md.NumPending == 0 {
			return nil
		}
	}
}

// ReadAll returns the messages Read delivers, in stream order.
func ReadAll(ctx context.Context, js jetstream.JetStream, stream string, from uint64) ([]Message, error) {
	var msgs []Message
	err := Read(ctx, js, stream, from, func(m Message) error {
		msgs = append(msgs, m)
		return nil
	})
	return msgs, err
}

// deleteConsumer deletes an ordered consumer of Read or Consume, if it
// can in a second; the server deletes it after its inactive threshold (5
// minutes) otherwise.
func deleteConsumer(ctx context.Context, js jetstream.JetStream, stream string, cons jetstream.Consumer) {
	info := cons.CachedInfo()
	if info == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_ = js.DeleteConsumer(ctx, stream, info.Name)
}
