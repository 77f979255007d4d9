// Package sim runs code under a deterministic simulation: one seed drives
// a virtual clock and a scheduler over simulated processes, which crash,
// stall and talk over links that delay, lose and reorder, so that the
// schedules a protocol meets in production (a reply that lands after its
// caller gave up, a retry racing a takeover, a question asked while the
// answer is still in flight) are explored run after run, and any failure
// is replayed from its seed. It is the approach of FoundationDB's
// simulation and TigerBeetle's VOPR, for the world around an idempotency
// key.
//
// # Basics
//
// A World holds the clock and a queue of events. Processes (Proc) own
// actors: goroutines that run one at a time, holding a baton the
// scheduler hands out as it fires events in time order, so that nothing
// in the world runs concurrently and every random choice, drawn from the
// world's source, comes in the same order. An actor blocks only through
// the world: Proc.Sleep, Proc.Call (a request answered by an event, or a
// timeout), or a timer (Proc.AfterFunc). Code under test runs inside
// actors unchanged, provided it takes its time and its timers from an
// idemkv.Clock it is given (a Proc is an idemkv.TimerClock and an
// idemkv.SteadyClock); the engine, the PostgreSQL store, the HTTP
// middleware with its heartbeats, the reconciler and the admin functions
// all do.
//
//	w := sim.New(seed, start)
//	svc, client := w.NewProc("svc"), w.NewProc("client")
//	w.Go(client, func() {
//		v, err := client.Call(ctx, time.Second, func(reply func(any, error)) {
//			w.Send(link, svc, func() { w.Send(link, client, func() { reply("pong", nil) }) })
//		})
//		...
//	})
//	err := w.Run(start.Add(time.Hour))
//
// A Proc crashes (Crash: its blocked actors are released with ErrCrashed
// and unwind outside the world, its timers and undelivered messages are
// dropped, and what it registered with OnCrash runs, such as closing its
// store handle) and freezes (Freeze: nothing of it runs for a while, as
// in a long pause). The trace (World.Logf) is what a failing seed prints.
//
// The package's tests run the payments service of examples/payments in
// such a world, on the real engine (over a crashable in-memory
// filesystem) and the real PostgreSQL store: see docs/reliability.md,
// "The simulation", for what they check and how to run them long.
//
// # Caveats
//
//   - A store call runs to its end within one step: the simulation
//     interleaves processes at the points where they wait, not inside a
//     call. The store's own atomicity and crash safety are tested apart
//     (package storetest, the engine's crash tests).
//   - A goroutine an actor starts must not touch the world while the
//     actor runs on; one the actor waits for may block on the world in
//     its place (the baton passes with it).
//   - An actor of a process that crashed runs on as a zombie, outside the
//     world: it may only touch what its process owned.
package sim
