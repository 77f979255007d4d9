// Package workloads measures the engine on request workloads and, side by
// side in the same run, a hand-written raw-Pebble baseline of the same
// contract: throughput, latency, fsyncs, CPU, bytes on disk and write
// amplification per point, the engine/baseline ratio, the guide's sizing
// table redone with measured numbers, and optionally the unique workload
// over stores of many live keys. The command `idemkv bench` runs it;
// docs/benchmarks.md explains the figures.
//
// # Basics
//
//	o, _ := workloads.Profile("quick")
//	o.Workloads = []string{workloads.Unique, workloads.Replay}
//	rep, err := workloads.Run(ctx, o)
//	rep.WriteTable(os.Stdout)
//	rep.WriteJSON(f)
//	rep.Plot("plots")
//
// A run sweeps each workload over Options.Concurrency, measuring each
// point for Options.Duration on each target in turn (engine, then
// baseline, and pgstore with Options.Targets or `idemkv bench --postgres`,
// at the same point). Every write workload gets a fresh store per
// point; the read-only workloads share one preloaded store per target.
// Each store is opened with a vfs.FS wrapper that counts syncs and the
// records appended to the write-ahead log. Stores that hold records
// before they are measured (preloaded, sizing, scale) are seeded by
// Target.Seed: the engine's through engine.Load (bench.Seed), in the
// layout the engine writes, the baseline's through its own claims.
//
// # What a run checks
//
// A run fails rather than report on a new key that is not acquired, a
// replay with the wrong result, a retry that acquires a key already
// acquired, a hot key acquired more than once, and, after each point,
// acknowledged keys that do not replay their stored result or lack their
// effect (Options.VerifyKeys of them, or all).
//
// # The baseline
//
// The baseline (engine/baseline) is the contract written by hand
// on raw Pebble: a synced one-key batch for the claim and another for the
// completion, under a per-key mutex. It is opened from the same
// engine.Options and stores the same bytes, so the comparison isolates
// the commit path.
//
// # Caveats
//
//   - The ratio between targets measured in the same run is the figure
//     that counts; absolute numbers drift on shared machines.
//   - Synced batches are counted as write-ahead-log records, one per
//     committed Pebble batch; that equals synced batches only because both
//     targets commit every batch with pebble.Sync.
//   - Bytes per key in a point includes the effect rows of local
//     workloads; the sizing run measures records alone.
package workloads
