package events

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/bench"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/outbox"
)

// OverheadPoint is one concurrency of the overhead sweep: completions
// with one event against the same without, Options.Rounds times.
type OverheadPoint struct {
	Concurrency int `json:"concurrency"` // the number of concurrent clients
	// Rounds are the measurements, in order; each ran both sides back to
	// back on fresh stores.
	Rounds []OverheadRound `json:"rounds"`
	// WithoutRequestsPerSec is the mean throughput without an event over
	// the rounds, requests/s.
	WithoutRequestsPerSec float64 `json:"without_requests_per_sec"`
	// WithRequestsPerSec is the mean throughput with one event over the
	// rounds, requests/s.
	WithRequestsPerSec float64 `json:"with_requests_per_sec"`
	// Ratio is the geometric mean of the rounds' ratios, with / without:
	// the goal is at least 0.85 at 64 clients.
	Ratio float64 `json:"ratio"`
	// RatioMin and RatioMax are the smallest and largest of the rounds'
	// ratios.
	RatioMin float64 `json:"ratio_min"`
	RatioMax float64 `json:"ratio_max"` // see RatioMin
}

// OverheadRound is one measurement of both sides of a point.
type OverheadRound struct {
	// WithFirst says the side with an event ran first in this round.
	WithFirst bool    `json:"with_first"`
	Without   Side    `json:"without"` // completions without an event
	With      Side    `json:"with"`    // completions with one event each
	Ratio     float64 `json:"ratio"`   // With.RequestsPerSec / Without.RequestsPerSec
}

// Side is one side of a round: completions with or without an event,
// closed-loop, for Options.Duration on a fresh store.
type Side struct {
	Requests       int64   `json:"requests"`         // the number of requests completed
	RequestsPerSec float64 `json:"requests_per_sec"` // their throughput, requests/s
	// Latency is a request's latency, the claim and the Complete, in µs.
	Latency bench.Latency `json:"latency_us"`
	// CPUSecondsPerRequest is the process's CPU time over the side per
	// request, in seconds: the relay's included.
	CPUSecondsPerRequest float64 `json:"cpu_seconds_per_request"`
	// Backlog is the number of events committed but not yet acknowledged
	// by the relay when the side's clients stopped (all of them with
	// Options.NoRelay).
	Backlog uint64 `json:"backlog"`
	// RelayAcks is the number of acknowledgements the relay committed
	// during the side (each a synced batch through the committer).
	RelayAcks int64 `json:"relay_acks"`
	// VerifiedKeys is how many completed keys were checked afterwards.
	VerifiedKeys int `json:"verified_keys"`
	// CommitFigures are the engine committer's work over the side.
	bench.CommitFigures
}

// overhead measures every point of the sweep.
func (r *runner) overhead(ctx context.Context) ([]OverheadPoint, error) {
	var pts []OverheadPoint
	for _, conc := range r.o.Concurrency {
		pt := OverheadPoint{Concurrency: conc, RatioMin: math.Inf(1)}
		logSum := 0.0
		for round := range r.o.Rounds {
			rd := OverheadRound{WithFirst: round%2 == 1}
			for _, with := range []bool{rd.WithFirst, !rd.WithFirst} {
				s, err := r.side(ctx, conc, with)
				if err != nil {
					return nil, fmt.Errorf("bench: events: %s at concurrency %d: %w", sideName(with), conc, err)
				}
				if with {
					rd.With = s
				} else {
					rd.Without = s
				}
				r.run.Step(fmt.Sprintf("overhead c=%d %s", conc, sideName(with)))
			}
			rd.Ratio = rd.With.RequestsPerSec / rd.Without.RequestsPerSec
			pt.Rounds = append(pt.Rounds, rd)
			pt.WithRequestsPerSec += rd.With.RequestsPerSec / float64(r.o.Rounds)
			pt.WithoutRequestsPerSec += rd.Without.RequestsPerSec / float64(r.o.Rounds)
			logSum += math.Log(rd.Ratio)
			pt.RatioMin, pt.RatioMax = min(pt.RatioMin, rd.Ratio), max(pt.RatioMax, rd.Ratio)
		}
		pt.Ratio = math.Exp(logSum / float64(r.o.Rounds))
		pts = append(pts, pt)
	}
	return pts, nil
}

func sideName(with bool) string {
	if with {
		return "with"
	}
	return "without"
}

// sideWorker is one client goroutine of a side.
type sideWorker struct {
	stream uint64 // its own key stream
	done   uint64 // requests 0..done-1 of stream completed
	hist   *bench.Histogram
}

// side runs one side of a point: conc clients completing new keys, each
// with one event if with, on a fresh store with the relay (unless
// Options.NoRelay), for Options.Duration.
func (r *runner) side(ctx context.Context, conc int, with bool) (s Side, err error) {
	dir := r.run.Dir(fmt.Sprintf("overhead-%d-%s", conc, sideName(with)))
	e, err := engine.Open(dir, r.o.Engine)
	if err != nil {
		return Side{}, err
	}
	defer func() {
		err = errors.Join(err, e.Close(), os.RemoveAll(dir))
	}()
	// The profile can be cut by side, the relay's goroutine included (IDEMKV_CPUPROFILE; go tool pprof
	// -tagfocus side=with/64).
	pprof.SetGoroutineLabels(pprof.WithLabels(ctx, pprof.Labels("side", fmt.Sprintf("%s/%d", sideName(with), conc))))
	defer pprof.SetGoroutineLabels(ctx)
	var rl *relayRun
	if !r.o.NoRelay {
		if rl, err = startRelay(e, &discard{}); err != nil {
			return Side{}, err
		}
		defer rl.stop()
	}

	base := r.newStream()
	workers := make([]*sideWorker, conc)
	for i := range workers {
		workers[i] = &sideWorker{stream: base + 1 + uint64(i), hist: bench.NewHistogram()}
	}
	st0, err := e.Stats()
	if err != nil {
		return Side{}, err
	}
	acks0 := rl.acks()
	cpu0 := bench.CPUTime()
	elapsed, err := r.drive(ctx, workers, func(w *sideWorker) error {
		return r.complete(ctx, e, w.stream, w.done, w.done, with)
	})
	if err != nil {
		return Side{}, err
	}
	cpu1 := bench.CPUTime()
	st1, err := e.Stats()
	if err != nil {
		return Side{}, err
	}
	acked, last, err := e.OutboxCursor(ctx)
	if err != nil {
		return Side{}, err
	}
	s.Backlog = last - acked
	s.RelayAcks = rl.acks() - acks0
	all := bench.NewHistogram()
	for _, w := range workers {
		all.Merge(w.hist)
		s.Requests += int64(w.done)
	}
	if s.Requests == 0 {
		return Side{}, errors.New("no request finished")
	}
	s.RequestsPerSec = float64(s.Requests) / elapsed.Seconds()
	s.Latency = all.Latency()
	if cpu0 >= 0 && cpu1 >= 0 {
		s.CPUSecondsPerRequest = (cpu1 - cpu0).Seconds() / float64(s.Requests)
	}
	var d bench.CommitDelta
	d.Add(st0, st1, elapsed)
	s.CommitFigures = d.Figures()

	// Every completion acknowledged with an event left exactly one.
	want := uint64(0)
	if with {
		want = uint64(s.Requests)
	}
	if last != want {
		return Side{}, bench.Violation("%d completions with %s, %d events committed", s.Requests, sideName(with), last)
	}
	if rl != nil {
		if err := rl.caughtUp(ctx, e, r.o.CatchUp); err != nil {
			return Side{}, err
		}
		if got := rl.pub.(*discard).n.Load(); got != int64(want) {
			return Side{}, bench.Violation("the relay published %d events of %d", got, want)
		}
	}
	s.VerifiedKeys, err = r.verify(ctx, e, workers)
	return s, err
}

// complete claims request (stream, i)'s new key and completes it with its
// effect and, if with, its event, numbered n.
func (r *runner) complete(ctx context.Context, e *engine.Engine, stream, i, n uint64, with bool) error {
	c, err := bench.ClaimNew(ctx, e, stream, i, r.o.Tenants, idemkv.ModeLocal)
	if err != nil {
		return err
	}
	ek, ev := bench.Effect(c.Lease.ID, stream, i)
	return e.Complete(ctx, c.Lease, bench.Result(stream, i, nil), func(fx idemkv.Effects) error {
		if err := fx.Set(ek, ev); err != nil {
			return err
		}
		if !with {
			return nil
		}
		return fx.Emit(r.event(stream, i, n))
	})
}

// event returns the event request (stream, i) emits, numbered n: Event,
// with an empty key if Options.OneEntity.
func (r *runner) event(stream, i, n uint64) idemkv.Event {
	ev := event(stream, i, n, r.o.Tenants)
	if r.o.OneEntity {
		ev.Key = ""
	}
	return ev
}

// drive runs request on every worker, all started at once, until
// Options.Duration has passed, and returns the time from the start until
// the last worker finished its last request.
func (r *runner) drive(ctx context.Context, workers []*sideWorker, request func(*sideWorker) error) (time.Duration, error) {
	var (
		stop     atomic.Bool
		firstErr error
		errOnce  sync.Once
		wg       sync.WaitGroup
		ready    sync.WaitGroup
		startGun = make(chan struct{})
	)
	ready.Add(len(workers))
	for _, w := range workers {
		wg.Go(func() {
			ready.Done()
			<-startGun
			for !stop.Load() {
				t0 := time.Now()
				if err := request(w); err != nil {
					errOnce.Do(func() { firstErr = err })
					stop.Store(true)
					return
				}
				w.hist.Record(time.Since(t0))
				w.done++
			}
		})
	}
	ready.Wait()
	t0 := time.Now()
	close(startGun)
	timer := time.AfterFunc(r.o.Duration, func() { stop.Store(true) })
	defer timer.Stop()
	unwatch := context.AfterFunc(ctx, func() { stop.Store(true) })
	defer unwatch()
	wg.Wait()
	elapsed := time.Since(t0)
	return elapsed, errors.Join(firstErr, ctx.Err())
}

// verify checks a sample of the workers' completed keys (Options.
// VerifyKeys): each must replay its result and hold its effect.
func (r *runner) verify(ctx context.Context, e *engine.Engine, workers []*sideWorker) (int, error) {
	type req struct{ s, i uint64 }
	var reqs []req
	for _, w := range workers {
		for i := range w.done {
			reqs = append(reqs, req{w.stream, i})
		}
	}
	if n := r.o.VerifyKeys; n >= 0 && n < len(reqs) {
		rng := rand.New(rand.NewPCG(workers[0].stream, 0xfeed))
		rng.Shuffle(len(reqs), func(i, j int) { reqs[i], reqs[j] = reqs[j], reqs[i] })
		reqs = reqs[:n]
	}
	for _, q := range reqs {
		id := bench.Key(q.s, q.i, r.o.Tenants)
		c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: bench.Fingerprint(q.s, q.i, false)})
		if err != nil {
			return 0, fmt.Errorf("verify %v: %w", id, err)
		}
		want := bench.Result(q.s, q.i, nil)
		if c.Outcome != idemkv.Replay || c.Record.Result.Pointer != want.Pointer {
			return 0, bench.Violation("verify %v: %v %q, want a replay of %q", id, c.Outcome, c.Record.Result.Pointer, want.Pointer)
		}
		ek, ev := bench.Effect(id, q.s, q.i)
		if got, err := e.GetData(ctx, ek); err != nil || string(got) != string(ev) {
			return 0, bench.Violation("verify: effect of %v: %x %v, want %x", id, got, err, ev)
		}
	}
	return len(reqs), nil
}

// relayRun is a relay running on a store until stop.
type relayRun struct {
	r    *outbox.Relay
	src  *countingOutbox
	pub  outbox.Publisher
	stop func()
}

// countingOutbox counts a store's outbox acknowledgements.
type countingOutbox struct {
	idemkv.Outbox
	acks atomic.Int64
}

func (c *countingOutbox) AckOutbox(ctx context.Context, through uint64, id string) error {
	c.acks.Add(1)
	return c.Outbox.AckOutbox(ctx, through, id)
}

// startRelay starts a relay from e to pub.
func startRelay(e *engine.Engine, pub outbox.Publisher) (*relayRun, error) {
	src := &countingOutbox{Outbox: e}
	r, err := outbox.New(src, pub, &outbox.Options{Clock: e})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = r.Run(ctx) })
	return &relayRun{r: r, src: src, pub: pub, stop: sync.OnceFunc(func() {
		cancel()
		wg.Wait()
	})}, nil
}

// acks returns the relay's acknowledgements so far; 0 without a relay.
func (rl *relayRun) acks() int64 {
	if rl == nil {
		return 0
	}
	return rl.src.acks.Load()
}

// caughtUp waits until the relay has acknowledged every event committed
// to e, for at most bound.
func (rl *relayRun) caughtUp(ctx context.Context, e *engine.Engine, bound time.Duration) error {
	deadline := time.Now().Add(bound)
	for {
		acked, last, err := e.OutboxCursor(ctx)
		if err != nil || acked == last {
			return err
		}
		if st := rl.r.Stats(); time.Now().After(deadline) {
			return fmt.Errorf("the relay acknowledged %d events of %d in %v (%d publish errors)", acked, last, bound, st.PublishErrors)
		}
		if err := sleep(ctx, 5*time.Millisecond); err != nil {
			return err
		}
	}
}

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
