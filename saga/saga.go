package saga

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/idemkv/idemkv"
)

// Errors a step's Do or Undo returns (wrapped or not) to say how it
// failed. Any other error is transient: the step is tried again, up to
// Options.MaxAttempts, and after the last try a Do fails for good. So a
// remote step returns a transient error only when its call provably had
// no effect (refused before it was sent, or by a downstream that says
// so), and ErrUnknown for any other end of a call that was sent.
var (
	// ErrPermanent: the step failed for good (a declined card, stock that
	// is not there). A Do that fails so is not retried; the steps before
	// it are compensated. An Undo that fails so is escalated.
	ErrPermanent = errors.New("saga: step failed permanently")
	// ErrUnknown: a remote step cannot tell whether its effect happened
	// (a timeout). Its record is marked uncertain, and the saga waits
	// until a reconciler settles it.
	ErrUnknown = errors.New("saga: step outcome unknown")
)

// Errors of a Runner.
var (
	// ErrMismatch: the saga's id was started with other input.
	ErrMismatch = errors.New("saga: id already started with other input")
	// ErrNotFound: no saga was started under the id.
	ErrNotFound = errors.New("saga: not found")
	// ErrInputExpired: Start of a saga still open past its records'
	// retention: its input has expired, and so may the records of its
	// first steps, so it is not run again from what is left. Resume
	// escalates it for an operator once its lease has run out.
	ErrInputExpired = errors.New("saga: its input has expired")
	// ErrPanicked: a step's Do or Undo panicked. The runner recovered the
	// panic and stopped, as if it had crashed there: nothing of the
	// action was stored (a local action's claim is given up, a remote
	// one's left to run out), the saga's record is left in progress, and
	// Resume goes on with it once its lease has run out.
	ErrPanicked = errors.New("saga: a step panicked")
)

// Step is one step of a saga.
type Step struct {
	// Name names the step, unique in its saga ("reserve", "authorize").
	Name string
	// Remote says the step acts on another system: its record is durable
	// before Do runs, Do sends x.Key as the downstream's idempotency key,
	// and an ErrUnknown is settled by a reconciler. A local step writes
	// through x.Effects, which commit with the step's recovery point.
	Remote bool
	// Do runs the step and returns its output (kept with the step, at
	// most the store's body limit), for later steps and for Undo.
	Do func(ctx context.Context, x *Exec) ([]byte, error)
	// Undo compensates a step that completed, once a later step has
	// failed for good; nil if there is nothing to undo. It runs as an
	// operation of its own, with its own key, as Do does.
	Undo func(ctx context.Context, x *Exec) error
}

// Exec is what a step's Do or Undo is given.
type Exec struct {
	Tenant, ID string
	Input      []byte
	// Key is the downstream idempotency key of this action (the step's Do,
	// or its Undo): derived from the saga's operation id and the action,
	// the same on every attempt and after any runner takes over.
	Key string
	// Effects takes a local action's writes; they commit atomically with
	// the action's recovery point. Nil for a remote action.
	Effects idemkv.Effects
	outputs map[string][]byte
	sending func(context.Context) error // a remote action's: see Sending
	lease   *idemkv.Lease               // a remote action's, as Sending left it
}

// Output returns the output of a completed earlier step, or nil.
func (x *Exec) Output(step string) []byte { return x.outputs[step] }

// Sending makes sure a remote action still holds its lease, and is called
// right before its downstream call. With less than half of the lease left
// by the runner's clock (the action was slow, or its process paused) it
// renews the lease, durably: a reconciler that judged the action's record
// abandoned meanwhile then settles nothing (idemkv.ResolveRequest.Since).
// It fails, and the call must not be sent, with idemkv.ErrFenced when the
// lease was lost (another runner took the action over, or a reconciler or
// an operator settled it), or with the store's error: the action then
// returns that error, as one that had no effect. A local action has
// nothing to send: nil.
func (x *Exec) Sending(ctx context.Context) error {
	if x.sending == nil {
		return nil
	}
	return x.sending(ctx)
}

// LeaseExpires is the end of a remote action's lease, as Sending left it
// (zero for a local action): the last moment its downstream call may be
// acted on. A downstream that can refuse a call arriving after a
// deadline should be sent it as one: a reconciler, which asks about the
// action only a grace past that end, then hears a "not applied" that no
// call held back on its way can falsify.
func (x *Exec) LeaseExpires() time.Time {
	if x.lease == nil {
		return time.Time{}
	}
	return x.lease.Expires
}

// Definition is a saga: its name and its steps, in order.
type Definition struct {
	Name  string
	Steps []Step
}

// Options configure a Runner.
type Options struct {
	// Lease is how long a runner holds a saga between renewals (it renews
	// before each step); a runner that crashes leaves it to others after
	// that. Default: the store's.
	Lease time.Duration
	// MaxAttempts bounds the tries of an action that fails transiently:
	// a Do then fails the saga (its earlier steps are compensated), an
	// Undo is escalated. It also bounds the panics of one action, counted
	// by the runner across runs (in memory): an action that has panicked
	// that often is escalated, Do or Undo. Default: 5.
	MaxAttempts int
	// MinBackoff and MaxBackoff bound the wait between tries: doubling
	// from MinBackoff. Defaults: 100 ms, and 5 s or MinBackoff if
	// longer. New refuses a MaxBackoff below MinBackoff.
	MinBackoff, MaxBackoff time.Duration
	// After waits between tries. Default: a wait on Clock, through
	// idemkv.AfterFunc (Go's timers, unless Clock is an
	// idemkv.TimerClock). Tests inject it.
	After func(time.Duration) <-chan time.Time
	// Clock tells the time that the leases of the sagas this runner
	// stopped to wait on a step (see Runner.Wake) are compared with, so
	// that it forgets those that have run out, and that Exec.Sending
	// reads an action's lease by. Default: the store, if it
	// tells the time (an *engine.Engine and a *pgstore.Store do), else
	// the wall clock.
	Clock idemkv.Clock
	// Retention names the retention class of every record of a saga (its
	// input, its recovery points, its outcome); "" is the store's default.
	// A saga must end within it: a saga still waiting (on a reconciler,
	// an operator) when its input expires is escalated by Resume.
	Retention string
	// Logger receives a structured record of every state change of a
	// saga: started or taken over, a step done or undone, a step's
	// outcome unknown, compensating, compensated, completed (Info); a
	// step that failed and is tried again, a lost lease (Warn); an undo
	// escalated, a step that panicked (with its stack), a store error
	// (Error). Each names the saga by tenant,
	// endpoint ("saga/NAME"), key_hash (idemkv.ID.Hash of the saga's
	// record) and token, and the step by name: never by the saga's id,
	// which can carry customer data, and never with its input or
	// outputs. Default (nil): no records, as reconcile.Options.Logger.
	Logger *slog.Logger
	// LogRawKeys adds the saga's id to every record, as "key", and keeps
	// it in errors and notes. Only for logs guarded like the data itself.
	// Default: off.
	LogRawKeys bool
}

// Phase is where a saga stands.
type Phase string

// Phases.
const (
	// Running: a runner is at work on Status.Step.
	Running Phase = "running"
	// Waiting: Status.Step's outcome is unknown; a reconciler settles it,
	// and Resume (or Start) then goes on.
	Waiting Phase = "waiting"
	// Escalated: an undo kept failing, or an action kept panicking, and
	// was escalated; an operator settles its record (idemkv resolve), and
	// Resume then goes on. Or the saga stayed open past its records'
	// retention, and Resume escalated the saga's own record (Step ""):
	// an operator settles the saga by hand.
	Escalated Phase = "escalated"
	// Completed: every step completed.
	Completed Phase = "completed"
	// Compensated: a step failed for good and the steps before it were
	// undone.
	Compensated Phase = "compensated"
)

// Status is a saga's state.
type Status struct {
	Phase Phase
	// Step is the step being run, waited on or undone; "" once the saga
	// has ended.
	Step string
	// Compensating says the saga is undoing its steps (Failure says why).
	Compensating bool
	Failure      string
	// Outputs are the outputs of the steps that completed.
	Outputs map[string][]byte
}

// Runner runs the sagas of one Definition on a store.
type Runner struct {
	store idemkv.Store
	def   Definition
	o     Options

	mu struct {
		sync.Mutex
		// parked holds the leases of the sagas this runner stopped to
		// wait on an action (Phase Waiting or Escalated), by tenant and
		// id: it still holds them, so Wake can go on at once once the
		// action is settled. Resume forgets those that have run out.
		parked map[sagaRef]idemkv.Lease
		panics map[idemkv.ID]int // panics of each action, by its record, since it last ended
		stats  Stats
	}
}

// sagaRef names a saga: its tenant and id.
type sagaRef struct{ tenant, id string }

// Stats counts a runner's work since New.
type Stats struct {
	// Panics counts the panics recovered from steps' Do and Undo.
	Panics int64
	// Woken counts the sagas Wake went on with at once, under the lease
	// this runner kept when it stopped them to wait.
	Woken int64
}

// Name is the name of the runner's sagas (Definition.Name).
func (r *Runner) Name() string { return r.def.Name }

// Steps returns the names of the runner's steps, in order, and whether
// each has an Undo.
func (r *Runner) Steps() (names []string, undoable []bool) {
	for _, s := range r.def.Steps {
		names, undoable = append(names, s.Name), append(undoable, s.Undo != nil)
	}
	return names, undoable
}

// Stats returns the runner's counts.
func (r *Runner) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.mu.stats
}

// New returns a runner of def on store.
func New(store idemkv.Store, def Definition, opts *Options) (*Runner, error) {
	if store == nil {
		return nil, errors.New("saga: a store is required")
	}
	if def.Name == "" || strings.Contains(def.Name, "/") || len(def.Steps) == 0 {
		return nil, fmt.Errorf("%w: a saga needs a name without '/' and at least one step", idemkv.ErrInvalidArgument)
	}
	seen := map[string]bool{}
	for _, s := range def.Steps {
		if s.Name == "" || strings.Contains(s.Name, "/") || seen[s.Name] || s.Do == nil {
			return nil, fmt.Errorf("%w: step %q: every step needs a unique name without '/' and a Do", idemkv.ErrInvalidArgument, s.Name)
		}
		seen[s.Name] = true
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Lease < 0 || o.MinBackoff < 0 || o.MaxBackoff < 0 || o.MaxAttempts < 0 {
		return nil, fmt.Errorf("%w: negative Lease, MaxAttempts, MinBackoff or MaxBackoff", idemkv.ErrInvalidArgument)
	}
	if o.MinBackoff != 0 && o.MaxBackoff != 0 && o.MaxBackoff < o.MinBackoff {
		return nil, fmt.Errorf("%w: MinBackoff %v above MaxBackoff %v", idemkv.ErrInvalidArgument, o.MinBackoff, o.MaxBackoff)
	}
	o.MaxAttempts = cmp.Or(o.MaxAttempts, 5)
	o.MinBackoff = cmp.Or(o.MinBackoff, 100*time.Millisecond)
	o.MaxBackoff = cmp.Or(o.MaxBackoff, max(o.MinBackoff, 5*time.Second))
	if o.Clock == nil {
		if c, ok := store.(idemkv.Clock); ok {
			o.Clock = c
		} else {
			o.Clock = idemkv.SystemClock{}
		}
	}
	if o.After == nil {
		c := o.Clock
		o.After = func(d time.Duration) <-chan time.Time {
			ch := make(chan time.Time, 1)
			idemkv.AfterFunc(c, d, func() { ch <- c.Now() })
			return ch
		}
	}
	r := &Runner{store: store, def: def, o: o}
	r.mu.parked = map[sagaRef]idemkv.Lease{}
	r.mu.panics = map[idemkv.ID]int{}
	return r, nil
}

// The records of a saga, all keyed by the saga's id in its tenant:
//
//	saga/NAME              the saga itself: remote and resumable, held by
//	                       its runner; completed when the saga ends
//	saga/NAME/input        the input, stored before the saga record
//	saga/NAME/do/STEP      each step's recovery point: its output, or its
//	                       permanent failure
//	saga/NAME/undo/STEP    each compensation's
func (r *Runner) endpoint() string { return EndpointPrefix + r.def.Name }

// EndpointPrefix begins the endpoint of every record a saga keeps: its
// own (saga/NAME) and its actions' (saga/NAME/do/STEP, .../undo/STEP).
// Their outcomes are a saga's, not HTTP responses.
const EndpointPrefix = "saga/"

func (r *Runner) id(tenant, id, suffix string) idemkv.ID {
	e := r.endpoint()
	if suffix != "" {
		e += "/" + suffix
	}
	return idemkv.ID{Tenant: tenant, Endpoint: e, Key: id}
}

// Owns reports whether rec is the saga record of one of this runner's
// sagas, which Resume takes over; a reconcile.Worker should leave those
// alone (reconcile.Options.Handles), and settle the step records.
func (r *Runner) Owns(rec idemkv.Record) bool { return rec.ID.Endpoint == r.endpoint() }

// Result statuses of the records.
const (
	statusDone   = 200 // a step's or an undo's output, or a completed saga
	statusFailed = 422 // a step that failed for good; its reason
	statusUndone = 409 // a compensated saga; the failure
)

func fingerprint(input []byte) []byte {
	h := sha256.Sum256(input)
	return h[:16]
}

var stepFP = []byte("saga-step")
