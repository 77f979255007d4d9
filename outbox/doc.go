// Package outbox relays the events a store's commits emit
// (idemkv.Effects.Emit) to a broker: the relay side of the transactional
// outbox. A Relay reads the outbox in commit order, publishes each event
// through a Publisher (package natsjs for NATS JetStream), and
// acknowledges to the store what the broker has; a crash republishes,
// under the same event ids, what was not acknowledged, so a broker that
// deduplicates on the id (or an inbox.Consumer) keeps one copy.
//
// A store restored from a backup, or failed over to a replica that
// lacked the last events, may number new commits' events as the lost
// ones were numbered. The relay tells this by the id of the last event it
// published and the store's acknowledged point, never acknowledges
// events it did not publish, and goes on from what the store holds: the
// surviving events are published again (the broker keeps one copy of
// each id), and the new ones once.
//
// Options.Logger gets a structured record (log/slog) of each failure Run
// retries: a failed publish (Warn, naming the event by seq and event_id),
// a store failure (Error), each with the failures in a row so far; and of
// the recovery that follows (Info); and of a store found to have lost
// events already published (Warn). Events are not keyed by idempotency
// keys, so the records carry no key_hash, and never an event's payload.
// Options.Logf, the text form, is deprecated.
//
// # Caveats
//
//   - Relays in several processes take turns by holds that run out
//     (idemkv.OutboxHolder, Options.Shared). A relay whose process
//     pauses past its hold while it publishes (stopped, frozen, swapped
//     out) may publish one event after another relay took over and
//     published it and its entity's later events. Within the broker's
//     duplicate window the broker drops the copy; after it, the stream
//     holds a late copy out of its entity's order (HeaderEntitySeq goes
//     back). An inbox.Consumer settles it as a duplicate; a consumer of
//     its own must do the same with an event id it has seen. The relay
//     publishes no further event of a read or claim once its hold has run
//     out, which bounds this to one event per pause.
package outbox
