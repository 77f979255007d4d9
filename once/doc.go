// Package once runs an operation at most once per idempotency key, for
// callers that are not HTTP handlers: jobs, message consumers, RPC
// handlers. It is the one-call form of the idemkv.Store contract (claim,
// run, settle), AWS Lambda Powertools' idempotent_function on idemkv:
//
//	out, err := once.Do(ctx, store, once.Call{ID: id, Fingerprint: fp}, run)
//
// where run, a Func, does the work and returns its result. Do works on any
// idemkv.Store, through the contract alone.
//
// What is guaranteed, per key:
//
//   - At most one run takes effect. A first Do runs the function and
//     stores its result; every later Do with the key returns that result
//     (Outcome.Replayed) without running anything, for as long as the
//     store retains it (Call.Retention). A Do with the key but another
//     fingerprint gets ErrMismatch.
//   - Result and writes together. In local mode the function's writes
//     (Exec.Effects: data, outbox events) commit in the same atomic,
//     durable commit as its result: after a crash both are there or
//     neither. Its reads are checked at that commit, so a
//     read-modify-write of shared data is never lost to a concurrent one.
//   - Nothing held by accident. A function that fails in local mode, or
//     that says its failure had no effect (NoEffect), releases the key: a
//     retry runs anew. (A remote function that took over an earlier
//     attempt's key proves only its own call had no effect: its key
//     becomes uncertain, as below.) A remote function that fails otherwise may have
//     acted downstream: its key becomes uncertain (ErrUncertain), and
//     retries get ErrReconciling until a reconciler resolves it (package
//     reconcile), instead of acting twice. A panic settles the key the
//     same way, then goes on. A cancelled context does not stop the key
//     from being settled.
//
// # Basics
//
// Local mode (the default) protects an effect inside the store: the
// function reads and writes business data through Exec.Effects, and
// returns a result computed from it.
//
//	fp, err := fingerprint.ComputeValue("ledger.transfer", msg, nil)
//	out, err := once.Do(ctx, store, once.Call{
//		ID:          idemkv.ID{Tenant: msg.Account, Endpoint: "ledger.transfer", Key: msg.ID},
//		Fingerprint: fp.Bytes,
//	}, func(ctx context.Context, x *once.Exec) (idemkv.Result, error) {
//		bal, err := readBalance(x.Effects, msg.Account)
//		if err != nil {
//			return idemkv.Result{}, err
//		}
//		if bal < msg.Amount {
//			return idemkv.Result{Status: 402}, nil // a final answer: stored, replayed
//		}
//		return idemkv.Result{Status: 200}, writeBalance(x.Effects, msg.Account, bal-msg.Amount)
//	})
//
// The function runs inside the store's commit of its result, once per
// commit attempt: again only when a key it read was changed by another
// commit before its own could commit (on a store whose Effects do not
// implement idemkv.ResultSetter, more often: below). It must act only
// through Effects and change nothing else that a second run would repeat.
//
// Remote mode protects an effect elsewhere (a payment provider, an email
// service). The claim is durable before the function runs, once, and it
// sends the lease's OperationID downstream as the idempotency key:
//
//	out, err := once.Do(ctx, store, once.Call{ID: id, Fingerprint: fp.Bytes, Mode: idemkv.ModeRemote, Resumable: true},
//		func(ctx context.Context, x *once.Exec) (idemkv.Result, error) {
//			if err := x.Sending(ctx); err != nil { // the lease must be this run's as the call goes out
//				return idemkv.Result{}, err // nothing sent; the key is another's, or the store is down
//			}
//			ch, err := psp.Charge(ctx, x.Lease.OperationID.StepKey("charge"), amount)
//			if errors.Is(err, psp.ErrDeclined) {
//				return idemkv.Result{Status: 402}, nil
//			}
//			if errors.Is(err, psp.ErrInvalidRequest) {
//				return idemkv.Result{}, once.NoEffect(err) // refused before acting: retry anew
//			}
//			if err != nil {
//				return idemkv.Result{}, err // unknown: the key becomes uncertain
//			}
//			return idemkv.Result{Status: 201, Pointer: ch.ID}, x.Effects.Set(chargeKey(id), []byte(ch.ID))
//		})
//
// Its local writes are deferred: they commit with the result, after the
// function returns successfully. Exec.Apply defers a function that may
// also read (a read-modify-write checked at that commit).
//
// A Do that finds the key held by another attempt waits for it, claiming
// again every Call.Poll (or when the store says the holder's lease ends),
// until it finishes or ctx ends; Call.NoWait answers ErrInProgress at once
// instead, for a consumer that would rather have its message redelivered.
//
// Call.Logger gets a structured record (log/slog) of every state change
// of the key: claimed or taken over, outcome stored, released, marked
// uncertain (Info); a lost lease (Warn); a store failure (Error); and, at
// Debug, the answers that change nothing (replayed, in progress, awaiting
// reconciliation). They carry the HTTP middleware's attributes (tenant,
// endpoint, key_hash, token, attempt, mode, operation_id) and name the
// key only by its hash (idemkv.ID.Hash): a key can carry customer data.
// Results and bodies are never logged. Without a Logger, Do logs nothing
// (not to slog.Default(): other packages call Do and log on their own).
//
// # The local result
//
// The store's Complete takes the result before it runs the function that
// makes the writes, so a local function's result cannot simply be handed
// to Complete. Do calls Complete with the zero Result and runs the
// function inside it; a run that computes another result sets it through
// the commit's Effects (idemkv.ResultSetter), so that it is stored in the
// same commit as that run's writes, its reads checked. The result stored
// is always the result of the run that committed, and the function runs
// once, or once more per conflict the store finds (Exec.Run counts the
// runs). The engine's and pgstore's Effects implement ResultSetter.
//
// On a store whose Effects do not, Do falls back to offering a result to
// each commit: the run inside it checks that the result it computed is
// the one offered; if not, the commit writes nothing and Do tries again,
// offering the new result. A commit happens only when the two agree. The
// first offer is the zero Result: a function that returns it commits on
// its first run; any other result costs one extra run to begin with, its
// writes discarded, and a result that keeps changing (a clock reading)
// fails with idemkv.ErrConflict after 32 commits.
//
// # One step
//
// A local function that only writes through Exec.Effects can declare it
// (Call.WritesOnly). On a store that runs a local operation in one step
// (idemkv.LocalRunner: pgstore's RunLocal), Do then runs the function
// first and sends its writes and result with the claim: one round trip
// and one commit where a claim and a commit take two of each. The run's
// writes are kept only if the claim acquires the key; a duplicate's run is
// discarded, and a completed key still replays. A function that fails,
// or finds the key held, is run again the usual way, under a claim.
//
// # Caveats
//
//   - A local function may run several times per Do (on conflicts, and on
//     a store without idemkv.ResultSetter; see above), and in the store's
//     commit: keep it short and free of other side effects.
//     Exec.Renew refuses to renew its lease.
//   - A local panic is stopped inside the store's commit, so that it never
//     unwinds through the store, and raised again by Do with the same
//     value; its trace then starts at Do. A remote panic is raised again
//     where it was stopped, with its trace.
//   - A remote function's deferred writes, and its result, are checked by
//     the store only when they commit, after the downstream call: a write
//     the store refuses (a key or a body too large), like any failure to
//     store the outcome, leaves the key uncertain. Keep them small and
//     valid.
//   - An uncertain key stays so until it is resolved (idemkv.Store.Resolve,
//     package reconcile, or an operator); Do does not resolve it.
//   - A holder that crashes mid-run leaves a local key to be taken over
//     when its lease ends (its writes never committed), and a remote key
//     in progress: a Resumable call takes it over under the same
//     OperationID (x.Lease.Takeover() reports it), and otherwise it
//     becomes uncertain.
//   - Waiting polls the store; it does not coalesce duplicates in one
//     process the way the HTTP middleware's Route.Wait does.
//   - A key protects the operation only for its retention window; a Do
//     after the record has expired runs anew.
package once
