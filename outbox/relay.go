package outbox

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

// Options configure a Relay. The zero value is usable with the defaults
// below.
type Options struct {
	// Batch is how many events the relay reads at a time, and publishes
	// before it acknowledges them. Default 256.
	Batch int
	// PublishTimeout bounds one Publish call. Default 5 s.
	PublishTimeout time.Duration
	// AckInterval and AckEvery say how often Run acknowledges to the store
	// what the broker has: once AckEvery events are unacknowledged, or
	// AckInterval after the first of them was published, however many
	// commits come meanwhile. Each
	// acknowledgement is a range deletion in the store; fewer keep reads
	// of the outbox cheap. A crash republishes what was not acknowledged
	// (with the same ids). Defaults 100 ms and 4,096.
	AckInterval time.Duration
	AckEvery    int
	// MinBackoff and MaxBackoff bound the wait after a failed publish or
	// read, doubled after each failure in a row, with jitter (a wait is
	// between half of and the whole of its bound). Defaults 50 ms and 5 s.
	MinBackoff, MaxBackoff time.Duration
	// Clock tells the lag's age (Stats.LagSeconds), compared with the
	// events' times, and how long the relay has held what it read or
	// claimed (idemkv.OutboxHolder). Default: the store's own clock when
	// it tells time (an idemkv.Clock: *engine.Engine, *pgstore.Store);
	// else the system clock.
	Clock idemkv.Clock
	// After waits for a backoff; default time.After. Tests inject one.
	After func(time.Duration) <-chan time.Time
	// Logger receives a structured record of each failure Run retries: a
	// publish that failed (Warn, with the event's seq and event_id), a
	// store's read or acknowledgement that failed (Error), each with the
	// failures in a row so far; of the recovery that follows (Info); and
	// of a store found to have lost events already published (Warn,
	// Stats.Rollbacks). Events are named by outbox seq and id, never with
	// their payload. Default (nil): no records, as
	// reconcile.Options.Logger; see Logf.
	Logger *slog.Logger
	// Logf, if set and Logger is not, is told of the same failures and
	// recoveries as lines of text (not of rollbacks).
	//
	// Deprecated: set Logger.
	Logf func(format string, args ...any)
	// Shared makes the relay claim its events (idemkv.SharedOutbox), so
	// that relays in several processes publish one store's outbox
	// together: none publishes an event another holds, and each entity's
	// events keep their order. Every relay of the store must then be
	// shared. A claim's events are marked published when its last
	// publish returns, so AckInterval and AckEvery do not apply.
	Shared bool
}

func (o *Options) withDefaults() (Options, error) {
	var c Options
	if o != nil {
		c = *o
	}
	if c.Batch < 0 || c.PublishTimeout < 0 || c.MinBackoff < 0 || c.MaxBackoff < 0 || c.AckInterval < 0 || c.AckEvery < 0 {
		return c, fmt.Errorf("%w: outbox relay: negative option", idemkv.ErrInvalidArgument)
	}
	c.Batch = cmp.Or(c.Batch, 256)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, 5*time.Second)
	c.AckInterval = cmp.Or(c.AckInterval, 100*time.Millisecond)
	c.AckEvery = cmp.Or(c.AckEvery, 4096)
	c.MinBackoff = cmp.Or(c.MinBackoff, 50*time.Millisecond)
	c.MaxBackoff = max(cmp.Or(c.MaxBackoff, 5*time.Second), c.MinBackoff)
	if c.Clock == nil {
		c.Clock = idemkv.SystemClock{}
	}
	if c.After == nil {
		c.After = time.After
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
	return c, nil
}

// Stats describe a relay's work so far.
type Stats struct {
	// Published counts events the broker acknowledged (republishes
	// included); PublishErrors the Publish calls that failed; Acked the
	// sequence of the last event acknowledged to the store (with
	// Options.Shared, by any relay, as this one last read it).
	Published, PublishErrors, Acked uint64
	// LagEvents is how many committed events the broker has not
	// acknowledged; LagSeconds is the age of the oldest of them (0 if
	// none), as of the relay's last step.
	LagEvents  uint64
	LagSeconds float64
	// Rollbacks counts the times the relay found the store no longer
	// holding events it had published as it published them (restored
	// from a backup, or failed over to a copy that lacked them) and went
	// on from the store's cursor.
	Rollbacks uint64
}

// A Relay publishes a store's outbox: it reads the events in commit
// order, publishes them one at a time, and acknowledges them to the store
// once the broker has them. Run one relay per store, or, with
// Options.Shared, one in each process of a fleet sharing a store.
type Relay struct {
	src    idemkv.Outbox
	shared idemkv.SharedOutbox // src, if Options.Shared
	pub    Publisher
	o      Options
	// hold is how long a read or a claim holds its events for this relay
	// (idemkv.OutboxHolder); 0 is for as long as it takes.
	hold time.Duration

	mu    sync.Mutex
	stats Stats
	// oldest is the creation time of the oldest event not acknowledged
	// by the broker, if known (zero: none pending).
	oldest time.Time

	// published is the sequence of the last event the broker has
	// acknowledged, and publishedID its id; acked is the sequence of the
	// last the store has been told of; read says they have been read
	// from the store. Only the goroutine in Run or Drain uses them.
	published, acked uint64
	publishedID      string
	read             bool
}

// New returns a relay from src to pub.
func New(src idemkv.Outbox, pub Publisher, o *Options) (*Relay, error) {
	if clock, ok := src.(idemkv.Clock); ok && (o == nil || o.Clock == nil) {
		with := Options{}
		if o != nil {
			with = *o
		}
		with.Clock = clock
		o = &with
	}
	c, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	r := &Relay{src: src, pub: pub, o: c}
	if h, ok := src.(idemkv.OutboxHolder); ok {
		r.hold = h.OutboxHold()
	}
	if c.Shared {
		so, ok := src.(idemkv.SharedOutbox)
		if !ok {
			return nil, fmt.Errorf("%w: outbox relay: a shared relay needs a store that lets relays claim events (idemkv.SharedOutbox)", idemkv.ErrInvalidArgument)
		}
		r.shared = so
	}
	return r, nil
}

// Run relays until ctx ends, and then returns ctx's error. It is woken by
// commits that add events (idemkv.Outbox.OutboxNotify), so an event is
// published as soon as its commit is durable. While the broker or the
// store fails, it retries with backoff; the outbox keeps the events
// meanwhile, and none is ever skipped.
func (r *Relay) Run(ctx context.Context) error {
	failures := 0
	// ackDue is armed once events are published and not acknowledged,
	// and kept across wakes: commits that keep coming must not put the
	// acknowledgement off.
	var ackDue <-chan time.Time
	ackFailures := 0
	for {
		_, err := r.drain(ctx, false)
		if ctx.Err() != nil {
			return r.stop(ctx)
		}
		if err != nil {
			failures++
			r.logFailure(ctx, err, failures)
			select {
			case <-r.o.After(r.backoff(failures)):
			case <-ctx.Done():
				return r.stop(ctx)
			}
			continue
		}
		if failures > 0 {
			if r.o.Logger != nil {
				r.o.Logger.LogAttrs(ctx, slog.LevelInfo, msgRecovered, slog.Int("failures", failures))
			} else {
				r.o.Logf("outbox relay: publishing again after %d failures", failures)
			}
			failures = 0
		}
		switch {
		case r.published <= r.acked:
			ackDue = nil
		case ackDue == nil:
			ackDue = r.o.After(r.o.AckInterval)
		}
		select {
		case <-r.src.OutboxNotify():
		case <-ackDue:
			ackDue = nil
			if err := r.ack(ctx); err != nil {
				// Tried again after a backoff, not every AckInterval.
				ackFailures++
				r.logFailure(ctx, err, 0)
				ackDue = r.o.After(max(r.o.AckInterval, r.backoff(ackFailures)))
			} else {
				ackFailures = 0
			}
		case <-ctx.Done():
			return r.stop(ctx)
		}
	}
}

// stop acknowledges what the broker has, so that a restart publishes
// less again, and returns ctx's error.
func (r *Relay) stop(ctx context.Context) error {
	_ = r.ack(ctx)
	return ctx.Err()
}

// Drain publishes every event committed so far and acknowledges them,
// and returns how many it published. It stops at the first error: an
// event that failed is published again by the next Drain, never skipped;
// what the broker has by then is acknowledged.
func (r *Relay) Drain(ctx context.Context) (int, error) { return r.drain(ctx, true) }

// drain publishes every event committed so far, acknowledging them when
// AckEvery are unacknowledged, and at the end if all.
func (r *Relay) drain(ctx context.Context, all bool) (int, error) {
	if r.shared != nil {
		return r.drainShared(ctx)
	}
	n := 0
	for {
		last, err := r.resync(ctx)
		if err != nil {
			return n, err
		}
		k, done, err := r.publishRun(ctx, last)
		n += k
		switch {
		case err != nil:
			return n, err
		case !done:
			continue
		case !all:
			return n, nil
		}
		if err := r.ack(ctx); err != nil || r.read {
			return n, err
		}
		// The acknowledgement found the store rolled back: drain it anew.
	}
}

// resync reads the store's cursor, and returns its last sequence. On the
// first read, or once the store has rolled back (it holds fewer events
// than the relay published, its acknowledged point went back, or a read
// found the last event published gone: restored from a backup, failed
// over to a replica that lacked them), the relay goes on from what the
// store holds as acknowledged: the store is the truth.
func (r *Relay) resync(ctx context.Context) (uint64, error) {
	acked, last, err := r.src.OutboxCursor(ctx)
	if err != nil {
		return 0, err
	}
	if r.read && (last < r.published || acked < r.acked) {
		r.rolledBack(ctx)
	}
	if !r.read {
		r.published, r.publishedID, r.acked, r.read = acked, "", acked, true
	}
	return last, nil
}

// publishRun reads and publishes the events after the last published
// until the store has no more (done), or until an acknowledgement
// (AckEvery) or a read that finds the store rolled back, after which the
// caller resyncs.
func (r *Relay) publishRun(ctx context.Context, last uint64) (n int, done bool, err error) {
	for {
		evs, err := r.readNext(ctx)
		if err != nil {
			return n, false, err
		}
		if !r.read {
			return n, false, nil // rolled back
		}
		readAt := r.o.Clock.Now()
		if len(evs) == 0 {
			r.setLag(r.published, r.published, time.Time{}) // published everything committed
			return n, true, nil
		}
		for i := range evs {
			if i > 0 && r.heldPast(readAt) {
				break // read again, which renews the hold
			}
			r.setLag(evs[i].Seq-1, max(last, evs[len(evs)-1].Seq), evs[i].Created)
			if err := r.publish(ctx, evs[i]); err != nil {
				return n, false, errors.Join(err, r.ack(ctx)) // keep what the broker has
			}
			r.published, r.publishedID = evs[i].Seq, evs[i].ID
			n++
		}
		if r.published-r.acked >= uint64(r.o.AckEvery) {
			return n, false, r.ack(ctx)
		}
	}
}

// readNext reads the events after the last published. While that one is
// not acknowledged, the read starts with it, and the store must still
// hold it under its id: if not, r.read is cleared and nothing is
// returned. Another event under its number is a rollback (the store's
// numbers are now other events'); none, or only later ones, is one only
// if the cursor says so, as another relay may hold or have acknowledged
// the events now.
func (r *Relay) readNext(ctx context.Context) ([]idemkv.StoredEvent, error) {
	if r.publishedID == "" || r.published <= r.acked {
		return r.src.ReadOutbox(ctx, r.published, r.o.Batch)
	}
	evs, err := r.src.ReadOutbox(ctx, r.published-1, r.o.Batch+1)
	if err != nil {
		return nil, err
	}
	switch {
	case len(evs) == 0 || evs[0].Seq != r.published:
		// Gone, or acknowledged or held by another relay now
		// (idemkv.OutboxHolder: this one's hold ran out): the cursor
		// tells a store that lost it.
		acked, last, err := r.src.OutboxCursor(ctx)
		if err != nil {
			return nil, err
		}
		if last < r.published || acked < r.acked {
			r.rolledBack(ctx)
		}
		r.read = false
		return nil, nil
	case evs[0].ID != r.publishedID:
		r.rolledBack(ctx)
		return nil, nil
	}
	return evs[1:], nil
}

// drainShared claims events and publishes them until a claim comes back
// empty: everything committed is published, or held by other relays.
func (r *Relay) drainShared(ctx context.Context) (int, error) {
	n := 0
	for {
		acked, last, err := r.src.OutboxCursor(ctx)
		if err != nil {
			return n, err
		}
		r.mu.Lock()
		r.stats.Acked = acked // the fleet's cursor, moved by every relay
		r.mu.Unlock()
		c, err := r.shared.ClaimOutbox(ctx, r.o.Batch)
		if err != nil {
			return n, err
		}
		claimedAt := r.o.Clock.Now()
		evs := c.Events()
		published := 0
		var perr error
		for i := range evs {
			if i > 0 && r.heldPast(claimedAt) {
				break // give the rest back, and claim again
			}
			r.setLag(acked, max(last, evs[i].Seq), evs[i].Created)
			if perr = r.publish(ctx, evs[i]); perr != nil {
				break
			}
			published++
		}
		ferr := c.Finish(ctx, published)
		n += published
		if perr != nil || ferr != nil {
			return n, errors.Join(perr, ferr)
		}
		if len(evs) == 0 {
			r.setLag(acked, last, time.Time{})
			return n, nil
		}
	}
}

// heldPast reports whether what the relay read or claimed at since is no
// longer held for it alone (idemkv.OutboxHolder): it publishes no more of
// it. The first event of each read or claim is published regardless, so
// that the relay moves on however short the hold.
func (r *Relay) heldPast(since time.Time) bool {
	return r.hold > 0 && r.o.Clock.Now().Sub(since) >= r.hold
}

// ackTimeout bounds an acknowledgement. One is made whether or not ctx
// has ended (what the broker has is worth recording as the relay stops),
// and a store that hangs must not hang the relay's stop.
const ackTimeout = 10 * time.Second

// rolledBack records that the store no longer holds the events this
// relay published as it published them: the next drain reads it again
// from its cursor.
func (r *Relay) rolledBack(ctx context.Context) {
	r.read = false
	r.mu.Lock()
	r.stats.Rollbacks++
	r.mu.Unlock()
	if r.o.Logger != nil {
		r.o.Logger.LogAttrs(ctx, slog.LevelWarn, msgRolledBack, slog.Uint64("published", r.published),
			slog.String("event_id", r.publishedID))
	}
}

// ack tells the store that the broker has every event up to published,
// unless the store has rolled back meanwhile (restored from a backup, or
// failed over to a copy that lacked them): the events under those
// numbers are then others, and the next drain starts again from what the
// store holds. The store checks, as it acknowledges, that the last event
// published is still the one under its number (idemkv.Outbox.AckOutbox);
// the cursor read first tells a store that now holds fewer events than
// that, or has acknowledged less than this relay did.
func (r *Relay) ack(ctx context.Context) error {
	if !r.read || r.published <= r.acked {
		return nil
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ackTimeout)
	defer cancel()
	acked, last, err := r.src.OutboxCursor(actx)
	if err != nil {
		return fmt.Errorf("acknowledge events through %d: %w", r.published, err)
	}
	if last < r.published || acked < r.acked {
		r.rolledBack(ctx) // the next drain starts again from the store's truth
		return nil
	}
	switch err := r.src.AckOutbox(actx, r.published, r.publishedID); {
	case errors.Is(err, idemkv.ErrConflict):
		r.rolledBack(ctx)
		return nil
	case err != nil:
		return fmt.Errorf("acknowledge events through %d: %w", r.published, err)
	}
	r.acked = r.published
	r.mu.Lock()
	r.stats.Acked = r.acked
	r.mu.Unlock()
	return nil
}

func (r *Relay) publish(ctx context.Context, ev idemkv.StoredEvent) error {
	pctx, cancel := context.WithTimeout(ctx, r.o.PublishTimeout)
	defer cancel()
	err := r.pub.Publish(pctx, ev)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.stats.PublishErrors++
		return &publishError{seq: ev.Seq, id: ev.ID, err: err}
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

// Log messages, stable so that alerts and searches can match them.
const (
	msgPublishFailed = "outbox: publish failed; retrying"
	msgStoreFailed   = "outbox: store error; retrying"
	msgRecovered     = "outbox: publishing again"
	msgRolledBack    = "outbox: the store lost events already published; reading it again from its cursor"
)

// publishError is a Publish that failed: the event it was, and why.
type publishError struct {
	seq uint64
	id  string
	err error
}

func (e *publishError) Error() string {
	return fmt.Sprintf("publish event %d (%s): %v", e.seq, e.id, e.err)
}

func (e *publishError) Unwrap() error { return e.err }

// logFailure logs a failure Run retries (failures: in a row so far, 0
// for a failed acknowledgement, which Run retries at its next one) to
// Options.Logger, or as text to Options.Logf. A failed publish is Warn (a
// broker that is down or slow: the outbox keeps the events), any other
// failure is the store's, Error.
func (r *Relay) logFailure(ctx context.Context, err error, failures int) {
	if r.o.Logger == nil {
		r.o.Logf("outbox relay: %v (retrying)", err)
		return
	}
	var pe *publishError
	if errors.As(err, &pe) {
		r.o.Logger.LogAttrs(ctx, slog.LevelWarn, msgPublishFailed, slog.Uint64("seq", pe.seq),
			slog.String("event_id", pe.id), slog.Int("failures", failures), slog.String("err", err.Error()))
		return
	}
	r.o.Logger.LogAttrs(ctx, slog.LevelError, msgStoreFailed, slog.Int("failures", failures), slog.String("err", err.Error()))
}
