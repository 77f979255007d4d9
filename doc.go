// Package idemkv is the store contract shared by every idemkv backend and
// every layer built on one: the types that name an idempotency record, the
// states it moves through, the outcomes of a claim, the errors, and the Store
// interface. It has no storage dependency. Package engine implements it on
// Pebble and package pgstore on PostgreSQL; the HTTP middleware, the outbox
// and the other layers are written against it.
//
// # Basics
//
// A record is addressed by an [ID]: the caller's scope (Tenant), the
// operation (Endpoint) and the client's idempotency key (Key). The same key
// string under two tenants names two unrelated records.
//
// A request first calls [Store.Claim] with the request's fingerprint. The
// [Claim] says what to do:
//
//   - [Acquired]: this caller holds a [Lease]. Run the operation, then call
//     [Store.Complete] with the result (and, for a local effect, the business
//     writes, which commit atomically with the result), or [Store.Release] if
//     the operation provably had no effect, or [Store.MarkUncertain] if a
//     downstream call's outcome is unknown.
//   - [InProgress]: another caller holds a live lease. Retry after
//     Claim.RetryAfter.
//   - [Replay]: the operation completed. Return Claim.Record.Result.
//   - [Mismatch]: the key was used for a different request (its fingerprint
//     differs). This is a client bug; nothing runs.
//   - [Reconciling]: the outcome of an earlier attempt is unknown. Nothing
//     re-runs it; a reconciler resolves it with [Store.Resolve].
//
// # Fencing
//
// Every acquisition gets a fresh fencing token, unique for the life of the
// store and larger than every token handed out before it. Complete, Release,
// MarkUncertain and Renew succeed only while the lease's token is still the
// record's current token (compare-and-set); otherwise they return
// [ErrFenced] and change nothing. A holder that finishes after its lease
// expired may still succeed if nobody took the record over in the meantime,
// but nothing promises it: a takeover revokes the lease, and a store may
// also drop an expired local lease to bound its memory. Renew before the
// lease runs out.
//
// # Local and remote effects
//
// A [ModeLocal] claim protects an effect that lives in the same store: the
// business writes and the outcome commit in one atomic batch, so a crash
// leaves either both or neither. Such a claim need not be durable, and a
// takeover after its lease expires is safe: the stale holder's writes are
// fenced off together with its outcome.
//
// A [ModeRemote] claim protects an effect outside the store (a payment
// provider, an email service). The claim is made durable before Claim
// returns, and it carries a stable [OperationID] that the caller must send
// downstream as that service's idempotency key on every attempt. An expired
// remote lease does not prove the old holder stopped or that its call did not
// land, so a later claim either resumes the same operation (only when the
// request says the downstream deduplicates on the OperationID) or turns the
// record into [StateUncertain] for reconciliation.
//
// # Settling what is unknown
//
// An uncertain record, or an abandoned one (a remote record in progress
// whose lease has run out: its holder is presumed gone), waits for a
// reconciler. [Store.List] pages through them, oldest first, from an index
// the store keeps in the same commit as each record; the reconciler asks
// the downstream about the record's [OperationID] (or a key derived from it
// per step, [OperationID.StepKey]) and settles it with [Store.Resolve], a
// compare-and-set on the token it listed, so a late holder or a second
// reconciler never settles it twice. One it gives up on goes to
// [Store.Escalate]: still uncertain, listed apart, left for an operator.
// Package reconcile is such a reconciler, on this contract alone.
//
// # Business data
//
// What an operation writes through [Effects] is the store's business data.
// A [DataStore] is a Store that also reads it outside any operation
// ([DataReader]: by key and in pages), commits transactions of it that
// belong to no record ([DataStore.Update]), and tells its health, its time
// and its [Counts]. A service written against DataStore runs on either
// store. The limits ([MaxEffectKeyLen], [ValidateEffectKey],
// [ValidateDataScan], [Result.Validate]) and the default clock
// ([SystemClock]) are this package's, the same for every store.
//
// # Caveats
//
// A key protects a request only for its retention class's window (chosen
// by the first claim, ClaimRequest.Retention); a retry that arrives after
// its record expired runs as new. Unsettled records (in progress,
// uncertain) never expire. Request deduplication
// complements business constraints (a unique payment id, a version check) and
// does not replace them.
package idemkv
