// Package bench is idemkv's benchmark harness: what its six
// measurements share. Each measurement is a package on top of it, run by a
// command of idemkv and explained in docs/benchmarks.md:
//
//   - bench/workloads (`idemkv bench`): request workloads on the engine
//     and, side by side, on a hand-written raw-Pebble baseline.
//   - bench/httpoverhead (`idemkv bench http`): the HTTP middleware's
//     latency over a bare handler on loopback.
//   - bench/retention (`idemkv bench ttl`): a steady load against a short
//     retention, with and without the sweeper, and the sweeper's cost.
//   - bench/events (`idemkv bench events`): completions with an event
//     against without, the outbox relay's lag and throughput to
//     JetStream, and an inbox consumer against a bare one.
//   - bench/fleet (`idemkv bench postgres`): the PostgreSQL store against
//     naive SQL.
//   - bench/day (`idemkv bench --profile day`): a day of the guide's
//     records on one node, each measured phase in a process of its own.
//
// # Basics
//
// A measurement's Options embed Options; its Profile returns one of the
// standard configurations (Profiles); its Run returns a Report with
// WriteTable and WriteJSON, whose meta object embeds Meta. Inside, a run
// is a Run (temporary directory, progress, metadata); latencies go into
// Histograms and come out as a Latency; requests are derived from numbers
// (Key); and an engine store that must hold records before it is
// measured is seeded through engine.Load, by Seed.
//
// # What a run guarantees
//
// Figures from a store that misbehaves are worthless: every measurement
// checks what the store answers as it goes, and fails with an error
// wrapping ErrViolation rather than report. Durability is never weakened:
// every write that acknowledges something is synced before the call
// returns. Seeding alone skips the claims; it only sets the stage.
//
// # Caveats
//
//   - Absolute numbers drift on shared machines; compare figures measured
//     in the same run, which is why each measurement runs its sides back
//     to back or in alternating slices.
//   - CPU per request is the process's user+system time (CPUTime) over
//     the measurement divided by its requests: it includes the harness's
//     own work and Pebble's background flushes and compactions.
package bench
