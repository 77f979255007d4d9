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
package outbox
