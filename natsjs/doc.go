// Package natsjs connects idemkv's outbox (publishing) and inbox
// (consuming) to NATS JetStream. It is a module of its own
// (github.com/idemkv/idemkv/natsjs) that holds idemkv's NATS client code,
// so that the library's packages, outbox and inbox among them, import no
// NATS package, and a program requires the NATS client only if it imports
// natsjs. The NATS server itself is built only into natsjs/natsembed and
// the tests (natsjs/natstest).
//
// Publishing: a Publisher implements outbox.Publisher: the relay hands it
// one event at a time, and it returns nil only once a stream has
// acknowledged the event (a PubAck). Each message carries the event's id
// as Nats-Msg-Id, so the stream's duplicate window absorbs the copies the
// relay republishes after a lost acknowledgement or a crash.
//
// Consuming: Consume feeds an inbox.Consumer the messages of a stream, in
// stream order from the consumer's committed position, settling each
// before it reads the next; see "Consuming" below. InboxMessage converts
// a JetStream message for a caller that reads the stream its own way.
//
// The package also creates the stream (EnsureStream) and reads a stream
// back in order (Read, ReadAll: for tests and tools). Package natsembed
// runs a JetStream server inside the process, for `idemkv serve --events
// embedded`; this package imports only the client.
//
// # Basics
//
//	p, err := natsjs.Connect("nats://127.0.0.1:4222", &natsjs.Options{SubjectPrefix: "idemkv"})
//	defer p.Close()
//	_, err = natsjs.EnsureStream(ctx, p.JetStream(), "IDEMKV", []string{"idemkv.>"}, 0)
//	// hand p to the relay; for each event it calls:
//	err = p.Publish(ctx, ev) // on "idemkv." + ev.Topic
//
// A message's payload is ev.Payload; its headers are ev.Headers, then the
// outbox headers (outbox.HeaderEventID, HeaderEntityKey, HeaderEntitySeq,
// HeaderOutboxSeq, HeaderCreated, which replace event headers of the same
// name), and Nats-Msg-Id = ev.ID. Consumers deduplicate on
// Idemkv-Event-Id and order an entity's events by Idemkv-Entity-Seq.
//
// New takes a connection the caller owns and closes; Connect dials one
// the Publisher owns, which Close closes.
//
// On the other side, a consumer applies each event once:
//
//	c, err := inbox.New("ledger", store, &inbox.Options{Retention: "inbox"})
//	err = natsjs.Consume(ctx, js, "IDEMKV", c, handle, nil) // until ctx ends
//
// # What an acknowledgement means
//
// A nil Publish means the stream stored the message, or already held one
// with the same id within its duplicate window (a PubAck with Duplicate
// set, which is success: an earlier attempt landed and its ack was lost).
// How durable a stored message is is the server's setting: the embedded
// server (natsembed) syncs each message to disk before acknowledging it;
// a standalone nats-server syncs every two minutes by default
// (sync_interval), and a replicated stream acknowledges once a quorum of
// replicas holds it.
//
// # Caveats
//
// Delivery is at least once. Deduplication by the stream lasts only its
// duplicate window (EnsureStream's, two minutes by default, or longer if
// the stream was given a longer one): if the relay
// republishes an event more than a window after a copy of it was stored
// (a long outage of the relay between a publish that landed and the
// outbox's ack), the stream keeps two copies. Consumers must deduplicate
// on Idemkv-Event-Id for a complete guarantee.
//
// An error from Publish is ambiguous unless it wraps ErrInvalidEvent or
// ErrNotConnected: a timeout or a lost connection may come after the
// server stored the message. The relay publishes the event again, with
// the same id.
//
// Order: the stream keeps messages in the order it stored them, and the
// relay publishes one event at a time, each only after the previous one's
// PubAck, so events reach the stream in outbox order and an entity's
// events in its order. A Publisher does not order concurrent Publish calls
// itself. A republished duplicate is not stored again, so it never
// appears out of place.
//
// An event the publisher cannot send (a topic that is not a literal
// subject, a reserved Nats-* header, a payload over the server's limit,
// 1 MiB by default) fails on every attempt; errors wrapping
// ErrInvalidEvent say so without contacting the server. A subject that
// no stream captures fails with jetstream.ErrNoStreamResponse.
//
// While the connection is down, Publish fails at once with
// ErrNotConnected. nats.go reconnects in the background; a connection
// made by Connect reconnects for ever, one the caller passes to New
// reconnects as the caller configured it.
//
// # Consuming
//
// Consume keeps no state in the broker: it reads with an ordered
// consumer (ephemeral, without acknowledgements) from the position the
// inbox consumer commits with each event's effects, so it resumes exactly
// after the last event applied, whatever stopped it. A message that fails
// to settle is read again, after a backoff, before any after it: a
// handler that fails for good blocks the stream and should reject the
// event instead (inbox.Reject). Copies of an event are answered by its
// dedup mark in the store (package inbox), not by the stream, so a copy
// stored after the duplicate window is a duplicate too, for as long as
// the mark is kept (inbox.Options.Retention).
package natsjs
