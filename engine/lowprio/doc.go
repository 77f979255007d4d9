// Package lowprio runs Pebble's compactions at a low OS priority, so that
// on a machine with few cores they use the CPU the requests leave idle
// instead of taking turns with them. The engine does not use it by
// default; a service opts in (`idemkv serve` does):
//
//	p, err := lowprio.New(&lowprio.Options{Nice: 19})
//	e, err := engine.Open(dir, &engine.Options{ConfigurePebble: p.Configure})
//	runtime.GOMAXPROCS(runtime.NumCPU() + 1)
//
// # Basics
//
// Configure installs a compaction scheduler (Pebble's public
// Options.Experimental.CompactionScheduler) that admits compactions up to
// the concurrency Pebble allows, as Pebble's own scheduler does. Its grant
// handle is told, on each compaction's own goroutine, when the compaction
// starts iterating (CPUMeasurer.MeasureCPU with CompactionGoroutinePrimary);
// there it locks the goroutine to its OS thread for the rest of the
// goroutine's life and sets that thread's nice value. Pebble runs every
// compaction on a goroutine of its own, so when the compaction ends, Go
// ends the thread with it, and the lowered priority never reaches request
// work. Threads Go starts meanwhile come from its template thread and do
// not inherit it.
//
// Flushes are never lowered: Pebble schedules them outside the
// compaction scheduler, and writes wait for them. A compaction that
// starts while Pebble stalls writes keeps the normal priority, since the
// writes then wait for it too.
//
// It pays only with one Go processor more than the machine has cores
// (GOMAXPROCS): then a compaction has a processor of its own, and the
// kernel gives the cores to the requests' threads first. With GOMAXPROCS
// at the number of cores, every processor's thread has a core anyway and
// the nice value changes little. docs/operations.md has the measurements
// and when to turn it off.
//
// # Caveats
//
//   - Linux only: elsewhere a thread's priority is the process's, and
//     Configure leaves the options as they are (Supported is false).
//   - An unprivileged thread cannot raise its priority again, so a
//     compaction lowered before a write stall stays lowered through it.
//     Other CPU-bound processes at normal priority then starve it, and
//     level 0 grows until Pebble stops writes: watch L0 files and
//     compaction debt (the engine's Stats) when the machine is shared.
//   - A lowered compaction holds Pebble's mutexes now and then (to
//     install its result); on a saturated machine it holds them longer.
//   - It relies on Pebble calling MeasureCPU on each compaction's
//     goroutine, as its CompactionGrantHandle contract says; the package's
//     tests fail if an upgrade of Pebble stops doing so.
package lowprio
