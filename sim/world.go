package sim

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"sync"
	"time"
)

// ErrCrashed is what a blocking call of a process returns once the
// process has crashed: its goroutines unwind through it, and every store
// call they make on the way out fails, since a crashed process's store
// handle is closed.
var ErrCrashed = errors.New("sim: the process crashed")

// ErrTimeout is what Call returns when its reply did not come in time.
var ErrTimeout = errors.New("sim: no reply in time")

// A World is one simulated run: a virtual clock, a queue of events in
// time order, and the actors those events start or wake. One goroutine
// runs at a time: the scheduler (Run) pops an event, moves the clock to
// it and fires it; an event that starts or wakes an actor hands the actor
// the baton, and the scheduler waits until the actor blocks again (on a
// World primitive: Sleep, Call, Wait) or ends. Everything random is drawn
// from one seeded source, in an order the baton makes deterministic, so a
// seed replays the same run.
//
// Code run by actors may call anything (a store, a handler), as long as
// it waits only through the World: its clock's AfterFunc, or a blocking
// call of a Proc. A goroutine it starts and waits for (a reconciler's
// call with a timeout) may block on the World in its place; the baton
// passes with it.
type World struct {
	rng   *rand.Rand
	trace *Trace

	mu      sync.Mutex // guards the fields below: zombies read the clock
	now     time.Time
	elapsed time.Duration
	queue   eventQueue
	seq     uint64
	procs   []*Proc

	// yield is sent on by the actor holding the baton when it blocks or
	// ends.
	yield  chan struct{}
	actors sync.WaitGroup
	failed error // an actor panicked
	// checks run after every event; the first error ends the run.
	checks []func() error
	steps  int
}

// New returns a world whose clock reads start, drawing everything from
// seed.
func New(seed uint64, start time.Time) *World {
	return &World{
		rng:   rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		trace: &Trace{},
		now:   start,
		yield: make(chan struct{}),
	}
}

// Rand is the world's random source. Only the actor holding the baton, or
// the scheduler, may draw from it.
func (w *World) Rand() *rand.Rand { return w.rng }

// Trace is the run's trace.
func (w *World) Trace() *Trace { return w.trace }

// Now reads the virtual clock.
func (w *World) Now() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.now
}

// Read reads the virtual clock and the time elapsed since New: the world
// is an idemkv.SteadyClock whose wall reading never steps.
func (w *World) Read() (time.Time, time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.now, w.elapsed
}

// Logf adds a line to the trace, stamped with the virtual time.
func (w *World) Logf(format string, args ...any) {
	w.trace.add(w.Now(), fmt.Sprintf(format, args...))
}

// Check adds a check run after every event; the first error it returns
// ends the run with that error.
func (w *World) Check(fn func() error) { w.checks = append(w.checks, fn) }

// event is an entry of the queue: fire runs on the scheduler goroutine
// at at, unless cancelled, or later if its process is frozen then.
type event struct {
	at        time.Time
	tie, seq  uint64
	proc      *Proc
	fire      func()
	cancelled bool
	fired     bool
	index     int
}

type eventQueue []*event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if !q[i].at.Equal(q[j].at) {
		return q[i].at.Before(q[j].at)
	}
	if q[i].tie != q[j].tie {
		return q[i].tie < q[j].tie
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i, j
}
func (q *eventQueue) Push(x any) {
	e := x.(*event)
	e.index = len(*q)
	*q = append(*q, e)
}
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// At schedules fire to run on the scheduler goroutine after d, owned by
// p (nil: the world's): an event of a frozen process waits for it to
// thaw, and one of a dead process is dropped. Events at the same time run
// in an order drawn at random. It returns the event, for Cancel.
func (w *World) At(d time.Duration, p *Proc, fire func()) *event {
	if d < 0 {
		d = 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if p.dead {
		return nil // a zombie's: never fires, and draws nothing
	}
	tie := w.rng.Uint64()
	w.seq++
	e := &event{at: w.now.Add(d), tie: tie, seq: w.seq, proc: p, fire: fire}
	heap.Push(&w.queue, e)
	return e
}

// cancel drops e if it has not fired; it reports whether it did. Like a
// Go timer's Stop, it reports false only for an event that fired (or was
// cancelled before): one dropped because its process died never fires,
// and cancelling it reports true.
func (w *World) cancel(e *event) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if e == nil || e.cancelled || e.fired {
		return false
	}
	e.cancelled = true
	return true
}

// Go starts an actor running f now (as an event), owned by p.
func (w *World) Go(p *Proc, f func()) {
	w.At(0, p, func() { w.start(p, f) })
}

// start runs f in a new goroutine holding the baton and waits until it
// blocks or ends. An actor that panics fails the run.
func (w *World) start(p *Proc, f func()) {
	w.actors.Add(1)
	go func() {
		defer w.actors.Done()
		defer func() {
			if r := recover(); r != nil {
				w.mu.Lock()
				if w.failed == nil {
					w.failed = fmt.Errorf("sim: actor panicked: %v\n%s", r, debug.Stack())
				}
				w.mu.Unlock()
			}
			if !p.Dead() {
				w.yield <- struct{}{} // a zombie's end is nobody's business
			}
		}()
		f()
	}()
	<-w.yield
}

// A waiter is an actor blocked on the world until an event wakes it.
type waiter struct {
	p    *Proc
	seq  uint64
	ctx  context.Context // Poke wakes it once ctx is done
	wake chan struct{}
	done bool // woken, or given up on: guarded by World.mu
	val  any
	err  error
}

// block hands the baton back and sleeps until wt is woken. An actor of a
// dead process never blocks: it gets ErrCrashed at once.
func (w *World) block(wt *waiter) (any, error) {
	w.mu.Lock()
	if wt.p.dead {
		w.mu.Unlock()
		return nil, ErrCrashed
	}
	wt.p.waiters[wt] = true
	w.mu.Unlock()
	w.yield <- struct{}{}
	<-wt.wake
	return wt.val, wt.err
}

// wake wakes wt with (v, err) unless it was woken before, and waits for
// it to block again or end. It runs on the scheduler goroutine.
func (w *World) wake(wt *waiter, v any, err error) {
	w.mu.Lock()
	if wt.done {
		w.mu.Unlock()
		return
	}
	wt.done, wt.val, wt.err = true, v, err
	delete(wt.p.waiters, wt)
	w.mu.Unlock()
	wt.wake <- struct{}{}
	<-w.yield
}

// Run fires the events due by until, and leaves the clock at until, unless
// a check fails or an actor panics first. It returns the first failure.
func (w *World) Run(until time.Time) error {
	for {
		if err := w.failure(); err != nil {
			return err
		}
		e := w.next(until)
		if e == nil {
			return nil
		}
		e.fire()
		w.steps++
		if err := w.failure(); err != nil {
			return err
		}
		for _, c := range w.checks {
			if err := c(); err != nil {
				return err
			}
		}
	}
}

// Fail ends the run with err (the first failure wins). An actor calls
// it when it sees an invariant broken.
func (w *World) Fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.failed == nil {
		w.failed = err
	}
}

func (w *World) failure() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.failed
}

// next pops the next event due by until, moving the clock to it; events
// of a frozen process move to its thaw, those of a dead one are dropped.
// With none due, it moves the clock to until and returns nil.
func (w *World) next(until time.Time) *event {
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.queue.Len() > 0 {
		e := w.queue[0]
		if e.at.After(until) {
			break
		}
		heap.Pop(&w.queue)
		e.index = -1
		switch {
		case e.cancelled:
			continue
		case e.proc != nil && e.proc.dead:
			continue
		case e.proc != nil && e.proc.frozenUntil.After(e.at):
			e.at = e.proc.frozenUntil
			e.index = 0
			heap.Push(&w.queue, e)
			continue
		}
		w.advanceLocked(e.at)
		e.fired = true
		return e
	}
	w.advanceLocked(until)
	return nil
}

// advanceLocked moves the clock forward to t. REQUIRES: w.mu held.
func (w *World) advanceLocked(t time.Time) {
	if t.After(w.now) {
		w.elapsed += t.Sub(w.now)
		w.now = t
	}
}

// Steps is how many events have fired.
func (w *World) Steps() int { return w.steps }

// Close ends every process (their blocked actors unwind as after a
// crash) and waits for the world's actors to end.
func (w *World) Close() {
	for _, p := range w.procs {
		if !p.Dead() {
			p.Crash()
		}
	}
	w.actors.Wait()
}
