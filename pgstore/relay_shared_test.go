package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/outbox"
	"github.com/idemkv/idemkv/pgstore"
	"github.com/idemkv/idemkv/pgstore/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// sharedBroker records what shared relays publish: each event's
// publishers, whether two ever held one event at once, and each entity's
// order of publication.
type sharedBroker struct {
	mu        sync.Mutex
	inFlight  map[string]bool
	by        map[string][]string // event id -> relays, in order
	order     map[string][]uint64 // entity -> entity sequences, as published
	overlap   []string
	published chan struct{}
	// gate, if set, holds relay "a"'s first publish until another
	// relay has published: another claims while a holds a claim.
	gate chan struct{}
	fail map[string]int // entity/seq -> failures left to inject
}

type sharedPub struct {
	b    *sharedBroker
	name string
}

var errInjected = errors.New("injected publish failure")

// immediately is a relay's backoff that does not wait.
func immediately(time.Duration) <-chan time.Time {
	c := make(chan time.Time, 1)
	c <- time.Time{}
	return c
}

func (p sharedPub) Publish(ctx context.Context, ev idemkv.StoredEvent) error {
	b := p.b
	b.mu.Lock()
	if b.inFlight[ev.ID] {
		b.overlap = append(b.overlap, ev.ID)
	}
	b.inFlight[ev.ID] = true
	gate := b.gate
	if p.name == "a" {
		b.gate = nil
	}
	b.mu.Unlock()
	if gate != nil && p.name == "a" {
		select {
		case <-gate:
		case <-ctx.Done():
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.inFlight, ev.ID)
	ent := ev.Topic + "/" + ev.Key
	if f := fmt.Sprint(ent, "/", ev.EntitySeq); b.fail[f] > 0 {
		b.fail[f]--
		return errInjected
	}
	b.by[ev.ID] = append(b.by[ev.ID], p.name)
	b.order[ent] = append(b.order[ent], ev.EntitySeq)
	if p.name != "a" && b.gate != nil {
		close(b.gate)
		b.gate = nil
	}
	select {
	case b.published <- struct{}{}:
	default:
	}
	return nil
}

// TestSharedRelays: three processes' shared relays publish one outbox
// together while writers add events of a few entities. Every event is
// published, none by two relays at once, each entity's events in order
// (a failed publish is retried before its entity goes on), and the relays
// share the work: one claims while another holds a claim.
func TestSharedRelays(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	b := &sharedBroker{inFlight: map[string]bool{}, by: map[string][]string{}, order: map[string][]uint64{},
		published: make(chan struct{}, 1), gate: make(chan struct{}), fail: map[string]int{"things.created/e0/3": 1}}
	var stores []*pgstore.Store
	for _, name := range []string{"a", "b", "c"} {
		s, err := pgstore.Open(ctx, dsn, &pgstore.Options{NoBackgroundSweep: true})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		stores = append(stores, s)
		r, err := outbox.New(s, sharedPub{b, name}, &outbox.Options{Shared: true, Batch: 2, After: immediately})
		require.NoError(t, err)
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { _ = r.Run(rctx); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
	}

	const writers, perWriter, entities = 4, 60, 5
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			s := stores[w%len(stores)]
			for i := range perWriter {
				c, err := s.RunLocal(ctx, idemkv.ClaimRequest{ID: reviewID(fmt.Sprintf("w%d-%d", w, i)), Fingerprint: []byte{1}},
					idemkv.Result{Status: 201}, func(fx idemkv.Effects) error {
						return fx.Emit(idemkv.Event{Topic: "things.created", Key: fmt.Sprint("e", (w+i)%entities), Payload: []byte("x")})
					})
				require.NoError(t, err)
				require.Equal(t, idemkv.Acquired, c.Outcome)
			}
		})
	}
	wg.Wait()
	total := writers * perWriter
	for {
		b.mu.Lock()
		n := len(b.by)
		b.mu.Unlock()
		if n == total {
			break
		}
		<-b.published
	}

	b.mu.Lock()
	defer b.mu.Unlock()
	require.Empty(t, b.overlap, "events held by two relays at once")
	relays := map[string]int{}
	for id, by := range b.by {
		require.Len(t, by, 1, "event %s published by %v", id, by)
		relays[by[0]]++
	}
	require.GreaterOrEqual(t, len(relays), 2, "the relays share the work: %v", relays)
	require.Zero(t, b.fail["things.created/e0/3"], "the injected failure happened")
	for ent, seqs := range b.order {
		for i, seq := range seqs {
			require.Equal(t, uint64(i+1), seq, "%s published out of order: %v", ent, seqs)
		}
	}
	rep, err := stores[0].Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%v", rep.Problems)
}

// TestClaimOutbox: a claim holds its entities' heads and what follows
// them; another claim gets only other entities; what a claim does not
// mark published is claimed again; acked follows the published prefix.
func TestClaimOutbox(t *testing.T) {
	s, _ := reviewStore(t, nil)
	for i, ent := range []string{"e1", "e1", "e2"} {
		_, err := s.RunLocal(ctx, idemkv.ClaimRequest{ID: reviewID(fmt.Sprint("k", i)), Fingerprint: []byte{1}},
			idemkv.Result{Status: 201}, func(fx idemkv.Effects) error {
				return fx.Emit(idemkv.Event{Topic: "t", Key: ent, Payload: []byte{byte(i)}})
			})
		require.NoError(t, err)
	}
	claimed := func(c idemkv.OutboxClaim) (got []string) {
		for _, ev := range c.Events() {
			got = append(got, fmt.Sprint(ev.Key, "#", ev.EntitySeq))
		}
		return got
	}
	_, err := s.ClaimOutbox(ctx, 0)
	require.ErrorIs(t, err, idemkv.ErrInvalidArgument)

	c1, err := s.ClaimOutbox(ctx, 1)
	require.NoError(t, err)
	require.Equal(t, []string{"e1#1"}, claimed(c1))
	c2, err := s.ClaimOutbox(ctx, 10)
	require.NoError(t, err)
	require.Equal(t, []string{"e2#1"}, claimed(c2), "e1#2 waits behind e1#1")
	c3, err := s.ClaimOutbox(ctx, 10)
	require.NoError(t, err)
	require.Empty(t, claimed(c3))
	require.NoError(t, c3.Finish(ctx, 0))

	require.NoError(t, c1.Finish(ctx, 1))
	require.ErrorIs(t, c1.Finish(ctx, 1), idemkv.ErrInvalidArgument)
	acked, _, err := s.OutboxCursor(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, acked)
	c3, err = s.ClaimOutbox(ctx, 10)
	require.NoError(t, err)
	require.Equal(t, []string{"e1#2"}, claimed(c3))
	require.NoError(t, c2.Finish(ctx, 0)) // e2#1 given back
	require.NoError(t, c3.Finish(ctx, 1))
	acked, _, err = s.OutboxCursor(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, acked, "e2#1 (the third) is not published yet")
	c4, err := s.ClaimOutbox(ctx, 10)
	require.NoError(t, err)
	require.Equal(t, []string{"e2#1"}, claimed(c4))
	require.NoError(t, c4.Finish(ctx, 1))
	acked, last, err := s.OutboxCursor(ctx)
	require.NoError(t, err)
	require.Equal(t, [2]uint64{3, 3}, [2]uint64{acked, last})
	rep, err := s.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%v", rep.Problems)
	require.Zero(t, rep.Events)
}

// TestSharedRelayStatsFollowTheCursor: a shared relay's Stats.Acked is
// the store's cursor as it last read it, whether or not its drain reached
// an empty claim (a busy fleet's relays seldom do).
func TestSharedRelayStatsFollowTheCursor(t *testing.T) {
	s, _ := reviewStore(t, nil)
	for i := range 5 {
		_, err := s.RunLocal(ctx, idemkv.ClaimRequest{ID: reviewID(fmt.Sprint("k", i)), Fingerprint: []byte{1}},
			idemkv.Result{Status: 201}, func(fx idemkv.Effects) error {
				return fx.Emit(idemkv.Event{Topic: "t", Key: "e", Payload: []byte{byte(i)}})
			})
		require.NoError(t, err)
	}
	b := &sharedBroker{inFlight: map[string]bool{}, by: map[string][]string{}, order: map[string][]uint64{},
		published: make(chan struct{}, 5), fail: map[string]int{"t/e/5": 1}}
	r, err := outbox.New(s, sharedPub{b, "a"}, &outbox.Options{Shared: true, Batch: 2, After: immediately})
	require.NoError(t, err)
	n, err := r.Drain(ctx)
	require.ErrorIs(t, err, errInjected)
	require.Equal(t, 4, n)
	acked, _, err := s.OutboxCursor(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 4, acked)
	require.EqualValues(t, acked, r.Stats().Acked)
}

// TestAdvanceDoesNotWaitForRowLocks: a published event still in the
// outbox whose row another transaction holds locked (as a claim that met
// and skipped it does, until it ends) does not stall Finish, nor the
// sequencer behind the cursor row; the prefix is deleted by a later
// advance, once the lock is gone.
func TestAdvanceDoesNotWaitForRowLocks(t *testing.T) {
	s, dsn := reviewStore(t, nil)
	emit := func(key, ent string) {
		_, err := s.RunLocal(ctx, idemkv.ClaimRequest{ID: reviewID(key), Fingerprint: []byte{1}}, idemkv.Result{Status: 201},
			func(fx idemkv.Effects) error { return fx.Emit(idemkv.Event{Topic: "t", Key: ent}) })
		require.NoError(t, err)
	}
	emit("k1", "x")
	emit("k2", "y")
	_, _, err := s.OutboxCursor(ctx) // numbers them
	require.NoError(t, err)
	locker, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer locker.Close(ctx)
	// Another relay published x#1 and its advance has not run yet; a
	// claim holds its row.
	_, err = locker.Exec(ctx, `UPDATE idemkv_outbox SET published = true WHERE seq = 1`)
	require.NoError(t, err)
	tx, err := locker.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM idemkv_outbox WHERE seq = 1 FOR UPDATE`)
	require.NoError(t, err)

	c, err := s.ClaimOutbox(ctx, 10)
	require.NoError(t, err)
	require.Len(t, c.Events(), 1)
	finished := make(chan error, 1)
	go func() { finished <- c.Finish(ctx, 1) }()
	select {
	case err := <-finished:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Finish waited for the row lock")
	}
	emit("k3", "z")
	acked, last, err := s.OutboxCursor(ctx)
	require.NoError(t, err)
	require.Equal(t, [2]uint64{0, 3}, [2]uint64{acked, last}, "the prefix waits for the lock")

	require.NoError(t, tx.Rollback(ctx))
	c, err = s.ClaimOutbox(ctx, 10)
	require.NoError(t, err)
	require.Len(t, c.Events(), 1)
	require.NoError(t, c.Finish(ctx, 1))
	acked, last, err = s.OutboxCursor(ctx)
	require.NoError(t, err)
	require.Equal(t, [2]uint64{3, 3}, [2]uint64{acked, last})
	rep, err := s.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%v", rep.Problems)
}
