package once

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemkv/idemkv"
)

// Errors of Do. Match them with errors.Is; Do wraps them with the
// record's endpoint and key.
var (
	// ErrNoEffect marks an error of the function as proof that the
	// operation had no effect (NoEffect wraps one). Do then releases the
	// key, so that a retry runs anew, and returns the error; in remote
	// mode after a takeover, it marks the key uncertain instead
	// (ErrUncertain), since the attempt taken over may have acted.
	ErrNoEffect = errors.New("once: the operation had no effect")
	// ErrMismatch: the key was first used with another fingerprint, for
	// another operation or other input. Nothing ran. It is the caller's
	// bug (a key reused), never worth retrying.
	ErrMismatch = errors.New("once: key already used with a different fingerprint")
	// ErrReconciling: an earlier attempt's outcome is unknown (its record
	// is uncertain) and the operation will not run again until a
	// reconciler or an operator resolves it (idemkv.Store.Resolve).
	// Nothing ran. Retry later.
	ErrReconciling = errors.New("once: an earlier attempt's outcome is unknown; not run again until it is resolved")
	// ErrInProgress: another attempt holds the key, and Do did not wait
	// for it (Call.NoWait) or its context ended while it waited (the error
	// then matches the context's error too). Nothing ran. Retry later.
	ErrInProgress = errors.New("once: another attempt with this key is in progress")
	// ErrUncertain: a remote operation may or may not have taken effect:
	// its function failed without saying it had no effect, or its outcome
	// could not be stored. Its record is uncertain (unless another holder
	// took it over first), and retries get ErrReconciling until it is
	// resolved. The error also matches the cause.
	ErrUncertain = errors.New("once: outcome uncertain: the operation may or may not have taken effect")
)

// NoEffect marks err as proof that the operation had no effect: a
// validation failure before anything was sent, a downstream that refused
// the call before acting on it. Do releases the key instead of marking it
// uncertain (unless a remote call took over an earlier attempt, which
// the proof says nothing of), and returns an error matching both ErrNoEffect and err (with
// errors.Is and errors.As) whose message is err's. NoEffect(nil) is nil.
// Returning ErrNoEffect itself, or an error wrapping it, has the same
// meaning.
func NoEffect(err error) error {
	if err == nil {
		return nil
	}
	return &noEffect{err: err}
}

type noEffect struct{ err error }

// withoutNoEffect returns err without its NoEffect mark, for an error that
// no longer means the operation had no effect: its cause, if NoEffect
// marked one, else its text.
func withoutNoEffect(err error) error {
	if ne, ok := err.(*noEffect); ok && !errors.Is(ne.err, ErrNoEffect) {
		return ne.err
	}
	return errors.New(err.Error())
}

func (e *noEffect) Error() string   { return e.err.Error() }
func (e *noEffect) Unwrap() []error { return []error{ErrNoEffect, e.err} }

// DefaultPoll is the default Call.Poll.
const DefaultPoll = time.Second

// Call says which operation Do runs and how.
type Call struct {
	// ID names the operation's record: the caller's scope (Tenant), the
	// operation (Endpoint) and its idempotency key (Key), for example a
	// message id or a job id. Required.
	ID idemkv.ID
	// Fingerprint binds the key to the operation's input: a retry with
	// another fingerprint gets ErrMismatch. Required (1 to
	// idemkv.MaxFingerprintLen bytes); fingerprint.ComputePayload and
	// fingerprint.ComputeValue make one from a payload.
	Fingerprint []byte
	// Mode is where the effect lives. idemkv.ModeLocal (the default): the
	// function writes through Exec.Effects, which commit atomically with
	// its result, and it may run more than once. idemkv.ModeRemote: the
	// function acts on another system, once, sending Exec.Lease's
	// OperationID as that system's idempotency key; the claim is durable
	// before it runs.
	Mode idemkv.Mode
	// Resumable declares, in remote mode, that the downstream
	// deduplicates on the OperationID, so that a key whose holder died may
	// be taken over and its operation sent again under the same id
	// (idemkv.ClaimRequest.Resumable). Without it such a key becomes
	// uncertain. Default: off.
	Resumable bool
	// Lease bounds how long the function may run before another caller
	// may take the key over; Exec.Renew extends it. Default (zero): the
	// store's.
	Lease time.Duration
	// Retention names the store's retention class of the outcome: how
	// long it is replayed. Default (""): the store's default class.
	Retention string
	// WritesOnly declares, in local mode, that the function only writes
	// through Exec.Effects (no Get) and reads nothing of Exec but
	// Effects. On a store that runs a local operation in one step
	// (idemkv.LocalRunner: pgstore), Do then runs the function first and
	// sends its writes with the claim: one round trip and one commit
	// where a claim and a commit take two of each. Exec.Lease is then
	// zero, and a duplicate's run is discarded. A function that reads
	// after all still gets a checked read: the store runs it as a claim
	// and a commit, once more. Default: off.
	WritesOnly bool

	// NoWait answers a key held by another attempt with ErrInProgress at
	// once. Default: Do waits, claiming again every Poll (or sooner, when
	// the store says the holder's lease ends sooner, or that the holder's
	// attempt has settled: an idemkv.Watcher, such as pgstore, whose
	// holder may be another process), until the holder finishes or ctx
	// ends.
	NoWait bool
	// Poll is the longest wait between two claims while another attempt
	// holds the key. Default: DefaultPoll (1 s). Each wait costs one
	// Claim; a shorter Poll answers sooner after the holder finishes.
	Poll time.Duration
	// After waits between claims. Default: time.After. Tests inject it,
	// to wait without sleeping.
	After func(time.Duration) <-chan time.Time

	// Logger receives a structured record of every state change of the
	// key (claimed or taken over, outcome stored, released, marked
	// uncertain: Info), a lost lease (Warn), a store failure (Error),
	// and of answers that change nothing (replayed, in progress,
	// awaiting reconciliation: Debug; a fingerprint mismatch: Info). Each
	// names the key by tenant, endpoint and key_hash (idemkv.ID.Hash),
	// never by the key itself, which can carry customer data; errors and
	// notes are logged with the key taken out. Default (nil): no records,
	// as reconcile.Options.Logger; not slog.Default(), since Do is also
	// called by other packages (inbox) that log on their own. A disabled
	// level costs a call and no allocation.
	Logger *slog.Logger
	// LogRawKeys adds the raw key to every record, as "key", and keeps it
	// in errors and notes. Only for logs guarded like the data itself.
	// Default: off.
	LogRawKeys bool
}

// Outcome is what Do returns when the operation has a result.
type Outcome struct {
	// Result is the operation's result: the one the function returned,
	// or, if Replayed, the one stored by an earlier run. Its Body is the
	// caller's.
	Result idemkv.Result
	// Replayed says the operation had already completed: the function
	// did not run, and Result is the stored one.
	Replayed bool
	// OperationID is the remote operation's downstream identity (zero in
	// local mode): the one the function sent, or, if Replayed, the one
	// recorded with the outcome.
	OperationID idemkv.OperationID
}

// A Func runs the operation under a held key and returns its result.
// ctx is Do's. What it may do depends on the mode: see Exec.
type Func func(ctx context.Context, x *Exec) (idemkv.Result, error)

// Do runs fn at most once per key: it claims c.ID and, if it acquires it,
// runs fn and stores fn's result (with fn's local writes, in the same
// atomic commit) for every later Do of the key to replay.
//
//   - The key is free: fn runs. Its result and writes are committed
//     together; Do returns the result. If fn returns an error, Do returns
//     it: the key is released so that a retry runs anew (local mode, or
//     an error that NoEffect marks), or, in remote mode, marked uncertain
//     and the error matches ErrUncertain. A panic in fn settles the key
//     the same way (local: released, remote: uncertain) and is raised
//     again.
//   - The operation completed: Do returns its stored result, Replayed.
//   - The key was used with another fingerprint: ErrMismatch.
//   - An earlier attempt's outcome is unknown: ErrReconciling.
//   - Another attempt holds the key: Do waits for it (see Call.NoWait),
//     then answers as above.
//
// Errors of the store (a claim that fails, ErrNoSpace, ErrClosed, an
// invalid ID or fingerprint) are returned wrapped, fn not having run
// (with Call.WritesOnly on an idemkv.LocalRunner, fn runs before the
// claim: it may have run, and what it wrote is dropped). If the local commit fails after fn ran, the
// error is returned wrapped: after idemkv.ErrConflict or
// idemkv.ErrFenced nothing was written and the key is released; after an
// I/O error (a connection lost as the commit went out, say) the commit
// may have been made, and a call again with the same key settles it,
// replaying what was stored or running anew. Once fn has started, the key is settled even
// if ctx ends: the store writes that settle it run without ctx's
// cancellation.
func Do(ctx context.Context, st idemkv.Store, c Call, fn Func) (Outcome, error) {
	switch {
	case st == nil || fn == nil:
		return Outcome{}, fmt.Errorf("%w: once.Do needs a store and a function", idemkv.ErrInvalidArgument)
	case c.Poll < 0:
		return Outcome{}, fmt.Errorf("%w: negative Poll %v", idemkv.ErrInvalidArgument, c.Poll)
	}
	req := idemkv.ClaimRequest{ID: c.ID, Fingerprint: c.Fingerprint, Mode: c.Mode, Lease: c.Lease,
		Resumable: c.Resumable, Retention: c.Retention}
	log := newCallLog(&c)
	lr, oneStep := st.(idemkv.LocalRunner)
	oneStep = oneStep && c.WritesOnly && c.Mode == idemkv.ModeLocal
	var w watching
	defer w.stop()
	for {
		if oneStep {
			out, cl, err := runOneStep(ctx, lr, req, fn, log)
			switch {
			case errors.Is(err, errFuncFailed):
				// fn failed before the key was known: claim it first,
				// as without WritesOnly, so that a completed key replays
				// and a reused one is a mismatch whatever fn does.
				oneStep = false
				continue
			case err != nil || cl.Outcome == idemkv.Acquired:
				return out, err
			}
			if done, out, err := c.answer(ctx, st, cl, &w, log); done {
				return out, err
			}
			// Another attempt held the key, and Do waited: claim first
			// from now on, rather than run fn again at every poll.
			oneStep = false
			continue
		}
		cl, err := st.Claim(ctx, req)
		if err != nil {
			err = fmt.Errorf("once: %s: claim: %w", name(c.ID), err)
			log.log(ctx, slog.LevelError, msgClaimFailed, errAttr(err))
			return Outcome{}, err
		}
		switch cl.Outcome {
		case idemkv.Acquired:
			log.claimed(ctx, cl.Lease)
			x := &Exec{Lease: cl.Lease, store: st, lease: c.Lease, log: log}
			if clock, ok := st.(idemkv.Clock); ok {
				x.length = cl.Lease.Expires.Sub(clock.Now())
			}
			if cl.Lease.Mode == idemkv.ModeRemote {
				return x.runRemote(ctx, fn)
			}
			return x.runLocal(ctx, fn)
		}
		if done, out, err := c.answer(ctx, st, cl, &w, log); done {
			return out, err
		}
	}
}

// answer answers a claim that did not acquire the key: done, with the
// outcome or the error Do returns, or not done (the key is held by
// another attempt and Do waited: claim again).
func (c *Call) answer(ctx context.Context, st idemkv.Store, cl idemkv.Claim, w *watching, log *callLog) (done bool, out Outcome, err error) {
	switch cl.Outcome {
	case idemkv.Replay:
		log.log(ctx, slog.LevelDebug, msgReplayed, slog.Int("status", cl.Record.Result.Status))
		return true, Outcome{Result: cl.Record.Result, Replayed: true, OperationID: cl.Record.OperationID}, nil
	case idemkv.Mismatch:
		log.log(ctx, slog.LevelInfo, msgMismatch)
		return true, Outcome{}, fmt.Errorf("%w: %s", ErrMismatch, name(c.ID))
	case idemkv.Reconciling:
		log.log(ctx, slog.LevelDebug, msgReconciling, slog.Bool("escalated", cl.Record.Escalated))
		return true, Outcome{}, reconciling(c.ID, &cl.Record)
	case idemkv.InProgress:
		log.log(ctx, slog.LevelDebug, msgInProgress, slog.Bool("wait", !c.NoWait))
		if c.NoWait {
			return true, Outcome{}, fmt.Errorf("%w: %s", ErrInProgress, name(c.ID))
		}
		if err := c.wait(ctx, st, w, cl.Record.Token, cl.RetryAfter); err != nil {
			return true, Outcome{}, fmt.Errorf("%w: %s: stopped waiting: %w", ErrInProgress, name(c.ID), err)
		}
		return false, Outcome{}, nil
	}
	return true, Outcome{}, fmt.Errorf("once: %s: the store answered %v", name(c.ID), cl.Outcome)
}

// wait waits before the next claim of a key held by another attempt:
// Poll, or retryAfter (the store's estimate of when the holder's lease
// ends) if that is sooner, or until the store says the holder's attempt
// has settled (an idemkv.Watcher: pgstore, whose holder may be another
// process; token names the attempt); or until ctx ends, whose error it
// returns.
func (c *Call) wait(ctx context.Context, st idemkv.Store, w *watching, token uint64, retryAfter time.Duration) error {
	d := c.Poll
	if d == 0 {
		d = DefaultPoll
	}
	if retryAfter > 0 && retryAfter < d {
		d = retryAfter
	}
	after := c.After
	if after == nil {
		after = time.After
	}
	select {
	case <-after(d):
		return nil
	case <-w.watch(ctx, st, c.ID, token):
		// Settled, or the store lost its notifications (a database
		// restart): the next wait watches afresh, or polls if it cannot.
		w.stop()
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// watching is a Do's watch of the attempt holding its key, kept across
// its polls while the same attempt holds it: a watch counts itself on the
// holder's record, a write, so it is made once per attempt, not per poll.
type watching struct {
	token   uint64
	settled <-chan struct{} // nil: none (a store that cannot watch)
	end     func()
}

// watch returns the channel of a watch of the attempt holding id under
// token, made if there is none for it yet; nil if the store cannot watch.
func (w *watching) watch(ctx context.Context, st idemkv.Store, id idemkv.ID, token uint64) <-chan struct{} {
	if w.end != nil && w.token == token {
		return w.settled
	}
	w.stop()
	ws, ok := st.(idemkv.Watcher)
	if !ok {
		return nil
	}
	settled, end, err := ws.Watch(ctx, id, token)
	if err != nil {
		return nil
	}
	w.token, w.settled, w.end = token, settled, end
	return settled
}

// stop ends the watch, if any.
func (w *watching) stop() {
	if w.end != nil {
		w.end()
		w.token, w.settled, w.end = 0, nil, nil
	}
}

func reconciling(id idemkv.ID, rec *idemkv.Record) error {
	why := rec.Note
	if rec.Escalated {
		why = "escalated to an operator: " + why
	}
	if why == "" {
		return fmt.Errorf("%w: %s", ErrReconciling, name(id))
	}
	return fmt.Errorf("%w: %s: %s", ErrReconciling, name(id), why)
}

// name is how errors name a record: its endpoint and key hash, as the
// stores do (not its key, which can carry customer data, nor its tenant,
// which may be a principal's identifier).
func name(id idemkv.ID) string { return fmt.Sprintf("%s key_hash %s", id.Endpoint, id.Hash()) }
