// Package saga runs multi-step workflows (the guide's reserve, authorize,
// confirm, capture) on any idemkv.Store, so that each step happens once,
// a step that fails for good has the steps before it undone, and a crashed
// runner's sagas are taken over where they stopped.
//
// # Basics
//
// A Definition lists the steps. A local step writes through Exec.Effects,
// and its writes commit atomically with the step's recovery point (the
// step's record, holding its output). A remote step acts on another
// system, sending Exec.Key as that system's idempotency key: derived from
// the saga's operation id and the step (idemkv.OperationID.StepKey), the
// same on every attempt and after any takeover, different for every step
// and every undo.
//
//	r, err := saga.New(store, saga.Definition{Name: "order", Steps: []saga.Step{
//		{Name: "reserve", Do: reserve, Undo: unreserve},
//		{Name: "authorize", Remote: true, Do: authorize, Undo: void},
//		{Name: "capture", Remote: true, Do: capture},
//	}}, nil)
//	st, err := r.Start(ctx, tenant, orderID, input)
//
// A step's Do returns its output, or an error: ErrPermanent (a declined
// card) fails the saga, and the Undo of every step before it runs, in
// reverse; ErrUnknown (a timeout) marks the step's record uncertain, and
// the saga waits (Phase Waiting) until a reconciler settles it (package
// reconcile; ActionOf tells it which action and key a record is, Done the
// result to store) and Wake goes on with it; any other error is retried
// with backoff, and after Options.MaxAttempts counts as permanent. An
// Undo that keeps failing is escalated: the saga stops (Phase Escalated)
// until an operator settles the undo's record (idemkv resolve). A Do or
// Undo that panics is a bug, not an answer: the runner recovers the panic
// and stops as if it had crashed there (ErrPanicked), and the saga is
// resumed at a later pass; an action that keeps panicking is escalated.
// Status reads where a saga stands (its current step, for an order page
// that says "authorizing").
//
// Options.Logger gets a structured record (log/slog) of every state
// change of a saga: started, taken over or woken, each step done or
// undone, a step's outcome unknown, compensating, compensated, completed
// (Info); a step failing and tried again, a lost lease (Warn); an undo
// escalated, a step that panicked (with its stack), a store error
// (Error). A record names the saga by tenant, endpoint ("saga/NAME") and
// key_hash (idemkv.ID.Hash of the saga's record), as the HTTP middleware
// names a key, and the step by name; never by the saga's id, which can
// carry customer data, and never with its input or outputs.
//
// # Guarantees
//
//   - Each action runs under its own idempotency record: a local one
//     commits once with its writes; a remote one is sent under one key,
//     however often it is tried.
//   - One runner at a time: the saga's own record is a remote, resumable
//     claim that its runner renews before every action. Another runner's
//     Start answers Running; Resume takes a saga over only after its lease
//     has run out, with the same operation id; a runner that lost the
//     saga gets ErrFenced at its next action and stops, and the action it
//     was in is fenced by that action's own record.
//   - A runner that crashes leaves the saga's record in progress: Resume,
//     from any process holding the store, finds it (idemkv.Store.List) and
//     goes on from the last recovery point.
//   - A panic in a step's Do or Undo never ends the process: it is
//     recovered, counted (Stats.Panics), logged with its stack at Error,
//     and the runner stops there as a crashed one would, writing no
//     recovery point: a local action's writes are dropped and its claim
//     given up; a remote action's record is left in progress (its call
//     may have been sent), so the runner that takes over re-sends it under
//     the same key; the saga's record stays as it was, and Resume goes on
//     with it once its lease has run out. An action that has panicked
//     Options.MaxAttempts times in one runner is escalated, as an undo
//     that keeps failing is: the saga stops (Phase Escalated) until an
//     operator settles that action's record.
//
// # Caveats
//
//   - A reconcile.Worker on the same store must leave the saga records to
//     Resume: set reconcile.Options.Handles to skip those Owns reports,
//     and give the worker a Reconciler that answers for the actions
//     (ActionOf). Set its OnResolve to call Wake, so that a saga goes on
//     as soon as its step is settled; without it, the saga waits until
//     its lease runs out and Resume takes it over.
//   - Wake goes on at once only in the runner that stopped the saga (it
//     keeps the saga's lease, in memory). Called in another process, or
//     after a restart, it takes the saga over only if its lease has run
//     out; otherwise the saga goes on once it has, at the next Resume.
//   - Panics are counted in memory, per runner: a restarted process, or
//     another one resuming the saga, counts afresh, so a step that keeps
//     panicking is escalated after Options.MaxAttempts passes of one
//     process; the saga's retention bounds the rest.
//   - Outputs are kept in the action records, bounded by the store's body
//     limit; keep them small (an authorization id).
//   - A saga is resumed only when Resume, Wake (or Start with its id)
//     runs: call Resume periodically, as serve runs its reconciler.
//   - Its records are kept for their retention class (Options.Retention;
//     the store's default, 24 h, otherwise): a saga must end within it.
//     One still open when its input expires is escalated by Resume.
package saga
