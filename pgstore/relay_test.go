package pgstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/outbox"
	"github.com/idemkv/idemkv/pgstore"
	"github.com/idemkv/idemkv/pgstore/pgtest"
	"github.com/stretchr/testify/require"
)

// recorder is a broker that records which relay published each event.
type recorder struct {
	mu   sync.Mutex
	by   map[string][]string // event id -> relays that published it
	seen chan struct{}
}

type relayPub struct {
	r    *recorder
	name string
}

func (p relayPub) Publish(_ context.Context, ev idemkv.StoredEvent) error {
	p.r.mu.Lock()
	p.r.by[ev.ID] = append(p.r.by[ev.ID], p.name)
	p.r.mu.Unlock()
	p.r.seen <- struct{}{}
	return nil
}

// waitFor waits until n distinct events have been published.
func (r *recorder) waitFor(t *testing.T, n int) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		r.mu.Lock()
		got := len(r.by)
		r.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-r.seen:
		case <-deadline:
			t.Fatalf("%d of %d events published", got, n)
		}
	}
}

// TestRelaysOfTwoStoresDoNotPublishTwice: two processes' relays on one
// database; the outbox is with one of them at a time, so no event is
// published by both, and when the holder closes the other takes over.
func TestRelaysOfTwoStoresDoNotPublishTwice(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	openStore := func() *pgstore.Store {
		s, err := pgstore.Open(ctx, dsn, &pgstore.Options{NoBackgroundSweep: true, OutboxPoll: 20 * time.Millisecond})
		require.NoError(t, err)
		return s
	}
	rec := &recorder{by: map[string][]string{}, seen: make(chan struct{}, 1024)}
	stores := map[string]*pgstore.Store{"a": openStore(), "b": openStore()}
	stops := map[string]func(){}
	for name, s := range stores {
		r, err := outbox.New(s, relayPub{rec, name}, nil)
		require.NoError(t, err)
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { _ = r.Run(rctx); close(done) }()
		stops[name] = func() { cancel(); <-done }
	}
	emit := func(s *pgstore.Store, from, n int) {
		for i := from; i < from+n; i++ {
			c, err := s.Claim(ctx, idemkv.ClaimRequest{ID: idemkv.ID{Tenant: "t", Endpoint: "pay", Key: fmt.Sprint("p", i)}, Fingerprint: []byte{1}})
			require.NoError(t, err)
			require.NoError(t, s.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, func(fx idemkv.Effects) error {
				return fx.Emit(idemkv.Event{Topic: "payments.created", Key: fmt.Sprint("acct", i%3), Payload: []byte("x")})
			}))
		}
	}
	emit(stores["a"], 0, 40)
	rec.waitFor(t, 40)
	rec.mu.Lock()
	holder := ""
	for id, relays := range rec.by {
		require.Len(t, relays, 1, "event %s published by %v", id, relays)
		if holder == "" {
			holder = relays[0]
		}
		require.Equal(t, holder, relays[0], "one relay has the outbox")
	}
	rec.mu.Unlock()

	other := map[string]string{"a": "b", "b": "a"}[holder]
	stops[holder]()
	require.NoError(t, stores[holder].Close()) // gives the outbox up
	emit(stores[other], 40, 40)
	rec.waitFor(t, 80)
	stops[other]()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for id, relays := range rec.by {
		require.Len(t, relays, 1, "event %s published by %v (the holder acknowledged all it published when it stopped)", id, relays)
	}
	acked, last, err := stores[other].OutboxCursor(ctx)
	require.NoError(t, err)
	require.Equal(t, [2]uint64{80, 80}, [2]uint64{acked, last})
	require.NoError(t, stores[other].Close())
}

// countingPub counts the publishes of each event id, and calls during
// each before it returns.
type countingPub struct {
	by     map[string]int
	during func()
}

func (p *countingPub) Publish(_ context.Context, ev idemkv.StoredEvent) error {
	p.by[ev.ID]++
	p.during()
	return nil
}

// TestSlowRelayKeepsTheOutbox: a relay whose publishes are slow (2 s
// each, on the stores' shared clock, against a 10 s lease) reads again
// within the hold a read leaves it, so its lease never runs out under
// it: another store's relay, draining while the first is deep in its
// batch, finds nothing to publish, and no event goes out twice.
func TestSlowRelayKeepsTheOutbox(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	clock := fakeclock.New(time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC))
	open := func() *pgstore.Store {
		s, err := pgstore.Open(ctx, dsn, &pgstore.Options{NoBackgroundSweep: true, Clock: clock, RelayLease: 10 * time.Second})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	a, b := open(), open()
	for i := range 12 {
		c, err := a.Claim(ctx, idemkv.ClaimRequest{ID: idemkv.ID{Tenant: "t", Endpoint: "pay", Key: fmt.Sprint("p", i)}, Fingerprint: []byte{1}})
		require.NoError(t, err)
		require.NoError(t, a.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, func(fx idemkv.Effects) error {
			return fx.Emit(idemkv.Event{Topic: "payments.created", Key: fmt.Sprint("acct", i%3), Payload: []byte("x")})
		}))
	}
	pub := &countingPub{by: map[string]int{}}
	rb, err := outbox.New(b, pub, nil)
	require.NoError(t, err)
	publishes, byB := 0, -1
	pub.during = func() {
		clock.Advance(2 * time.Second)
		if publishes++; publishes == 8 { // 16 s after a's first read
			n, err := rb.Drain(ctx)
			require.NoError(t, err)
			byB = n
		}
	}
	ra, err := outbox.New(a, pub, nil)
	require.NoError(t, err)
	n, err := ra.Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, 12, n)
	require.Zero(t, byB, "the other relay found the outbox held")
	require.Len(t, pub.by, 12)
	for id, times := range pub.by {
		require.Equal(t, 1, times, "event %s", id)
	}
}

// claimCounter counts a store's claims.
type claimCounter struct {
	*pgstore.Store
	claims int
}

func (c *claimCounter) ClaimOutbox(ctx context.Context, limit int) (idemkv.OutboxClaim, error) {
	c.claims++
	return c.Store.ClaimOutbox(ctx, limit)
}

// TestSharedRelayClaimsAgainWithinTheHold: a shared relay publishes a
// claim's events only within the store's hold (a claim's transaction is
// ended by the database once it has idled too long, and another relay
// may then take its events), then finishes the claim with what it
// published and claims the rest again. Every event goes out once.
func TestSharedRelayClaimsAgainWithinTheHold(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	clock := fakeclock.New(time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC))
	s, err := pgstore.Open(ctx, dsn, &pgstore.Options{NoBackgroundSweep: true, Clock: clock, RelayLease: 10 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	for i := range 12 {
		c, err := s.Claim(ctx, idemkv.ClaimRequest{ID: idemkv.ID{Tenant: "t", Endpoint: "pay", Key: fmt.Sprint("p", i)}, Fingerprint: []byte{1}})
		require.NoError(t, err)
		require.NoError(t, s.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, func(fx idemkv.Effects) error {
			return fx.Emit(idemkv.Event{Topic: "payments.created", Key: fmt.Sprint("acct", i%3), Payload: []byte("x")})
		}))
	}
	pub := &countingPub{by: map[string]int{}, during: func() { clock.Advance(2 * time.Second) }}
	cc := &claimCounter{Store: s}
	r, err := outbox.New(cc, pub, &outbox.Options{Shared: true})
	require.NoError(t, err)
	n, err := r.Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, 12, n)
	require.Len(t, pub.by, 12)
	for id, times := range pub.by {
		require.Equal(t, 1, times, "event %s", id)
	}
	// A 5 s hold: three publishes a claim (0, 2 and 4 s in), four
	// claims, and the one that finds nothing.
	require.Equal(t, 5, cc.claims)
}
