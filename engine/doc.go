// Package engine is idemkv's embedded idempotency store on Pebble. It
// implements the idemkv.Store contract for a single process: scoped,
// payload-bound idempotency keys, fenced leases, compact results, and
// business writes that commit atomically with the outcome.
//
// # Basics
//
//	e, err := engine.Open("idemkv-data", nil)
//	c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: fp})
//	switch c.Outcome {
//	case idemkv.Acquired:
//		err = e.Complete(ctx, c.Lease, idemkv.Result{Status: 201, Pointer: "/v1/payments/p42"},
//			func(w idemkv.Effects) error { return w.Set([]byte("payment/p42"), amount) })
//	case idemkv.Replay:
//		return c.Record.Result
//	...
//	}
//
// # What survives a crash
//
// Every write that acknowledges something is synced before the call
// returns:
//
//   - Complete: the outcome and the caller's effects, in one batch. After a
//     crash both are present or neither is.
//   - A ModeRemote Claim: the in-progress record, before the caller may call
//     downstream.
//   - Renew of a remote claim: the record with its new lease, so that after
//     a crash the stored lease is still the last moment its holder could
//     have called downstream (a reconciler waits for it).
//   - Release of a remote claim, MarkUncertain, Resolve: their record change.
//
// Local claims are deliberately not written, because a crash makes them
// moot: a ModeLocal Claim, and its renewals, are held only in memory. Its
// effect cannot commit without its outcome, so a crash before Complete
// leaves no trace and a retry simply runs.
//
// Pebble makes a synced write visible to readers before the sync finishes.
// The engine never lets a duplicate observe such a write: while a key's
// write is in flight the key is marked busy in memory, and claims for it
// answer InProgress until the write is durable.
//
// # Fencing and takeovers
//
// Tokens are epoch<<40 | sequence, where the epoch is advanced durably at
// every Open: they are unique and increasing for the life of the store.
// An Open that issues all 2^40 tokens of its epoch fails (ErrFailed) rather
// than repeat one; reopening advances the epoch. A
// holder's Complete, Release, MarkUncertain and Renew are compare-and-set on
// the token. An expired local lease may be taken over at once (the stale
// holder's effects are fenced with its outcome). An expired remote lease is
// taken over only by a Resumable claim, which keeps the OperationID so the
// downstream sees the same operation; otherwise it becomes uncertain.
//
// A new remote record's OperationID is derived from its request
// (idemkv.DeriveOperationID) under a secret the store draws when it is
// created, keeps with its epoch and carries into its backups: every claim
// of one logical request gets the same id, also after the record was
// released, resolved with no effect, evicted or expired.
//
// # Retention and the sweeper
//
// A claim names a retention class (ClaimRequest.Retention; "" is the
// default class, Options.Retention; others come from
// Options.RetentionClasses). The first claim's class is stored with the
// record and decides its expiry when it completes. Every read treats a
// completed record at or past its expiry as absent, at once. A background
// sweeper (package ttl, started by Open and stopped by Close; Options.Sweep)
// gives the space back: completed records are kept in expiry buckets (a
// twenty-fourth of their class's window wide), and once a bucket has ended,
// every record in it has expired, and the sweeper drops it with one range
// deletion. It reads in rate-limited chunks; each chunk's deletions and the
// position reached are one batch, so a pass resumes after a restart. An
// unsettled record (in progress or uncertain) is in no bucket and never
// deleted; a pass counts those past their expiry (Stats.Sweep).
// Engine.Sweep runs a pass by hand. Sweeper deletions are not synced: a
// lost one brings back records every read treats as absent anyway.
//
// # Performance
//
// Concurrent synced writes are combined: writers that arrive while a
// commit is in flight share the next batch and fsync, so under load a
// request costs a small fraction of an fsync (docs/benchmarks.md). Recently
// completed records are kept in a replay cache (Options.ReplayCacheSize),
// so retries of finished requests are answered from memory. Claims of new
// keys are answered by an in-memory bloom filter of the stored record keys
// (Options.ClaimFilterBitsPerKey), built by a background scan after Open
// and rebuilt when it fills; a claim it cannot rule out reads Pebble
// through a prefix seek that consults every level's bloom filter, so size
// Options.CacheSize to hold those filters (docs/operations.md).
//
// Pebble's flushes and compactions run at the process's priority. On a
// machine with few cores, a service can run compactions at a lower one
// (package engine/lowprio, through Options.ConfigurePebble); the engine
// never changes the scheduling of its host process by itself.
//
// Load seeds a store that no process holds in bulk, in the same layout
// Claim and Complete write, for benchmarks and imports.
//
// # Caveats
//
//   - One process owns a store directory (Pebble locks it). Exclusion
//     between concurrent claims lives in that process's memory; it is not a
//     distributed lock.
//   - An operation in flight at a crash resolves like this: a local one left
//     nothing and runs again on retry; a remote one is in progress until its
//     lease runs out, then uncertain (or resumed, if Resumable) — never
//     re-run blind.
//   - Retention: a completed record past its class's window is treated as
//     absent, and a late retry runs as new. Choose windows from the longest
//     client retry, queue replay and provider windows (docs/operations.md).
//   - GetData may observe effects whose Complete is still syncing.
//   - Effects are serialized per idempotency key, not per business key. A
//     read-modify-write of shared data (a balance) is safe when it reads
//     through Effects.Get, whose reads are checked at commit; a value read
//     any other way (GetData, a cache) and written back can lose an
//     update. Only point reads are checked.
//   - A failed synced write poisons the engine (ErrFailed): the write's fate
//     is unknown, so the engine refuses to answer until it is reopened.
package engine
