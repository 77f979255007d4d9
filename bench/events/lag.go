package events

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkv/idemkv/bench"
	"github.com/idemkv/idemkv/engine"
)

// Load is one open-loop load relayed to JetStream.
type Load struct {
	Rate    float64 `json:"rate"`    // the offered rate, completions (each with one event) a second
	Clients int     `json:"clients"` // the client goroutines that carried it
	Events  int     `json:"events"`  // the number of completions offered, each with one event
	// LoadSeconds is the time from the first scheduled request to the
	// last Complete's return, in seconds.
	LoadSeconds float64 `json:"load_seconds"`
	// DeliveredPerSec is the completions per second the store delivered:
	// Events / LoadSeconds.
	DeliveredPerSec float64 `json:"delivered_per_sec"`
	// Latency is a request's latency from its scheduled start to its
	// Complete's return (a late start counts), in µs.
	Latency bench.Latency `json:"latency_us"`
	// Lag is an event's lag: from its Complete's return to the PubAck of
	// its publish, in µs. The goal at 5,000 a second: p99 under 50 ms.
	Lag bench.Latency `json:"lag_us"`
	// LagFromCreated is the same from the event's Created (the engine's
	// clock when its commit was enqueued), in µs.
	LagFromCreated bench.Latency `json:"lag_from_created_us"`
	// PublishedBeforeReturn counts events acknowledged by the broker
	// before their Complete returned to the client: counted in Lag as 0.
	PublishedBeforeReturn int64 `json:"published_before_return"`
	// RelayEventsPerSec is the events the broker acknowledged while the
	// load ran, per second of LoadSeconds.
	RelayEventsPerSec float64 `json:"relay_events_per_sec"`
	// MaxBacklog is the largest number of committed events not yet
	// acknowledged to the outbox (by batch, once the broker has them all),
	// sampled every 50 ms.
	MaxBacklog uint64 `json:"max_backlog"`
	// CatchUpSeconds is the time from the load's end until the relay had
	// published every event, in seconds.
	CatchUpSeconds float64 `json:"catch_up_seconds"`
	// Unpublished counts events the relay had not published when
	// Options.CatchUp ran out; they count in Lag with the lag they had
	// reached.
	Unpublished int `json:"unpublished"`
	// Republished counts publishes of an event already acknowledged.
	Republished int64 `json:"republished"`
	// RelayAcks is the number of acknowledgements the relay committed to
	// the outbox (each a synced batch through the committer), from the
	// load's start until every event was published.
	RelayAcks int64 `json:"relay_acks"`
	// PublishErrors counts failed publishes (the relay retried them).
	PublishErrors uint64 `json:"publish_errors"`
	// StreamMessages is the number of messages the stream stored during
	// the load: Events, or the run fails.
	StreamMessages uint64 `json:"stream_messages"`
	// CPUSecondsPerEvent is the process's CPU time (engine, relay, broker
	// and clients) from the load's start until every event was published,
	// per event, in seconds.
	CPUSecondsPerEvent float64 `json:"cpu_seconds_per_event"`
}

// load offers Options.LoadDuration of rate completions a second, each with
// one event, to a fresh store whose relay publishes to b, and measures
// every event's lag.
func (r *runner) load(ctx context.Context, b *broker, rate float64) (ld Load, err error) {
	dir := r.run.Dir(fmt.Sprintf("load-%.0f", rate))
	e, err := engine.Open(dir, r.o.Engine)
	if err != nil {
		return Load{}, err
	}
	defer func() {
		err = errors.Join(err, e.Close(), os.RemoveAll(dir))
	}()
	n := r.o.loadEvents(rate)
	msgs0, err := b.messages(ctx)
	if err != nil {
		return Load{}, err
	}
	// base is a little ahead, so that the first requests are not late
	// while the clients start.
	base := time.Now().Add(10 * time.Millisecond)
	tp := newTiming(b.pub, base, n)
	rl, err := startRelay(e, tp)
	if err != nil {
		return Load{}, err
	}
	defer rl.stop()

	ld = Load{Rate: rate, Clients: r.o.Clients, Events: n}
	sampled := make(chan uint64, 1)
	sctx, stopSampling := context.WithCancel(ctx)
	go func() {
		var most uint64
		for sleep(sctx, 50*time.Millisecond) == nil {
			if acked, last, err := e.OutboxCursor(sctx); err == nil {
				most = max(most, last-acked)
			}
		}
		sampled <- most
	}()

	committed := make([]atomic.Int64, n) // ns since base of each Complete's return
	cpu0 := bench.CPUTime()
	hist, err := r.offer(ctx, e, rate, base, n, committed)
	loadEnd := time.Since(base)
	if err != nil {
		stopSampling()
		<-sampled
		return Load{}, err
	}
	ld.LoadSeconds = loadEnd.Seconds()
	ld.DeliveredPerSec = float64(n) / ld.LoadSeconds
	ld.Latency = hist.Latency()

	// The relay publishes what is left.
	deadline := time.Now().Add(r.o.CatchUp)
	for tp.published.Load() < int64(n) && time.Now().Before(deadline) {
		if err := sleep(ctx, time.Millisecond); err != nil {
			stopSampling()
			<-sampled
			return Load{}, err
		}
	}
	end := time.Since(base)
	cpu1 := bench.CPUTime()
	stopSampling()
	ld.MaxBacklog = <-sampled
	rl.stop()
	ld.RelayAcks = rl.acks()
	ld.CatchUpSeconds = (end - loadEnd).Seconds()
	if cpu0 >= 0 && cpu1 >= 0 {
		ld.CPUSecondsPerEvent = (cpu1 - cpu0).Seconds() / float64(n)
	}

	lag := bench.NewHistogram()
	var inWindow int64
	for i := range committed {
		c, a := committed[i].Load(), tp.acked[i].Load()
		if a == 0 {
			ld.Unpublished++
			a = int64(end)
		} else if a <= int64(loadEnd) {
			inWindow++
		}
		d := time.Duration(a - c)
		if d < 0 {
			ld.PublishedBeforeReturn++
			d = 0
		}
		lag.Record(d)
	}
	ld.Lag = lag.Latency()
	ld.LagFromCreated = tp.mu.fromCreated.Latency()
	ld.RelayEventsPerSec = float64(inWindow) / ld.LoadSeconds
	ld.Republished = tp.repeats.Load()
	ld.PublishErrors = rl.r.Stats().PublishErrors
	msgs1, err := b.messages(ctx)
	if err != nil {
		return Load{}, err
	}
	ld.StreamMessages = msgs1 - msgs0

	if s := tp.strangers.Load(); s > 0 {
		return Load{}, bench.Violation("the relay published %d events this load did not commit", s)
	}
	if ld.Unpublished == 0 && ld.StreamMessages != uint64(n) {
		return Load{}, bench.Violation("%d events committed and published, %d messages stored", n, ld.StreamMessages)
	}
	return ld, nil
}

// offer runs the open-loop load: request k (0 ≤ k < n) is scheduled at
// base + k/rate and starts then, or as soon as one of Options.Clients
// clients is free. It records each Complete's return in committed and
// returns the requests' latencies from their scheduled start.
func (r *runner) offer(ctx context.Context, e *engine.Engine, rate float64, base time.Time, n int,
	committed []atomic.Int64) (*bench.Histogram, error) {
	stream := r.newStream()
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		mu       sync.Mutex
		all      = bench.NewHistogram()
		firstErr error
	)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range min(r.o.Clients, n) {
		wg.Go(func() {
			h := bench.NewHistogram()
			defer func() {
				mu.Lock()
				all.Merge(h)
				mu.Unlock()
			}()
			for {
				k := next.Add(1) - 1
				if k >= int64(n) || cctx.Err() != nil {
					return
				}
				due := base.Add(time.Duration(float64(k) / rate * float64(time.Second)))
				if d := time.Until(due); d > 0 {
					if sleep(cctx, d) != nil {
						return
					}
				}
				if err := r.complete(cctx, e, stream, uint64(k), uint64(k), true); err != nil {
					mu.Lock()
					firstErr = cmp.Or(firstErr, err)
					mu.Unlock()
					cancel()
					return
				}
				now := time.Now()
				committed[k].Store(int64(now.Sub(base)))
				h.Record(now.Sub(due))
			}
		})
	}
	wg.Wait()
	return all, errors.Join(firstErr, ctx.Err())
}
