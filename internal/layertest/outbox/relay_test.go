package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/internal/layertest/teststore"
	"github.com/idemkv/idemkv/outbox"
	"github.com/stretchr/testify/require"
)

var ctx = context.Background()

// broker is a Publisher that keeps one copy of each event id, as
// JetStream's duplicate window does, and fails when told to.
type broker struct {
	mu       sync.Mutex
	stream   []idemkv.StoredEvent
	ids      map[string]bool
	attempts int
	fail     func(ev idemkv.StoredEvent) error
	sent     chan idemkv.StoredEvent
}

func (b *broker) Publish(ctx context.Context, ev idemkv.StoredEvent) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.attempts++
	if b.fail != nil {
		if err := b.fail(ev); err != nil {
			return err
		}
	}
	if b.ids == nil {
		b.ids = map[string]bool{}
	}
	if !b.ids[ev.ID] {
		b.ids[ev.ID] = true
		b.stream = append(b.stream, ev)
	}
	if b.sent != nil {
		b.sent <- ev
	}
	return nil
}

func (b *broker) seqs() []uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	var s []uint64
	for _, ev := range b.stream {
		s = append(s, ev.Seq)
	}
	return s
}

// openEngine opens the store the suite runs on (teststore: the engine,
// or PostgreSQL).
func openEngine(t *testing.T, dir string) teststore.Store {
	return teststore.Open(t, dir, teststore.Options{})
}

// emit commits n payments, each with a payments.created event.
func emit(t *testing.T, e teststore.Store, from, n int) {
	for i := from; i < from+n; i++ {
		key := fmt.Sprintf("p%d", i)
		c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: idemkv.ID{Tenant: "t", Endpoint: "pay", Key: key}, Fingerprint: []byte{1}})
		require.NoError(t, err)
		require.NoError(t, e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, func(fx idemkv.Effects) error {
			return fx.Emit(idemkv.Event{Topic: "payments.created", Key: fmt.Sprint("acct", i%3), Payload: []byte(key)})
		}))
	}
}

func seq(from, to uint64) []uint64 {
	var s []uint64
	for i := from; i <= to; i++ {
		s = append(s, i)
	}
	return s
}

func TestDrainPublishesInOrderAndAcknowledges(t *testing.T) {
	e := openEngine(t, t.TempDir())
	defer e.Close()
	emit(t, e, 0, 10)
	b := &broker{}
	r, err := outbox.New(e, b, &outbox.Options{Batch: 4})
	require.NoError(t, err)
	n, err := r.Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, 10, n)
	require.Equal(t, seq(1, 10), b.seqs())
	acked, last, err := e.OutboxCursor(ctx)
	require.NoError(t, err)
	require.Equal(t, [2]uint64{10, 10}, [2]uint64{acked, last})
	left, err := e.ReadOutbox(ctx, 0, 100)
	require.NoError(t, err)
	require.Empty(t, left, "acknowledged events leave the outbox")
	st := r.Stats()
	require.Equal(t, outbox.Stats{Published: 10, Acked: 10}, st)

	// Per entity, the sequence counts up without gaps in stream order.
	next := map[string]uint64{}
	for _, ev := range b.stream {
		next[ev.Key]++
		require.Equal(t, next[ev.Key], ev.EntitySeq)
	}
}

// A failed publish stops the relay at that event: it is never skipped,
// what the broker already has is acknowledged, and the next pass goes on
// from the failed event.
func TestFailedPublishIsRetriedNeverSkipped(t *testing.T) {
	e := openEngine(t, t.TempDir())
	defer e.Close()
	emit(t, e, 0, 6)
	down := errors.New("broker down")
	b := &broker{fail: func(ev idemkv.StoredEvent) error {
		if ev.Seq == 4 {
			return down
		}
		return nil
	}}
	r, err := outbox.New(e, b, &outbox.Options{Batch: 100})
	require.NoError(t, err)
	n, err := r.Drain(ctx)
	require.ErrorIs(t, err, down)
	require.Equal(t, 3, n)
	acked, _, err := e.OutboxCursor(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(3), acked, "what the broker has is acknowledged")
	st := r.Stats()
	require.Equal(t, uint64(1), st.PublishErrors)
	require.Equal(t, uint64(3), st.LagEvents)
	require.Positive(t, st.LagSeconds+1) // defined while stuck

	b.fail = nil
	n, err = r.Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.Equal(t, seq(1, 6), b.seqs())
}

// A crash between the broker's acknowledgement and the store's: the next
// relay publishes the same events again, with the same ids, and a broker
// that deduplicates on the id keeps each once.
func TestCrashBeforeAckRepublishesWithTheSameIDs(t *testing.T) {
	dir := t.TempDir()
	e := openEngine(t, dir)
	emit(t, e, 0, 5)
	b := &broker{}
	r, err := outbox.New(noAck{e}, b, nil)
	require.NoError(t, err)
	_, err = r.Drain(ctx)
	require.ErrorIs(t, err, errCrashed)
	require.NoError(t, e.Close())

	e = openEngine(t, dir)
	defer e.Close()
	emit(t, e, 5, 2)
	r, err = outbox.New(e, b, nil)
	require.NoError(t, err)
	n, err := r.Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, 7, n, "the first five again, then the new two")
	require.Equal(t, 12, b.attempts)
	require.Equal(t, seq(1, 7), b.seqs(), "after dedup, each event once, in order")
}

var errCrashed = errors.New("crashed before the ack")

type noAck struct{ teststore.Store }

func (noAck) AckOutbox(context.Context, uint64, string) error { return errCrashed }

// Run is woken by the commit that adds an event, with no polling delay:
// the test waits for the publish alone.
func TestRunIsWokenByCommits(t *testing.T) {
	e := openEngine(t, t.TempDir())
	defer e.Close()
	b := &broker{sent: make(chan idemkv.StoredEvent, 10)}
	never := make(chan time.Time)
	r, err := outbox.New(e, b, &outbox.Options{After: func(time.Duration) <-chan time.Time { return never }})
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- r.Run(rctx) }()
	for i := range 3 {
		emit(t, e, i, 1)
		ev := <-b.sent
		require.Equal(t, uint64(i+1), ev.Seq)
	}
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
}

// While the broker is down Run backs off, doubling with jitter up to a
// bound, and publishes everything once it is back.
func TestRunBacksOffWhileTheBrokerIsDown(t *testing.T) {
	e := openEngine(t, t.TempDir())
	defer e.Close()
	emit(t, e, 0, 2)
	var mu sync.Mutex
	failures := 5
	b := &broker{sent: make(chan idemkv.StoredEvent, 10), fail: func(idemkv.StoredEvent) error {
		mu.Lock()
		defer mu.Unlock()
		if failures > 0 {
			failures--
			return errors.New("no responders")
		}
		return nil
	}}
	waits := make(chan time.Duration, 10)
	fire := make(chan time.Time)
	o := &outbox.Options{MinBackoff: 100 * time.Millisecond, MaxBackoff: 400 * time.Millisecond,
		After: func(d time.Duration) <-chan time.Time { waits <- d; return fire }}
	r, err := outbox.New(e, b, o)
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = r.Run(rctx) }()
	for i, bound := range []time.Duration{100, 200, 400, 400, 400} {
		d := <-waits
		require.True(t, d >= bound*time.Millisecond/2 && d <= bound*time.Millisecond, "wait %d: %v, bound %vms", i, d, bound)
		require.Equal(t, uint64(2), r.Stats().LagEvents)
		fire <- time.Time{}
	}
	require.Equal(t, uint64(1), (<-b.sent).Seq)
	require.Equal(t, uint64(2), (<-b.sent).Seq)
}

func TestOptionsRefuseNegatives(t *testing.T) {
	_, err := outbox.New(nil, nil, &outbox.Options{MinBackoff: -1})
	require.ErrorIs(t, err, idemkv.ErrInvalidArgument)
}

// Run acknowledges to the store at AckInterval, not once per commit: a
// range deletion per acknowledgement, few of them. Stopping acknowledges
// what the broker has.
func TestRunAcknowledgesOnItsInterval(t *testing.T) {
	e := openEngine(t, t.TempDir())
	defer e.Close()
	b := &broker{sent: make(chan idemkv.StoredEvent, 10)}
	fire := make(chan time.Time)
	waits := make(chan time.Duration, 100)
	src := ackSignal{Store: e, acks: make(chan uint64, 10)}
	r, err := outbox.New(src, b, &outbox.Options{AckInterval: time.Second,
		After: func(d time.Duration) <-chan time.Time { waits <- d; return fire }})
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- r.Run(rctx) }()
	for i := range 3 {
		emit(t, e, i, 1)
		<-b.sent
	}
	acked, _, err := e.OutboxCursor(ctx)
	require.NoError(t, err)
	require.Zero(t, acked, "no acknowledgement per commit")
	require.Equal(t, time.Second, <-waits)
	fire <- time.Time{} // the interval has passed
	require.Equal(t, uint64(3), <-src.acks)

	emit(t, e, 3, 1)
	<-b.sent
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	require.Equal(t, uint64(4), <-src.acks, "stopping acknowledges what the broker has")
	acked, _, err = e.OutboxCursor(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(4), acked)
}

// TestSteadyCommitsDoNotPutTheAcknowledgementOff: commits that wake the
// relay more often than AckInterval do not restart its wait: the
// events are acknowledged AckInterval after the first was published,
// so that a crash republishes few, within the broker's duplicate window.
func TestSteadyCommitsDoNotPutTheAcknowledgementOff(t *testing.T) {
	e := openEngine(t, t.TempDir())
	defer e.Close()
	b := &broker{sent: make(chan idemkv.StoredEvent, 10)}
	timers := make(chan chan time.Time, 10)
	src := ackSignal{Store: e, acks: make(chan uint64, 10)}
	r, err := outbox.New(src, b, &outbox.Options{AckInterval: time.Second,
		After: func(time.Duration) <-chan time.Time { c := make(chan time.Time); timers <- c; return c }})
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- r.Run(rctx) }()
	for i := range 5 { // each commit wakes the relay
		emit(t, e, i, 1)
		<-b.sent
	}
	first := <-timers // armed after the first publish
	select {
	case first <- time.Time{}: // the interval has passed since then
	case <-time.After(10 * time.Second):
		t.Fatal("the relay no longer waits on the interval begun at its first unacknowledged publish")
	}
	require.Equal(t, uint64(5), <-src.acks)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	require.Empty(t, timers, "one wait for the five")
}

// holding is a store whose reads hold their events for hold only
// (idemkv.OutboxHolder), and that counts its reads.
type holding struct {
	teststore.Store
	hold  time.Duration
	reads *int
}

func (h holding) OutboxHold() time.Duration { return h.hold }

func (h holding) ReadOutbox(ctx context.Context, after uint64, limit int) ([]idemkv.StoredEvent, error) {
	*h.reads++
	return h.Store.ReadOutbox(ctx, after, limit)
}

// TestRelayPublishesWithinTheHold: a relay publishes what one read
// returned only while the store holds it for the relay
// (idemkv.OutboxHolder), then reads again, which renews the hold; the
// first event of a read goes out however long the read took. Every
// event is published once, in order.
func TestRelayPublishesWithinTheHold(t *testing.T) {
	e := openEngine(t, t.TempDir())
	defer e.Close()
	clock := fakeclock.New(time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC))
	b := &broker{fail: func(idemkv.StoredEvent) error { clock.Advance(400 * time.Millisecond); return nil }}
	reads := 0
	r, err := outbox.New(holding{Store: e, hold: time.Second, reads: &reads}, b, &outbox.Options{Clock: clock})
	require.NoError(t, err)
	emit(t, e, 0, 9)
	n, err := r.Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, 9, n)
	require.Equal(t, seq(1, 9), b.seqs())
	require.Equal(t, 9, b.attempts, "each once")
	// Three events a read (0, 0.4 and 0.8 s into its hold): three reads,
	// and the one that finds nothing more.
	require.Equal(t, 4, reads)
}

// swapped is an outbox that can be swapped for another under a relay,
// as a store restored from a backup is.
type swapped struct{ teststore.Store }

// TestRelayFollowsAStoreThatLostEvents: a store restored to an earlier
// point holds fewer events than the relay published from it, or as many
// more under the same numbers, committed before the relay looks again;
// the relay goes on from what the store holds, and publishes all its
// events, rather than wait for the store to pass a number it will give
// to other events, or read past the ones it gave.
func TestRelayFollowsAStoreThatLostEvents(t *testing.T) {
	for _, committed := range []int{2, 6} {
		t.Run(fmt.Sprint(committed, " events since"), func(t *testing.T) {
			before := openEngine(t, t.TempDir())
			defer before.Close()
			emit(t, before, 0, 5)
			b := &broker{}
			src := &swapped{before}
			r, err := outbox.New(src, b, nil)
			require.NoError(t, err)
			n, err := r.Drain(ctx)
			require.NoError(t, err)
			require.Equal(t, 5, n)

			restored := openEngine(t, t.TempDir()) // events of its own, unpublished
			defer restored.Close()
			emit(t, restored, 10, committed)
			src.Store = restored
			n, err = r.Drain(ctx)
			require.NoError(t, err)
			require.Equal(t, committed, n)
			require.Equal(t, append(seq(1, 5), seq(1, uint64(committed))...), b.seqs())
			require.EqualValues(t, 1, r.Stats().Rollbacks)
			acked, _, err := restored.OutboxCursor(ctx)
			require.NoError(t, err)
			require.Equal(t, uint64(committed), acked)
		})
	}
}

// failingAck is a store whose acknowledgements fail until told.
type failingAck struct {
	teststore.Store
	mu   sync.Mutex
	fail bool
}

func (s *failingAck) AckOutbox(ctx context.Context, through uint64, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail {
		return errors.New("disk unplugged")
	}
	return s.Store.AckOutbox(ctx, through, id)
}

// TestFailedAcknowledgementsBackOff: an acknowledgement that fails is
// tried again after a growing backoff, not every AckInterval.
func TestFailedAcknowledgementsBackOff(t *testing.T) {
	e := openEngine(t, t.TempDir())
	defer e.Close()
	src := &failingAck{Store: e, fail: true}
	b := &broker{sent: make(chan idemkv.StoredEvent, 10)}
	type wait struct {
		d time.Duration
		c chan time.Time
	}
	waits := make(chan wait, 10)
	r, err := outbox.New(src, b, &outbox.Options{AckInterval: 100 * time.Millisecond, MinBackoff: time.Second, MaxBackoff: 8 * time.Second,
		After: func(d time.Duration) <-chan time.Time { w := wait{d, make(chan time.Time)}; waits <- w; return w.c }})
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- r.Run(rctx) }()
	emit(t, e, 0, 1)
	<-b.sent
	w := <-waits
	require.Equal(t, 100*time.Millisecond, w.d)
	var after []time.Duration
	for range 3 {
		w.c <- time.Time{} // the acknowledgement is due, and fails
		w = <-waits
		after = append(after, w.d)
	}
	require.GreaterOrEqual(t, after[0], 500*time.Millisecond, "backoffs: %v", after)
	require.GreaterOrEqual(t, after[1], time.Second, "backoffs: %v", after)
	require.GreaterOrEqual(t, after[2], 2*time.Second, "backoffs: %v", after)
	src.mu.Lock()
	src.fail = false
	src.mu.Unlock()
	w.c <- time.Time{}
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	acked, _, err := e.OutboxCursor(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(1), acked)
}

// ackSignal tells of every acknowledgement the store took.
type ackSignal struct {
	teststore.Store
	acks chan uint64
}

func (s ackSignal) AckOutbox(ctx context.Context, through uint64, id string) error {
	err := s.Store.AckOutbox(ctx, through, id)
	if err == nil {
		s.acks <- through
	}
	return err
}

// TestMain runs the suite on the engine, then on PostgreSQL (teststore).
func TestMain(m *testing.M) { teststore.Main(m) }

// switchable is an outbox that a test can switch to another store while
// a relay runs on it, and whose commits are told by the test.
type switchable struct {
	mu     sync.Mutex
	cur    idemkv.Outbox
	notify chan struct{}
	// drained, if set, is called when a read finds no events past the
	// first it asks for (which a relay reads again to check the store).
	drained func()
	// acking, if set, is called as an acknowledgement reaches the store.
	acking func()
}

func (s *switchable) store() idemkv.Outbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

func (s *switchable) to(o idemkv.Outbox) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cur = o
}

func (s *switchable) ReadOutbox(ctx context.Context, after uint64, limit int) ([]idemkv.StoredEvent, error) {
	evs, err := s.store().ReadOutbox(ctx, after, limit)
	if err == nil && s.drained != nil && (len(evs) == 0 || evs[len(evs)-1].Seq <= after+1) {
		s.drained()
	}
	return evs, err
}
func (s *switchable) AckOutbox(ctx context.Context, through uint64, id string) error {
	if s.acking != nil {
		s.acking()
	}
	return s.store().AckOutbox(ctx, through, id)
}
func (s *switchable) OutboxCursor(ctx context.Context) (uint64, uint64, error) {
	return s.store().OutboxCursor(ctx)
}
func (s *switchable) OutboxNotify() <-chan struct{} { return s.notify }

// TestRelayNeverAcknowledgesAnotherStoresEvents: the store fails over to
// a replica that lacked the events the relay published and has not yet
// acknowledged, and commits as many new ones under the same numbers
// before the relay's acknowledgement is due. The relay must not
// acknowledge them (removing events no broker has): it tells the
// rollback by the last event's id, and publishes every event the
// replica holds.
func TestRelayNeverAcknowledgesAnotherStoresEvents(t *testing.T) {
	before := openEngine(t, t.TempDir())
	defer before.Close()
	emit(t, before, 0, 5)
	src := &switchable{cur: before, notify: make(chan struct{}, 1)}
	b := &broker{sent: make(chan idemkv.StoredEvent, 20)}
	ackDue := make(chan chan time.Time, 10)
	r, err := outbox.New(src, b, &outbox.Options{AckInterval: time.Hour,
		After: func(time.Duration) <-chan time.Time { c := make(chan time.Time, 1); ackDue <- c; return c }})
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- r.Run(rctx) }()
	for range 5 {
		<-b.sent
	}
	due := <-ackDue // the acknowledgement is armed, not yet due

	replica := openEngine(t, t.TempDir())
	defer replica.Close()
	emit(t, replica, 10, 6)
	src.to(replica)
	due <- time.Time{}
	for range 6 {
		select {
		case <-b.sent:
		case <-time.After(10 * time.Second):
			t.Fatalf("the replica's events were not all published: %v", b.seqs())
		}
	}
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)

	evs, err := replica.ReadOutbox(ctx, 0, 100)
	require.NoError(t, err)
	require.Empty(t, evs, "every event of the replica was published and acknowledged")
	var published []string
	for _, ev := range b.stream[5:] {
		published = append(published, string(ev.Payload))
	}
	require.Equal(t, []string{"p10", "p11", "p12", "p13", "p14", "p15"}, published)
}

// TestRelayFailoverWithinADrain: the store fails over to a replica that
// lacked the relay's events, and numbered its own under the same
// sequences, between two reads of one drain: after the first event of
// the first read, just before the acknowledgement that AckEvery calls
// for, or before the one that ends a Drain. The next read (or the acknowledgement) finds the last event
// published gone, and the relay starts again from the replica's cursor:
// every replica event reaches the broker, in order, and none is
// acknowledged unpublished.
func TestRelayFailoverWithinADrain(t *testing.T) {
	for name, tc := range map[string]struct {
		at       string // "": once the old store is drained
		ackEvery int
	}{
		"between reads":                 {"p2", 6},
		"before acknowledgement":        {"p2", 3},
		"before the Drain acknowledges": {"", 100},
	} {
		t.Run(name, func(t *testing.T) {
			before := openEngine(t, t.TempDir())
			defer before.Close()
			emit(t, before, 0, 6)
			replica := openEngine(t, t.TempDir())
			defer replica.Close()
			emit(t, replica, 100, 8)
			src := &switchable{cur: before, notify: make(chan struct{}, 1)}
			if tc.at == "" {
				src.drained = func() { src.to(replica) }
			}
			b := &broker{fail: func(ev idemkv.StoredEvent) error {
				if tc.at != "" && string(ev.Payload) == tc.at {
					src.to(replica)
				}
				return nil
			}}
			r, err := outbox.New(src, b, &outbox.Options{Batch: 3, AckEvery: tc.ackEvery})
			require.NoError(t, err)
			_, err = r.Drain(ctx)
			require.NoError(t, err)
			var fromReplica []string
			for _, ev := range b.stream {
				if len(ev.Payload) == 4 { // p1xx
					fromReplica = append(fromReplica, string(ev.Payload))
				}
			}
			require.Equal(t, []string{"p100", "p101", "p102", "p103", "p104", "p105", "p106", "p107"}, fromReplica)
			left, err := replica.ReadOutbox(ctx, 0, 100)
			require.NoError(t, err)
			require.Empty(t, left)
		})
	}
}

// TestRelayFailoverAsItAcknowledges: the store fails over to a replica
// that lacked the relay's five events, and numbered some of its own from
// 1 (more than five, or fewer), after the relay read the cursor for its
// acknowledgement and before the acknowledgement reached the store. The
// store refuses it (event 5 is another, or is not there), so none of the
// replica's events is removed unpublished: the relay starts again from
// the replica's cursor, publishes all of them and acknowledges them.
func TestRelayFailoverAsItAcknowledges(t *testing.T) {
	for _, own := range []int{6, 3} {
		t.Run(fmt.Sprint(own, " events of its own"), func(t *testing.T) {
			before := openEngine(t, t.TempDir())
			defer before.Close()
			emit(t, before, 0, 5)
			replica := openEngine(t, t.TempDir())
			defer replica.Close()
			emit(t, replica, 100, own)
			src := &switchable{cur: before, notify: make(chan struct{}, 1)}
			src.acking = func() { src.to(replica); src.acking = nil }
			b := &broker{}
			r, err := outbox.New(src, b, &outbox.Options{AckEvery: 100})
			require.NoError(t, err)
			n, err := r.Drain(ctx)
			require.NoError(t, err)
			require.Equal(t, 5+own, n, "the old store's five, then the replica's")
			require.EqualValues(t, 1, r.Stats().Rollbacks)
			var fromReplica, want []string
			for _, ev := range b.stream[5:] {
				fromReplica = append(fromReplica, string(ev.Payload))
			}
			for i := range own {
				want = append(want, fmt.Sprint("p", 100+i))
			}
			require.Equal(t, want, fromReplica)
			left, err := replica.ReadOutbox(ctx, 0, 100)
			require.NoError(t, err)
			require.Empty(t, left)
		})
	}
}

// heldElsewhere is a store whose reads, while taken is set, find nothing:
// another relay holds its events (idemkv.OutboxHolder), as pgstore's
// outbox lease does once this relay's hold has run out.
type heldElsewhere struct {
	teststore.Store
	taken *bool
}

func (h heldElsewhere) ReadOutbox(ctx context.Context, after uint64, limit int) ([]idemkv.StoredEvent, error) {
	if *h.taken {
		*h.taken = false // given back by the next read
		return nil, nil
	}
	return h.Store.ReadOutbox(ctx, after, limit)
}

// TestRelayTellsAHoldLostFromARollback: a read that finds the last event
// published gone is a rollback only if the store's cursor says so; one
// that finds nothing because another relay holds the events now is not
// counted or logged as one. The relay reads again from the cursor and
// publishes every event.
func TestRelayTellsAHoldLostFromARollback(t *testing.T) {
	e := openEngine(t, t.TempDir())
	defer e.Close()
	emit(t, e, 0, 5)
	taken := false
	b := &broker{}
	b.fail = func(ev idemkv.StoredEvent) error {
		if ev.Seq == 3 && len(b.stream) == 2 {
			taken = true // after the first read's three events
		}
		return nil
	}
	r, err := outbox.New(heldElsewhere{Store: e, taken: &taken}, b, &outbox.Options{Batch: 3, AckEvery: 100})
	require.NoError(t, err)
	_, err = r.Drain(ctx)
	require.NoError(t, err)
	require.Zero(t, r.Stats().Rollbacks, "a hold lost is not a rollback")
	left, err := e.ReadOutbox(ctx, 0, 100)
	require.NoError(t, err)
	require.Empty(t, left, "every event published and acknowledged")
	require.Subset(t, b.seqs(), seq(1, 5))
}

// TestRelayTellsEventsAcknowledgedElsewhereFromARollback: while this
// relay has events 1 to 3 published and unacknowledged, another relay
// (which took the outbox over when this one's hold ran out) publishes
// and acknowledges through 4. This relay's next read finds 5 where its 3
// was: the store lost nothing, so no rollback is counted; the relay
// reads on from the cursor and every event is published.
func TestRelayTellsEventsAcknowledgedElsewhereFromARollback(t *testing.T) {
	e := openEngine(t, t.TempDir())
	defer e.Close()
	emit(t, e, 0, 8)
	b := &broker{}
	elsewhere := false
	b.fail = func(ev idemkv.StoredEvent) error {
		if ev.Seq == 3 && !elsewhere {
			elsewhere = true
			evs, err := e.ReadOutbox(ctx, 3, 1)
			require.NoError(t, err)
			require.NoError(t, e.AckOutbox(ctx, 4, evs[0].ID))
		}
		return nil
	}
	r, err := outbox.New(e, b, &outbox.Options{Batch: 3, AckEvery: 100})
	require.NoError(t, err)
	_, err = r.Drain(ctx)
	require.NoError(t, err)
	require.Zero(t, r.Stats().Rollbacks, "another relay acknowledged past this one; the store lost nothing")
	acked, last, err := e.OutboxCursor(ctx)
	require.NoError(t, err)
	require.Equal(t, [2]uint64{8, 8}, [2]uint64{acked, last})
	require.Subset(t, b.seqs(), seq(5, 8))
}
