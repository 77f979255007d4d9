// Package reconcile settles the operations whose outcome a store could not
// record: uncertain records (a call timed out, a handler failed after it
// may have called downstream) and abandoned ones (a remote record in
// progress whose holder crashed). It works on the idemkv.Store contract
// alone, so it runs the same against every store.
//
// # Basics
//
// The application supplies a Reconciler: given a record, it asks the
// downstream what became of the operation, by the record's OperationID or
// a step key derived from it (idemkv.OperationID.StepKey), and answers
// Applied (with the result to store), NotApplied (the record is removed
// and a retry runs anew) or Unknown. A Worker lists the records that need
// settling (idemkv.Store.List) and drives each through the Reconciler:
//
//	w, err := reconcile.New(store, reconcile.ReconcilerFunc(askProcessor), &reconcile.Options{
//		OnEscalate: func(rec idemkv.Record, note string) { page(rec.ID, note) },
//	})
//	go w.Run(ctx)
//
// A record is asked about Options.Grace after the last moment its current
// attempt may have sent its downstream call: an abandoned record's lease
// (Record.LeaseExpires, as last renewed), an uncertain one's mark
// (Record.Marked). Unknown answers, errors, timeouts, and panics in
// Reconcile or in an answer's Apply are asked again after a jittered
// exponential backoff (Options.MinBackoff, MaxBackoff). After
// Options.MaxAttempts of them in a row, or once a record is older than
// Options.MaxAge, the record is escalated (idemkv.Store.Escalate): it
// stays uncertain, is never re-run or asked about again, is listed apart
// (ListRequest.Escalated) and waits for an operator (idemkv resolve).
//
// Options.OnResolve is told of each record the worker resolved, so that
// what waited on it goes on at once: a saga whose step it was
// (saga.Runner.Wake).
//
// Options.Logger gets a record of each resolution, unknown answer and
// escalation, naming the record by tenant, endpoint and key_hash
// (idemkv.ID.Hash), never by its key.
//
// # Guarantees
//
//   - Exactly one outcome: every write is a compare-and-set on the token
//     the listing read (idemkv.Store.Resolve, Escalate). Two workers, a
//     worker and a late holder, or a worker and an operator never both
//     settle one record; the loser counts it in Stats.Lost.
//   - Nothing settles a record but an answer: an error, a panic, a
//     timeout, an out-of-range verdict, a result the store refuses or an
//     Apply that fails all count as Unknown.
//   - A panic in the application's code (Reconcile, Answer.Apply,
//     Options.Handles, which then takes nothing, the OnResolve and
//     OnEscalate hooks) is recovered, counted (Stats.Panics) and logged
//     with its stack at Error; it never ends the process. A panic in
//     Apply, which runs inside the store's Resolve, writes nothing: the
//     record stays as it was, is asked about again after the backoff,
//     and is escalated after MaxAttempts.
//   - An attempt is given Options.Grace past the last moment it may have
//     sent its downstream call before its record is asked about: past its
//     lease if it was abandoned (a slow holder finishes on its own
//     meanwhile), past Record.Marked if it is uncertain, at full clock
//     precision. A takeover, a renewal or a late mark moves that moment,
//     even while the question is out: the Resolve (or the Escalate that
//     gives up) carries the moment the pass judged from
//     (idemkv.ResolveRequest.Since), and the store refuses it if the
//     attempt renewed or marked its record since.
//     Record.Created, the key's first claim rounded down to the second,
//     never counts. The Resolve that settles a record fences its holder
//     off, as a takeover would.
//
// # Caveats
//
//   - A Reconciler answers NotApplied only when the downstream has seen no
//     request under the operation's key and will refuse one that arrives
//     later, or deduplicate it: a downstream that has merely not seen the
//     request yet (it may be in flight) and would then act on it must be
//     answered Unknown. No grace covers a call held back before it was
//     sent (a paused process, a stalled request, a slow network): what
//     makes the verdict final is a deadline the downstream enforces. Send
//     each call with the end of the attempt's lease as read after
//     Sending, or the call's timeout if sooner, to a downstream that
//     refuses a call arriving later (the payments example's processors
//     do), and keep Options.Grace above the call's timeout plus how far
//     the downstream's clock may lag the store's host's (the worker adds
//     what it knows of the store's lead on its host: see Options.Grace).
//     Without such a
//     downstream the identity is the line of defence: stores derive the
//     operation id from the logical request (idemkv.DeriveOperationID),
//     so the retry after NotApplied re-sends the same downstream key, and
//     a downstream that deduplicates on it absorbs a call that lands
//     late; but a client that never retries leaves that call's effect
//     without its outcome.
//   - A store that does not keep Record.Marked (one from before it
//     existed) returns uncertain records with none; the worker then counts
//     the grace from the moment it first listed the record, so a worker
//     that restarts waits it again.
//   - Attempts are counted in memory: a restarted worker asks again from
//     the first attempt. Options.MaxAge, counted from the record's
//     creation, bounds how long a record stays unsettled in all.
//   - A Reconciler that ignores its context keeps its goroutine after the
//     worker stops waiting for it.
package reconcile
