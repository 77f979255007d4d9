package reconcile

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/idemkv/idemkv"
)

// Verdict is what a Reconciler learned about one operation downstream.
type Verdict uint8

const (
	// Unknown: the downstream could not say (it is down, the answer was
	// malformed, the call timed out). The record is asked about again
	// later, and escalated after Options.MaxAttempts or Options.MaxAge.
	Unknown Verdict = iota
	// Applied: the operation happened; Answer.Result is its outcome.
	Applied
	// NotApplied: the operation did not happen, and a request under its
	// key that arrives later will not make it happen anew: the downstream
	// has seen no request under the key, and will refuse one that arrives
	// later or deduplicate it against the retry. The record is removed
	// and a retry runs anew, under the same downstream key (the operation
	// id is derived from the logical request, idemkv.DeriveOperationID).
	// A downstream that has merely not seen the request yet (it may be in
	// flight) and would then act on it twice must answer Unknown.
	NotApplied
)

func (v Verdict) String() string {
	switch v {
	case Unknown:
		return "unknown"
	case Applied:
		return "applied"
	case NotApplied:
		return "not applied"
	}
	return fmt.Sprintf("Verdict(%d)", uint8(v))
}

// Answer is a Reconciler's answer about one record.
type Answer struct {
	Verdict Verdict
	// Result is stored as the record's outcome (Applied only).
	Result idemkv.Result
	// Apply, if non-nil, adds business writes that commit atomically with
	// the resolution (Applied or NotApplied): the local row of a charge
	// the processor confirmed, say.
	Apply func(idemkv.Effects) error
	// Reason, for Unknown, says why; it becomes the escalation note if
	// this was the last attempt.
	Reason string
}

// A Reconciler asks the downstream what became of one operation. rec is
// the record as listed: its OperationID (and the step keys derived from
// it) names the operation downstream, its Fingerprint the request.
// Reconcile must honour ctx: the worker stops waiting for it at
// Options.Timeout and counts the attempt as Unknown. An error, a panic or
// an out-of-range verdict counts as Unknown too; none of them settles the
// record.
type Reconciler interface {
	Reconcile(ctx context.Context, rec idemkv.Record) (Answer, error)
}

// ReconcilerFunc adapts a function to a Reconciler.
type ReconcilerFunc func(ctx context.Context, rec idemkv.Record) (Answer, error)

// Reconcile calls f.
func (f ReconcilerFunc) Reconcile(ctx context.Context, rec idemkv.Record) (Answer, error) {
	return f(ctx, rec)
}

// A Settler is the application's side of a settlement made by hand: an
// operator who learned what became of an operation (idemkv resolve, or
// package admin) settles its record through it, so that the service's
// own writes go with the resolution, as they go with a Reconciler's
// answer (the payment row for an applied charge, the hold given back for
// one that had no effect). Given the record and the operator's verdict
// (Applied with the result they give, or NotApplied), Settle returns the
// Answer to commit: its Result (Applied: the result to store, which it
// may rebuild) and Apply, committed atomically with the resolution. An
// error refuses the settlement; nothing is written.
type Settler interface {
	Settle(ctx context.Context, rec idemkv.Record, verdict Verdict, result idemkv.Result) (Answer, error)
}

// Options configure a Worker. The zero value is usable with the defaults
// below.
type Options struct {
	// Clock tells the time of backoff, grace and age, compared with the
	// records' times. Default: the store's own clock when the store tells
	// time (an idemkv.Clock: *engine.Engine, *pgstore.Store, whose clock is
	// the database's), so that a step or skew of this process's wall clock
	// neither holds records back nor asks about them early; else the
	// system clock.
	Clock idemkv.Clock
	// Interval is how often Run starts a pass. Default: 1 s.
	Interval time.Duration
	// Grace is how long the worker leaves a record after the last moment
	// its current attempt may have sent its downstream call, before it
	// asks about it: the call may still be in flight until then, and a
	// downstream asked too early says it saw nothing. That moment is,
	// for an abandoned record (remote, in progress, its lease run out),
	// its LeaseExpires, as last renewed: a holder sends nothing once its
	// lease has run out, and a slow holder, not gone, finishes on its own
	// meanwhile. For an uncertain record it is Record.Marked: its holder
	// marked it, or a claim found its lease run out. For an uncertain
	// record whose store did not keep Marked (zero), it is the moment
	// this worker first listed it (kept in memory: a restarted worker
	// waits the grace again). Never Record.Created, which is the key's
	// first claim, rounded down to the second and kept by takeovers. Full
	// clock precision: a grace under a second is honoured.
	//
	// Keep it above the downstream call's timeout, plus how far the
	// downstream's clock may lag the store's, where calls carry a deadline
	// the downstream enforces (the end of the lease, or the timeout if
	// sooner: see the package's Caveats): a NotApplied is then never
	// answered while a call can still land. While Clock runs ahead of its
	// host's wall clock (an idemkv.OffsetClock: an engine after a step
	// back of the wall clock), the worker waits that much longer, so
	// the lag to allow for is the downstream's behind this host's clock. Where they do not, a call
	// held back by a pause or a slow network can land later than any
	// grace, and only the downstream identity protects the retry.
	// Default: DefaultGrace.
	Grace time.Duration
	// MinBackoff and MaxBackoff bound the wait before a record that got
	// Unknown is asked about again: MinBackoff doubled per attempt, capped
	// at MaxBackoff, with jitter (a random half of it), so that many
	// records that failed together do not retry together. Defaults: 1 s
	// and 5 min.
	MinBackoff, MaxBackoff time.Duration
	// MaxAttempts escalates a record after that many Unknown answers in a
	// row. Default: 20. Attempts are counted in memory, per worker; a
	// restart begins them again, which MaxAge bounds.
	MaxAttempts int
	// MaxAge escalates a record older than this (by Record.Created, the
	// key's first claim: it bounds how long a record stays unsettled in
	// all, across takeovers and restarts), whatever its attempts, once it
	// is due. Default: 24 h.
	MaxAge time.Duration
	// Timeout bounds one Reconcile call. Default: 10 s.
	Timeout time.Duration
	// Concurrency is how many Reconcile calls a pass makes at once.
	// Default: 4.
	Concurrency int
	// PerPass caps the records one pass reads from the listing; the next
	// pass goes on where it stopped, so every record is reached. Default:
	// 1000.
	PerPass int
	// Tenant, if set, limits the worker to that tenant's records.
	Tenant string
	// Handles, if set, limits the worker to the records it returns true
	// for; the others are left alone (a saga runner resumes its own
	// records, say). Default: every record.
	Handles func(rec idemkv.Record) bool
	// OnEscalate, if set, is called after a record is escalated, with the
	// record as it was and the note written on it: page someone.
	OnEscalate func(rec idemkv.Record, note string)
	// OnResolve, if set, is called after this worker has resolved a
	// record (Applied or NotApplied), with the record as it was listed
	// and the verdict, so that what waited on the record goes on at once:
	// saga.Runner.Wake resumes the saga whose step it was, instead of
	// leaving it until the saga's lease runs out. It runs in the pass, in
	// the goroutine that settled the record, and the pass waits for it
	// (it holds one of the pass's Concurrency slots meanwhile); it must
	// honour ctx. A panic in it is recovered and counted (Stats.Panics);
	// the record stays resolved. Default: none.
	OnResolve func(ctx context.Context, rec idemkv.Record, verdict Verdict)
	// Logger receives a structured record of what the worker does to
	// each record: resolved (Info), an unknown answer (Warn), escalated
	// (Error), a settling write lost to another (Debug), a store error
	// (Warn). Each names the record by tenant, endpoint, key_hash
	// (idemkv.ID.Hash) and token, never by its key, which can carry
	// customer data; the key is taken out of the errors and notes logged
	// too. Default: none (see Logf).
	Logger *slog.Logger
	// Logf, if set and Logger is not, receives the same records as lines
	// of text. Default: nothing.
	Logf func(format string, args ...any)
	// Rand draws the jitter. Default: a random seed.
	Rand *rand.Rand
}

// DefaultGrace is Options.Grace when it is zero.
const DefaultGrace = 10 * time.Second

func (o Options) withDefaults() Options {
	o.Interval = cmp.Or(o.Interval, time.Second)
	o.Grace = cmp.Or(o.Grace, DefaultGrace)
	o.MinBackoff = cmp.Or(o.MinBackoff, time.Second)
	o.MaxBackoff = cmp.Or(o.MaxBackoff, 5*time.Minute)
	o.MaxAttempts = cmp.Or(o.MaxAttempts, 20)
	o.MaxAge = cmp.Or(o.MaxAge, 24*time.Hour)
	o.Timeout = cmp.Or(o.Timeout, 10*time.Second)
	o.Concurrency = cmp.Or(o.Concurrency, 4)
	o.PerPass = cmp.Or(o.PerPass, 1000)
	if o.Clock == nil {
		o.Clock = idemkv.SystemClock{}
	}
	if o.Rand == nil {
		o.Rand = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	return o
}

// Stats counts a worker's work since New.
type Stats struct {
	Passes int64
	// Asked counts Reconcile calls; Applied, NotApplied and Unknown their
	// answers (errors, panics, timeouts, bad verdicts and answers whose
	// Apply failed or panicked are Unknown, and also counted in Errors).
	Asked, Applied, NotApplied, Unknown, Errors int64
	// Panics counts the panics recovered from the application's code:
	// in Reconcile and in Answer.Apply (each also an error and an
	// Unknown answer: nothing is written, the record is asked about again
	// after the backoff, and escalated after MaxAttempts), and in the
	// OnResolve and OnEscalate hooks (after their record was settled).
	Panics int64
	// Escalated counts records this worker escalated.
	Escalated int64
	// Lost counts settling writes that lost to another (a holder that
	// finished, another worker, an operator): the record was settled, not
	// by this worker.
	Lost int64
	// StoreErrors counts failed listings and settling writes (retried at
	// the next pass); LastError is the latest.
	StoreErrors int64
	LastError   string
}

// Worker drives the records that need settling (idemkv.Store.List)
// through a Reconciler.
type Worker struct {
	store idemkv.Store
	r     Reconciler
	o     Options

	mu      sync.Mutex
	backoff map[idemkv.ID]retry // records seen without Marked, or that got Unknown, by ID
	cursor  string              // where the next pass's listing starts
	// listed are the records the passes since the listing's start have
	// read: once they reach its end, the backoff of any other is
	// forgotten (its record was settled or removed meanwhile).
	listed map[idemkv.ID]bool
	stats  Stats
}

// retry is what the worker keeps in memory about one record: when it
// first listed it, if its store did not say when it was marked, and its
// Unknown answers.
type retry struct {
	token    uint64    // the record's token: a new one starts afresh
	seen     time.Time // when first listed, for an uncertain record with no Marked
	attempts int       // Unknown answers in a row
	next     time.Time // not asked again before
}

// New returns a worker that settles store's records through r.
func New(store idemkv.Store, r Reconciler, opts *Options) (*Worker, error) {
	if store == nil || r == nil {
		return nil, errors.New("reconcile: a store and a reconciler are required")
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if c, ok := store.(idemkv.Clock); ok && o.Clock == nil {
		o.Clock = c
	}
	for name, v := range map[string]int64{"Interval": int64(o.Interval), "Grace": int64(o.Grace),
		"MinBackoff": int64(o.MinBackoff), "MaxBackoff": int64(o.MaxBackoff), "MaxAge": int64(o.MaxAge),
		"Timeout": int64(o.Timeout), "MaxAttempts": int64(o.MaxAttempts), "Concurrency": int64(o.Concurrency),
		"PerPass": int64(o.PerPass)} {
		if v < 0 {
			return nil, fmt.Errorf("%w: reconcile.Options.%s is negative", idemkv.ErrInvalidArgument, name)
		}
	}
	o = o.withDefaults()
	if o.MinBackoff > o.MaxBackoff {
		return nil, fmt.Errorf("%w: MinBackoff %v above MaxBackoff %v", idemkv.ErrInvalidArgument, o.MinBackoff, o.MaxBackoff)
	}
	return &Worker{store: store, r: r, o: o, backoff: make(map[idemkv.ID]retry)}, nil
}

// Run makes a pass every Options.Interval until ctx ends, and returns
// ctx's error. A failed pass is logged and counted; the next one runs on
// schedule.
func (w *Worker) Run(ctx context.Context) error {
	t := time.NewTicker(w.o.Interval)
	defer t.Stop()
	for {
		if err := w.Pass(ctx); err != nil && ctx.Err() == nil {
			w.log(ctx, slog.LevelWarn, "reconcile: pass failed, will retry", nil, slog.Any("err", err))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Interval is the time between the starts of Run's passes.
func (w *Worker) Interval() time.Duration { return w.o.Interval }

// Stats returns the worker's counts.
func (w *Worker) Stats() Stats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stats
}
