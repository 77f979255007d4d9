package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/idemkv/idemkv"
)

// Options configure a Relay. The zero value is usable with the defaults
// below.
type Options struct {
	// Batch is how many events the relay reads at a time, and publishes
	// before it acknowledges them. Default 256.
	Batch int
	// PublishTimeout bounds one Publish call. Default 5 s.
	PublishTimeout time.Duration
	// MinBackoff and MaxBackoff bound the wait after a failed publish or
	// read, doubled after each failure in a row, with jitter (a wait is
	// between half of and the whole of its bound). Defaults 50 ms and 5 s.
	MinBackoff, MaxBackoff time.Duration
	// Clock tells the lag's age (Stats.LagSeconds). Default: the system
	// clock. An *engine.Engine is one, reading the store's own time.
	Clock idemkv.Clock
	// After waits for a backoff; default time.After. Tests inject one.
	After func(time.Duration) <-chan time.Time
	// Logf, if set, is told of publish failures and recoveries.
	Logf func(format string, args ...any)
}

func (o *Options) withDefaults() (Options, error) {
	var c Options
	if o != nil {
		c = *o
	}
	if c.Batch < 0 || c.PublishTimeout < 0 || c.MinBackoff < 0 || c.MaxBackoff < 0 {
		return c, fmt.Errorf("%w: outbox relay: negative option", idemkv.ErrInvalidArgument)
	}
	c.Batch = cmp.Or(c.Batch, 256)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, 5*time.Second)
	c.MinBackoff = cmp.Or(c.MinBackoff, 50*time.Millisecond)
	c.MaxBackoff = max(cmp.Or(c.MaxBackoff, 5*time.Second), c.MinBackoff)
	if c.Clock == nil {
		c.Clock = systemClock{}
	}
	if c.After == nil {
		c.After = time.After
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
	return c, nil
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// Stats describe a relay's work so far.
type Stats struct {
	// Published counts events the broker acknowledged (republishes
	// included); PublishErrors the Publish calls that failed; Acked the
	// sequence of the last event acknowledged to the store.
	Published, PublishErrors, Acked uint64
	// LagEvents is how many committed events the broker has not
	// acknowledged; LagSeconds is the age of the oldest of them (0 if
	// none), as of the relay's last step.
	LagEvents  uint64
	LagSeconds float64
}

// A Relay publishes a store's outbox: it reads the events in commit
// order, publishes them one at a time, and acknowledges them to the store
// once the broker has them. Run one relay per store.
type Relay struct {
	src idemkv.Outbox
	pub Publisher
	o   Options

	mu    sync.Mutex
	stats Stats
	// oldest is the creation time of the oldest event not acknowledged
	// by the broker, if known (zero: none pending).
	oldest time.Time
}

// New returns a relay from src to pub.
func New(src idemkv.Outbox, pub Publisher, o *Options) (*Relay, error) {
	c, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Relay{src: src, pub: pub, o: c}, nil
}

// Run relays until ctx ends, and then returns ctx's error. It is woken by
// commits that add events (idemkv.Outbox.OutboxNotify), so an event is
// published as soon as its commit is durable. While the broker or the
// store fails, it retries with backoff; the outbox keeps the events
// meanwhile, and none is ever skipped.
func (r *Relay) Run(ctx context.Context) error {
	failures := 0
	for {
		_, err := r.Drain(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			failures++
			r.o.Logf("outbox relay: %v (retrying)", err)
			select {
			case <-r.o.After(r.backoff(failures)):
			case <-ctx.Done():
				return ctx.Err()
			}
			continue
		}
		if failures > 0 {
			r.o.Logf("outbox relay: publishing again after %d failures", failures)
			failures = 0
		}
		select {
		case <-r.src.OutboxNotify():
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Drain publishes every event committed so far, acknowledging them batch
// by batch, and returns how many it published. It stops at the first
// error: an event that failed is published again by the next Drain, never
// skipped.
func (r *Relay) Drain(ctx context.Context) (int, error) {
	acked, last, err := r.src.OutboxCursor(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for {
		evs, err := r.src.ReadOutbox(ctx, acked, r.o.Batch)
		if err != nil {
			return n, err
		}
		if len(evs) == 0 {
			r.setLag(acked, acked, time.Time{}) // published everything committed
			return n, nil
		}
		for i := range evs {
			r.setLag(evs[i].Seq-1, max(last, evs[len(evs)-1].Seq), evs[i].Created)
			if err := r.publish(ctx, evs[i]); err != nil {
				if i > 0 { // keep what the broker has: fewer republishes
					err = errors.Join(err, r.src.AckOutbox(context.WithoutCancel(ctx), evs[i-1].Seq))
				}
				return n, err
			}
			n++
		}
		acked = evs[len(evs)-1].Seq
		if err := r.src.AckOutbox(context.WithoutCancel(ctx), acked); err != nil {
			return n, err
		}
		r.mu.Lock()
		r.stats.Acked = acked
		r.mu.Unlock()
	}
}

func (r *Relay) publish(ctx context.Context, ev idemkv.StoredEvent) error {
	pctx, cancel := context.WithTimeout(ctx, r.o.PublishTimeout)
	defer cancel()
	err := r.pub.Publish(pctx, ev)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.stats.PublishErrors++
		return fmt.Errorf("publish event %d (%s): %w", ev.Seq, ev.ID, err)
	}
	r.stats.Published++
	return nil
}

// setLag records the lag: the events after acked up to last, the oldest
// of them created at oldest (zero: none is pending).
func (r *Relay) setLag(acked, last uint64, oldest time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stats.LagEvents = 0
	if last > acked {
		r.stats.LagEvents = last - acked
	}
	r.oldest = oldest
}

// Stats returns the relay's figures.
func (r *Relay) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.stats
	if !r.oldest.IsZero() {
		s.LagSeconds = max(0, r.o.Clock.Now().Sub(r.oldest).Seconds())
	}
	return s
}

// backoff is the wait after the given number of failures in a row.
func (r *Relay) backoff(failures int) time.Duration {
	d := r.o.MinBackoff
	for i := 1; i < failures && d < r.o.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, r.o.MaxBackoff)
	return d/2 + rand.N(d/2+1)
}
