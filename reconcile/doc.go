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
// Unknown answers, errors, panics and timeouts are asked again after a
// jittered exponential backoff (Options.MinBackoff, MaxBackoff). After
// Options.MaxAttempts of them in a row, or once a record is older than
// Options.MaxAge, the record is escalated (idemkv.Store.Escalate): it stays
// uncertain, is never re-run or asked about again, is listed apart
// (ListRequest.Escalated) and waits for an operator (idemkv resolve).
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
//   - A holder is given its lease and Options.Grace before its record is
//     asked about, and the Resolve that settles it fences the holder off,
//     as a takeover would.
//
// # Caveats
//
//   - NotApplied must be true for good: the downstream has no trace of the
//     operation and will refuse or never receive a late request under its
//     key. A processor that merely has not seen the request yet (it is in
//     flight) is Unknown. Grace is what makes "not seen" likely final for a
//     crashed holder; choose it above the downstream call's timeout.
//   - Attempts are counted in memory: a restarted worker asks again from
//     the first attempt. Options.MaxAge, counted from the record's
//     creation, bounds how long that can go on.
//   - A Reconciler that ignores its context keeps its goroutine after the
//     worker stops waiting for it.
package reconcile
