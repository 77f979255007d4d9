// Package processor is a simulated card processor served over HTTP, for
// running the payments example against a downstream that lives in another
// process, with its own store, so that its charges outlive a crash of the
// service that calls it (idemkv processor; idemkv serve --processor URL).
//
// # Basics
//
//	POST /v1/charges        Idempotency-Key: K   {"amount":5000,"currency":"USD","description":"..."}
//	GET  /v1/charges/{K}    the charge made under K; 409 while a request under K is being processed; 404 if none
//	GET  /v1/charges        every charge the store holds
//
// A charge is deduplicated on its Idempotency-Key: a retry gets the first
// answer back (Idempotent-Replayed: true), and the same key with another
// amount is a 422, as real processors answer. The charge route is itself
// protected by package httpidem on its own engine, in local mode: the
// charge row and the key's outcome commit in one batch.
//
// A charge request may carry a deadline, the Charge-Deadline header (RFC
// 3339): one that arrives later, by the store's clock, is refused before
// charging (503, problem type call-expired), unless its key was charged
// already, which is replayed. A caller that sends the end of its lease
// (payments.ChargeRequest.Deadline) can then trust a lookup's 404 once
// that moment has passed: no call held back on its way can charge after
// it.
//
// Failures are injected in front of the route: Latency, FailRate (refused
// before charging: 503) and TimeoutRate (charged and committed, then the
// answer withheld until the caller gives up or Options.Hold passes, then
// 504), or Options.Fault for a test that scripts them call by call.
//
// # Caveats
//
//   - It simulates one merchant: there is no authentication, and every
//     key is in one namespace. Serve it on loopback.
//   - Keys are deduplicated, and looked up, for as long as the store
//     retains them (engine.Options.Retention): a key past it reads as never
//     charged, so keep it longer than a caller can take to reconcile.
//   - A deadline is compared with this process's clock (its store's
//     engine time, which may differ from the host's clock after a step:
//     docs/operations.md, "Clocks"): a caller's reconciler must leave a
//     margin for how far it may lag the caller's store
//     (reconcile.Options.Grace). One ahead by more than the caller's call
//     timeout refuses every call.
package processor
