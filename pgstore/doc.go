// Package pgstore is idemkv's store on PostgreSQL: the idemkv.Store
// contract, and the idemkv.Outbox, shared by every process that opens the
// same database. It is the store for a fleet of services; package engine
// is the one for a single process. It is a module of its own
// (github.com/idemkv/idemkv/pgstore), so that a program requires pgx only
// if it imports pgstore.
//
// # Basics
//
//	s, err := pgstore.Open(ctx, "postgres://app@db/payments", nil)
//	c, err := s.Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: fp})
//	switch c.Outcome {
//	case idemkv.Acquired:
//		err = s.Complete(ctx, c.Lease, idemkv.Result{Status: 201, Pointer: "/v1/payments/p42"},
//			func(w idemkv.Effects) error { return w.Set([]byte("payment/p42"), amount) })
//	case idemkv.Replay:
//		return c.Record.Result
//	...
//	}
//
// A service whose business data lives in its own tables completes with
// its own statements in the outcome's transaction (CompleteTx).
//
// A local operation whose apply function only writes can run in one
// statement, claim and outcome and writes together (RunLocal): one round
// trip and one commit where Claim and Complete take two of each. Its apply
// function runs before the claim is known, so it must do nothing but
// write through Effects (which the Effects contract asks anyway).
//
// # Downstream identity
//
// A remote claim's OperationID (what StepKey derives a downstream's
// idempotency key from) is idemkv.DeriveOperationID of the request under
// the database's secret: 32 random bytes drawn by the migration that
// created the table idemkv_secret and read by every Open. So every process
// sharing the database gives a logical request the same id, on every
// claim: after a release, a resolution with no effect, an eviction, or
// the record's expiry, the request is sent downstream under the key it
// had, and a downstream that deduplicates on it absorbs a late call.
// ClaimRequest.Generation names another identity; a takeover keeps the
// stored one. Records written before schema version 3 keep the ids they
// were drawn at random.
//
// The relays of several processes publish the outbox together
// (idemkv.SharedOutbox, outbox.Options.Shared): each claims the earliest
// unpublished events of some entities with FOR UPDATE SKIP LOCKED, so no
// event is published by two at once and each entity keeps its order.
//
// A duplicate sent to one process while another holds its key can wait
// for the holder's outcome (idemkv.Watcher, which httpidem's Route.Wait
// uses): Watch counts the waiter on the record, and the statement that
// completes, releases or marks the record uncertain sends a NOTIFY on
// idemkv_settled, which every store listens on, only when someone waits.
//
// # Statements and isolation
//
// A claim is one statement: an insert, or a takeover of an expired lease,
// or a read of what is there (an abandoned remote record that the claim
// cannot resume takes a second, conditional update to turn uncertain). A
// claim that finds a record it cannot take writes and locks nothing, so a
// replay costs no WAL flush.
// Every holder write (Complete, Release, MarkUncertain, Renew) is an
// update conditional on the fencing token, in one statement. A Release
// may carry the attempt's compensations (its apply function: a hold given
// back): their writes and events go out in the release's statement, and
// only if it changed the record, so a holder whose lease was taken over
// gives back nothing; one that reads runs in a SERIALIZABLE transaction,
// as Complete's does (below).
// These run at READ COMMITTED: each is a single statement whose row lock
// and re-check of the condition on the latest row version decide it. The
// pool's sessions use generic plans (SET plan_cache_mode once connected,
// unless the connection string names it): the statements are point reads and writes
// by key, and planning each execution again was a fifth of their cost.
//
// Every operation that writes business data is SERIALIZABLE, so that
// PostgreSQL's serializable check (SSI) sees every write a read depends
// on. An apply function that reads (Effects.Get) runs in a SERIALIZABLE
// transaction, begun at its first read, which also carries the outcome:
// PostgreSQL refuses to commit it (SQLSTATE 40001) if what it read was
// changed by a transaction that committed since, and the store runs the
// apply function again after a short random pause (so that transactions
// that met do not meet again at once), up to 16 times, then fails with
// idemkv.ErrConflict. One that only writes goes out in one statement, its
// writes, events and outcome together, in a SERIALIZABLE transaction of
// its own (BEGIN, the statement and COMMIT in one round trip, once pgx
// has prepared the statement on the connection): a write made at READ
// COMMITTED would be invisible to the check, and three operations, one of
// which read a key as absent, could commit in no serial order. Such an
// operation can still be aborted (PostgreSQL's locks cover the index
// pages the store's own statements read, so writers of neighbouring keys
// meet, and of two writers of one row the first wins), but it read
// nothing that could have changed: the store runs it again, up to 1,000
// times, and never answers it with idemkv.ErrConflict. A read aborted
// itself runs its operation again whatever the apply function made of
// the error. Statements that write no data key (claims, outcomes without
// effects, the relay's) stay at READ COMMITTED.
//
// A commit writes no row that another operation's commit writes unless
// both write the same data key or the same record: an event's Seq and
// its entity's EntitySeq are given later, by the sequencer, so two
// operations emitting events of one entity do not conflict.
//
// Fencing tokens come from a sequence. A takeover draws its token under
// the record's row lock, so tokens increase in the order a record is
// acquired, but for one narrow case: a claim that waited on a row
// through another claim's acquisition, its release and the sweeper's
// delete inserts with the token it drew before (docs/design.md).
//
// # What is durable
//
// Renew is a committed update of the record's lease, so every process
// sharing the database holds off retries and reconcilers until the
// renewed lease runs out, and so does one that restarts.
//
// Every write commits as the server's synchronous_commit makes a commit
// durable, local claims included: a local claim lost in a crash of the
// database would take its fencing token with it (the sequence's advance
// is logged in the same commit), and the token could be issued again to
// another claim while the lost claim's holder still runs.
//
// # Time
//
// Leases, expiry and retention are measured by one clock for the whole
// fleet, the database's (Options.Clock's default): each process reads
// clock_timestamp() at Open and every 10 s and carries it forward on its
// monotonic clock, so a process whose own wall clock is minutes off, or
// steps, decides as the others do. Record.Marked is read from it too: the statement that marks a
// record uncertain (MarkUncertain, a claim that finds a remote lease run
// out and cannot resume it, an Escalate of such an abandoned record)
// stores its time, to the microsecond; an Escalate of an uncertain
// record keeps it, and every way out of the uncertain state clears it.
// Its error is half a round trip to the database (timed on a connection
// already taken, so a busy pool adds nothing) plus the monotonic clock's
// drift over 10 s; Health reports a clock not read for a minute. On
// CockroachDB clock_timestamp() is the connected node's, which may differ
// from the others' by the cluster's maximum offset. A Clock set in Options replaces it (tests use a
// manual one); with idemkv.SystemClock each process reads its own wall
// clock, and one ahead by S takes over an expired lease up to S early.
//
// # Caveats
//
//   - Durability is the server's: a commit is durable as
//     synchronous_commit makes it (docs/operations.md).
//   - The outbox's Seq is the order in which events became visible to
//     the sequencer, gapless, and keeps each entity's order; it is not the
//     order of commit timestamps.
//   - Text columns: a tenant or endpoint with a NUL byte, and a pointer,
//     note or event key that is not UTF-8 without NUL, are refused up
//     front (ErrInvalidScope, ErrInvalidResult, ErrInvalidArgument),
//     where the engine accepts them.
//   - A transaction that read can still be run again over a row it only
//     writes: its own record, renewed by its heartbeat or counted by a
//     Watch since the transaction began, or a data key another operation
//     wrote meanwhile (PostgreSQL's first updater wins). It runs again;
//     it fails with ErrConflict only after 16 such runs in a row.
//     PostgreSQL's check also works on index pages, not only rows, so
//     operations on neighbouring keys can be run again too.
//   - The secret is in the database: whoever can read idemkv_secret can
//     compute the operation ids of requests they can name. A copy of the
//     records moved to another database must take idemkv_secret with it,
//     or its requests are sent downstream under new ids.
//   - During a rolling upgrade to schema version 3, processes of an
//     earlier build that are still running draw random operation ids
//     and mark no record (Marked stays zero); a process of an earlier
//     build refuses to open the migrated database. Through the same
//     upgrade from version 2, a record marked by a new process and then
//     made absent, taken over and marked again by old ones keeps the
//     first Marked, earlier than its last mark: a reconciler's grace
//     then ends early for that attempt. Replace the old processes before
//     such records are reconciled.
//   - The database's clock is carried forward between reads on Go's
//     monotonic clock, which stops while the machine is suspended: a
//     process whose machine resumes lags the database by the suspension
//     until its next read, up to 10 seconds later. Its leases then run
//     out early. Do not suspend the machines of a fleet's processes.
//   - During a rolling upgrade to schema version 5, processes of an
//     earlier build that are still running notify no waiter (a duplicate
//     waiting for their attempts waits out the lease), write data at
//     READ COMMITTED, and number their events' EntitySeq in their
//     commits: until they stop, an entity's events from old and new
//     processes may be numbered out of their Seq order, and an old
//     process's relay fails (and retries) on a batch holding a new
//     process's events, which new relays publish.
//   - The relays of one database either all claim (outbox.Options.Shared)
//     or all read: a reading relay does not see what claiming ones hold.
//   - Tested against PostgreSQL 15. The statements keep to what
//     CockroachDB also runs (no advisory locks; serialization failures
//     retried), but CockroachDB has not been tested; without
//     LISTEN/NOTIFY there, set Options.NoListen.
package pgstore
