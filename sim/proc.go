package sim

import (
	"context"
	"slices"
	"time"

	"github.com/idemkv/idemkv"
)

// A Proc is a simulated process: the owner of actors, timers and the
// messages sent to it. A process can crash (its actors stop where they
// are blocked, its timers and undelivered messages are dropped, and what
// it registered with OnCrash runs: closing its store handle, say) and be
// frozen for a while (a pause of the whole process, as a long garbage
// collection or a stopped VM makes: nothing of it runs, its timers and
// messages wait). A Proc is an idemkv.TimerClock and an
// idemkv.SteadyClock on the world's time, so that the stores, the
// middleware's heartbeats and the reconciler it runs are driven by the
// world.
type Proc struct {
	w    *World
	name string

	// Guarded by w.mu.
	dead        bool
	frozenUntil time.Time
	waiters     map[*waiter]bool
	onCrash     []func()
}

var (
	_ idemkv.TimerClock  = (*Proc)(nil)
	_ idemkv.SteadyClock = (*Proc)(nil)
)

// NewProc adds a process named name (for the trace).
func (w *World) NewProc(name string) *Proc {
	p := &Proc{w: w, name: name, waiters: make(map[*waiter]bool)}
	w.mu.Lock()
	w.procs = append(w.procs, p)
	w.mu.Unlock()
	return p
}

// Name is the process's name.
func (p *Proc) Name() string { return p.name }

// World is the process's world.
func (p *Proc) World() *World { return p.w }

// Now implements idemkv.Clock.
func (p *Proc) Now() time.Time { return p.w.Now() }

// Read implements idemkv.SteadyClock.
func (p *Proc) Read() (time.Time, time.Duration) { return p.w.Read() }

// AfterFunc implements idemkv.TimerClock: f runs as an actor of p once d
// has passed, unless stop is called first or p has crashed.
func (p *Proc) AfterFunc(d time.Duration, f func()) (stop func() bool) {
	e := p.w.At(d, p, func() { p.w.start(p, f) })
	if e == nil {
		return func() bool { return true } // p is dead: f never runs
	}
	return func() bool { return p.w.cancel(e) }
}

// Dead reports whether p has crashed.
func (p *Proc) Dead() bool {
	p.w.mu.Lock()
	defer p.w.mu.Unlock()
	return p.dead
}

// OnCrash registers f to run when p crashes, before its blocked actors
// are released: close the process's store handle here, so that nothing
// they do on their way out reaches the store.
func (p *Proc) OnCrash(f func()) {
	p.w.mu.Lock()
	defer p.w.mu.Unlock()
	p.onCrash = append(p.onCrash, f)
}

// Crash kills p. It runs on the scheduler goroutine (from an event of
// another process, or of the world): none of p's actors is running.
// The actors blocked in p's calls are then released with ErrCrashed and
// unwind on their own, outside the world: they may touch nothing but
// what p owned.
func (p *Proc) Crash() {
	p.w.mu.Lock()
	if p.dead {
		p.w.mu.Unlock()
		return
	}
	p.dead = true
	hooks := p.onCrash
	p.onCrash = nil
	var ws []*waiter
	for wt := range p.waiters {
		wt.done, wt.err = true, ErrCrashed
		ws = append(ws, wt)
	}
	clear(p.waiters)
	p.w.mu.Unlock()
	p.w.Logf("%s: crashed", p.name)
	for _, f := range hooks {
		f()
	}
	for _, wt := range ws {
		wt.wake <- struct{}{} // it runs on as a zombie: not waited for
	}
}

// Freeze pauses p for d: nothing of it runs until then.
func (p *Proc) Freeze(d time.Duration) {
	p.w.mu.Lock()
	defer p.w.mu.Unlock()
	if until := p.w.now.Add(d); until.After(p.frozenUntil) {
		p.frozenUntil = until
	}
}

// newWaiter is a waiter of p, woken by Poke once ctx is done.
func (p *Proc) newWaiter(ctx context.Context) *waiter {
	p.w.mu.Lock()
	defer p.w.mu.Unlock()
	p.w.seq++
	return &waiter{p: p, seq: p.w.seq, ctx: ctx, wake: make(chan struct{})}
}

// Sleep blocks the calling actor for d. It fails only with ErrCrashed.
func (p *Proc) Sleep(d time.Duration) error {
	wt := p.newWaiter(context.Background()) // never done: not woken by Poke
	p.w.At(d, p, func() { p.w.wake(wt, nil, nil) })
	_, err := p.w.block(wt)
	return err
}

// Call sends a request and blocks the calling actor until its reply, the
// timeout (ErrTimeout; zero: none) or the end of ctx (ctx's error, once
// Poke notices it). send sends the request and arranges for reply to be
// called, on the scheduler goroutine, with the answer: typically from the
// delivery of a reply message to p (Net.Send). A reply after the call
// ended is dropped.
func (p *Proc) Call(ctx context.Context, timeout time.Duration, send func(reply func(v any, err error))) (any, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if p.Dead() {
		return nil, ErrCrashed
	}
	wt := p.newWaiter(ctx)
	send(func(v any, err error) { p.w.wake(wt, v, err) })
	var te *event
	if timeout > 0 {
		te = p.w.At(timeout, p, func() { p.w.wake(wt, nil, ErrTimeout) })
	}
	v, err := p.w.block(wt)
	p.w.cancel(te)
	return v, err
}

// Poke wakes, with their context's error, the actors of p blocked in a
// Call whose context has ended, as an event that runs next. Call it after
// cancelling a context an actor of p may be waiting under, as a server
// does when its client goes away.
func (p *Proc) Poke() { p.w.At(0, p, p.poke) }

func (p *Proc) poke() {
	p.w.mu.Lock()
	var ended []*waiter
	for wt := range p.waiters {
		if wt.ctx != nil && wt.ctx.Err() != nil {
			ended = append(ended, wt)
		}
	}
	p.w.mu.Unlock()
	slices.SortFunc(ended, func(a, b *waiter) int { return int(a.seq) - int(b.seq) })
	for _, wt := range ended {
		p.w.wake(wt, nil, wt.ctx.Err())
	}
}
