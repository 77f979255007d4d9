package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/pgstore"
	"github.com/idemkv/idemkv/pgstore/pgtest"
)

// watchFleet opens two stores on one fresh database, as two processes of
// a fleet would, sharing a manual clock.
func watchFleet(t *testing.T) (a, b *pgstore.Store, clock *fakeclock.Clock) {
	t.Helper()
	clock = fakeclock.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	dsn := pgtest.Shared(t).CreateDatabase(t)
	a = reviewOpenOn(t, dsn, func(o *pgstore.Options) { o.Clock = clock })
	b = reviewOpenOn(t, dsn, func(o *pgstore.Options) { o.Clock = clock })
	return a, b, clock
}

// heldElsewhere claims id on b while a holds it, and returns the
// InProgress claim's token.
func heldElsewhere(t *testing.T, b *pgstore.Store, id idemkv.ID, mode idemkv.Mode) uint64 {
	t.Helper()
	c, err := b.Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: []byte{1}, Mode: mode})
	require.NoError(t, err)
	require.Equal(t, idemkv.InProgress, c.Outcome)
	return c.Record.Token
}

func requireWoken(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: the watch was not woken within 30 s", what)
	}
}

func requireNotWoken(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
		t.Fatalf("%s: the watch was woken while the attempt still runs", what)
	default:
	}
}

// TestWatchWakesWhenAnotherProcessSettles: a duplicate watching from one
// store is woken when the attempt another store holds completes, is
// released (with and without compensations), is marked uncertain by its
// holder, or is found abandoned by a claim; and not before.
func TestWatchWakesWhenAnotherProcessSettles(t *testing.T) {
	a, b, clock := watchFleet(t)
	for _, tc := range []struct {
		name   string
		mode   idemkv.Mode
		settle func(l idemkv.Lease) error
	}{
		{"complete", idemkv.ModeLocal, func(l idemkv.Lease) error {
			return a.Complete(ctx, l, idemkv.Result{Status: 201}, nil)
		}},
		{"complete with effects", idemkv.ModeLocal, func(l idemkv.Lease) error {
			return a.Complete(ctx, l, idemkv.Result{Status: 201}, func(fx idemkv.Effects) error {
				if err := fx.Set([]byte("k/"+l.ID.Key), []byte("v")); err != nil {
					return err
				}
				return fx.Emit(idemkv.Event{Topic: "t", Key: "e", Payload: []byte("p")})
			})
		}},
		{"release", idemkv.ModeLocal, func(l idemkv.Lease) error { return a.Release(ctx, l, nil) }},
		{"release with compensations", idemkv.ModeLocal, func(l idemkv.Lease) error {
			return a.Release(ctx, l, func(fx idemkv.Effects) error { return fx.Set([]byte("hold/"+l.ID.Key), []byte("0")) })
		}},
		{"mark uncertain", idemkv.ModeRemote, func(l idemkv.Lease) error { return a.MarkUncertain(ctx, l, "timeout") }},
		{"abandoned", idemkv.ModeRemote, func(l idemkv.Lease) error {
			clock.Advance(l.Expires.Sub(clock.Now()) + time.Second)
			c, err := a.Claim(ctx, idemkv.ClaimRequest{ID: l.ID, Fingerprint: []byte{1}, Mode: idemkv.ModeRemote})
			if err == nil && c.Outcome != idemkv.Reconciling {
				err = fmt.Errorf("the claim found %v, want Reconciling", c.Outcome)
			}
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := reviewID("watch-" + tc.name)
			l := reviewClaim(t, a, id, tc.mode)
			token := heldElsewhere(t, b, id, tc.mode)
			require.Equal(t, l.Token, token)
			settled, stop, err := b.Watch(ctx, id, token)
			require.NoError(t, err)
			defer stop()
			requireNotWoken(t, tc.name, settled)
			require.NoError(t, tc.settle(l))
			requireWoken(t, tc.name, settled)
		})
	}
}

// TestWatchOfASettledAttempt: a watch of a token that no longer holds the
// record (settled, or taken over) is woken at once.
func TestWatchOfASettledAttempt(t *testing.T) {
	a, b, _ := watchFleet(t)
	id := reviewID("settled")
	l := reviewClaim(t, a, id, idemkv.ModeLocal)
	require.NoError(t, a.Complete(ctx, l, idemkv.Result{Status: 201}, nil))
	settled, stop, err := b.Watch(ctx, id, l.Token)
	require.NoError(t, err)
	defer stop()
	requireWoken(t, "a completed attempt", settled)
}

// TestWatchRacesTheSettlingCommit: the watch and the completion run at
// once, round after round; whichever commits first, the watch is woken.
func TestWatchRacesTheSettlingCommit(t *testing.T) {
	a, b, _ := watchFleet(t)
	for round := range 40 {
		id := reviewID(fmt.Sprintf("race-%d", round))
		l := reviewClaim(t, a, id, idemkv.ModeLocal)
		token := heldElsewhere(t, b, id, idemkv.ModeLocal)
		var wg sync.WaitGroup
		wg.Go(func() { require.NoError(t, a.Complete(ctx, l, idemkv.Result{Status: 201}, nil)) })
		settled, stop, err := b.Watch(ctx, id, token)
		require.NoError(t, err)
		requireWoken(t, fmt.Sprintf("round %d", round), settled)
		stop()
		wg.Wait()
	}
}

// TestSettlingNotifiesOnlyWhenWatched: a record nobody watches settles
// without a notification (a notifying commit queues on a lock that every
// notifying commit takes); a watched one sends its token. Notifications
// arrive in commit order, so a marker notified after the commits shows
// what they sent.
func TestSettlingNotifiesOnlyWhenWatched(t *testing.T) {
	a, b, _ := watchFleet(t)
	conn, err := pgx.ConnectConfig(ctx, a.Pool().Config().ConnConfig.Copy())
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "LISTEN idemkv_settled")
	require.NoError(t, err)
	next := func() string {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		n, err := conn.WaitForNotification(wctx)
		require.NoError(t, err)
		return n.Payload
	}
	marker := func(m string) {
		t.Helper()
		_, err := a.Pool().Exec(ctx, "SELECT pg_notify('idemkv_settled', $1)", m)
		require.NoError(t, err)
	}

	l := reviewClaim(t, a, reviewID("unwatched"), idemkv.ModeLocal)
	heldElsewhere(t, b, l.ID, idemkv.ModeLocal) // a duplicate that does not wait
	require.NoError(t, a.Complete(ctx, l, idemkv.Result{Status: 201}, nil))
	l = reviewClaim(t, a, reviewID("unwatched-release"), idemkv.ModeLocal)
	require.NoError(t, a.Release(ctx, l, nil))
	marker("m1")
	require.Equal(t, "m1", next())

	l = reviewClaim(t, a, reviewID("watched"), idemkv.ModeLocal)
	settled, stop, err := b.Watch(ctx, l.ID, heldElsewhere(t, b, l.ID, idemkv.ModeLocal))
	require.NoError(t, err)
	defer stop()
	require.NoError(t, a.Complete(ctx, l, idemkv.Result{Status: 201}, nil))
	marker("m2")
	require.Equal(t, strconv.FormatUint(l.Token, 10), next())
	require.Equal(t, "m2", next())
	requireWoken(t, "the watched completion", settled)
}

// TestWatchWithoutListen: a store without LISTEN cannot watch, and says
// so (httpidem then answers 409 at once).
func TestWatchWithoutListen(t *testing.T) {
	s, _ := reviewStore(t, func(o *pgstore.Options) { o.NoListen = true })
	_, _, err := s.Watch(ctx, reviewID("k"), 1)
	require.True(t, errors.Is(err, idemkv.ErrCannotWatch), "got %v", err)
}

// TestASecondWatcherWaitsToo: a duplicate that finds the attempt marked
// by an earlier watcher writes nothing and waits as well; both are woken
// when the attempt settles.
func TestASecondWatcherWaitsToo(t *testing.T) {
	a, b, _ := watchFleet(t)
	id := reviewID("two-watchers")
	l := reviewClaim(t, a, id, idemkv.ModeRemote)
	token := heldElsewhere(t, b, id, idemkv.ModeRemote)
	first, stop1, err := b.Watch(ctx, id, token)
	require.NoError(t, err)
	defer stop1()
	second, stop2, err := a.Watch(ctx, id, token)
	require.NoError(t, err)
	defer stop2()
	requireNotWoken(t, "the first watcher", first)
	requireNotWoken(t, "the second watcher", second)
	require.NoError(t, a.Complete(ctx, l, idemkv.Result{Status: 201}, nil))
	requireWoken(t, "the first watcher", first)
	requireWoken(t, "the second watcher", second)
}

// TestWaitersCannotStarveACompletion: duplicates that keep arriving and
// watching while the attempt completes, reading business data (so in a
// SERIALIZABLE transaction), cost the completion at most one more run.
// When every watch raised a count on the record's row, each watch that
// landed between the completion's first read and its write failed it to
// serialize, 16 times in a row: ErrConflict, about data it had read that
// nobody changed.
func TestWaitersCannotStarveACompletion(t *testing.T) {
	a, b, _ := watchFleet(t)
	require.NoError(t, a.Update(ctx, func(fx idemkv.Effects) error { return fx.Set([]byte("balance"), []byte("1")) }))
	id := reviewID("storm")
	l := reviewClaim(t, a, id, idemkv.ModeRemote)
	token := heldElsewhere(t, b, id, idemkv.ModeRemote)

	storming := make(chan struct{})
	done := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-done:
					return
				default:
				}
				_, stop, err := b.Watch(ctx, id, token)
				if err != nil {
					t.Errorf("watch: %v", err)
					return
				}
				stop()
				if w == 0 && n == 100 {
					close(storming)
				}
			}
		})
	}
	<-storming
	before := a.Counts().Conflicts
	runs := 0
	err := a.Complete(ctx, l, idemkv.Result{Status: 201}, func(fx idemkv.Effects) error {
		runs++
		v, err := fx.Get([]byte("balance"))
		if err != nil {
			return err
		}
		for range 20 { // a handler that reads a while before it writes
			if _, err := fx.Get([]byte("limit")); !errors.Is(err, idemkv.ErrNotFound) {
				return fmt.Errorf("read limit: %v", err)
			}
		}
		return fx.Set([]byte("balance"), append(v, '1'))
	})
	close(done)
	wg.Wait()
	require.NoError(t, err)
	require.LessOrEqual(t, runs, 2)
	require.LessOrEqual(t, a.Counts().Conflicts-before, int64(1))
}
