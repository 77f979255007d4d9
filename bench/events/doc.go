// Package events measures what the transactional outbox costs and how
// fast its events reach a broker. The command `idemkv bench events` runs
// it, and docs/benchmarks.md reports it. It has three parts:
//
//   - Overhead: completions with one event against the same completions
//     without, closed-loop, at each concurrency of Options.Concurrency. A
//     request is a local claim and a Complete whose apply function writes
//     the `unique` workload's 16-byte effect and, on the "with" side, emits
//     one event of a 200-byte JSON payload (Event). The two sides run
//     point by point, alternating which goes first, each on a fresh store,
//     Options.Rounds times; a relay into a publisher that acknowledges at
//     once (no broker) runs on both sides, so the outbox stays small and
//     the relay's own reads and acknowledgements are counted in the cost.
//   - Lag: an open-loop load of Options.Rates completions a second, each
//     with one event, relayed to a real JetStream server
//     (natsembed.Start, sync_always, in the run's directory). A
//     timing publisher around natsjs.Publisher records when each event's
//     PubAck arrives; an event's lag is that time minus the time its
//     Complete returned to the client. Then the relay alone: the time to
//     drain a backlog of Options.Backlog events, into the discarding
//     publisher and into JetStream, and JetStream alone, publishing the
//     same number of messages one at a time and pipelined.
//   - Consumers: the stream's first Options.Backlog messages read by a
//     bare ordered consumer (natsjs.Read), against the same messages
//     applied in order by an inbox consumer (natsjs.Consume) on a
//     fresh store, whose handler adds each payment to its account's total
//     (a read and a write): each message settles in its own durable
//     commit with its dedup mark and the consumer's position.
//
// # Basics
//
//	o, _ := events.Profile("quick")
//	rep, err := events.Run(ctx, o)
//	rep.WriteTable(os.Stdout)
//
// # What a run guarantees
//
// As every bench measurement, it fails with an error wrapping
// bench.ErrViolation rather than report figures from a store that
// misbehaves: every completion acknowledged with an event must leave
// exactly one event in the outbox, the relay must publish each of them
// (the discarding publisher counts them; JetStream must store as many
// messages as events were committed, each acknowledged once), a sample of
// the completed keys must replay their result and hold their effect, and
// the inbox must apply every message it reads once, its position ending
// at the last.
//
// # Caveats
//
//   - The JetStream server runs in this process, on the same two cores and
//     the same disk as the engine; its fsync per message (sync_always)
//     competes with the engine's own.
//   - An event's lag is measured from the return of its Complete, which a
//     relay woken by the commit may beat: such events count with a lag of
//     zero (Load.PublishedBeforeReturn says how many).
//   - Lag from Created is measured from the engine's clock when the commit
//     was enqueued, so it includes the commit's own fsync.
package events
