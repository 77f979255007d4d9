// Package bench is idemkv's benchmark harness: it runs request workloads
// against the engine and, side by side in the same run, against a
// hand-written raw-Pebble baseline of the same contract, and reports
// throughput, latency, fsyncs, CPU, bytes on disk and write amplification
// per point, the engine/baseline ratio, and the guide's sizing table redone
// with measured numbers. The command `idemkv bench` drives it;
// docs/benchmarks.md explains every figure.
//
// # Basics
//
//	cfg, _ := bench.Profile("quick")
//	cfg.Workloads = []string{bench.Unique, bench.Replay}
//	rep, err := bench.Run(ctx, cfg)
//	rep.WriteTable(os.Stdout)
//	rep.WriteJSON(f)
//	rep.Plot("plots")
//
// A run sweeps each workload over Config.Concurrency, measuring each point
// for Config.Duration on each target in turn (engine, then baseline, at the
// same point). Every write workload gets a fresh store per point; the
// read-only workloads share one preloaded store per target. Each store is
// opened with a vfs.FS wrapper that counts syncs and the records appended
// to the write-ahead log.
//
// # What a run guarantees
//
// Figures from a store that misbehaves are worthless, so a run checks the
// contract as it goes and fails rather than report: a new key that is not
// acquired, a replay with the wrong result, a retry that acquires a key
// already acquired, a hot key acquired more than once, and, after each
// point, acknowledged keys that do not replay their stored result or lack
// their effect (Config.VerifyKeys of them, or all).
//
// The harness never weakens durability: both targets sync every write that
// acknowledges something before the call returns, as the contract demands.
//
// # The baseline
//
// The baseline (bench/internal/baseline) is what a user would write by
// hand: per-key mutex stripes, DB.Get, then a one-key batch committed with
// pebble.Sync for the claim, and again for the completion (which also
// carries the local effect), all under the stripe mutex. It reads the same
// engine.Options, so both stores have the same block cache, memtables,
// bloom filters, compression and compaction settings, and it stores the
// same key and value bytes; the comparison isolates the commit path. It
// passes the same conformance suite as the engine.
//
// # Caveats
//
//   - Absolute numbers drift on shared machines; the ratio between targets
//     measured in the same run is the figure that counts.
//   - CPU per request is the process's user+system time over the point
//     divided by its requests: it includes the harness's own work and
//     Pebble's background flushes and compactions.
//   - Synced batches are counted as write-ahead-log records, one per
//     committed Pebble batch; that equals synced batches only because both
//     targets commit every batch with pebble.Sync.
//   - Bytes per key in a point includes the effect rows of local
//     workloads; the sizing run measures records alone.
package bench
