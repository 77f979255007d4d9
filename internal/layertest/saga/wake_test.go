package saga_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/layertest/teststore"
	"github.com/idemkv/idemkv/reconcile"
	"github.com/idemkv/idemkv/saga"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// woke is what a reconciler's OnResolve hook got back from Wake.
type woke struct {
	key    string
	status saga.Status
	ok     bool
	err    error
}

// reconciler returns a worker that settles the shop's uncertain actions
// by its processor's ledger, with a grace of grace, and wakes through r
// the saga of each action it resolved.
func (s *shop) reconciler(r, waker *saga.Runner, grace time.Duration) (*reconcile.Worker, *[]woke) {
	var mu sync.Mutex
	var woken []woke
	w, err := reconcile.New(s.e, reconcile.ReconcilerFunc(func(ctx context.Context, rec idemkv.Record) (reconcile.Answer, error) {
		a, ok, err := r.ActionOf(ctx, rec)
		if err != nil || !ok {
			return reconcile.Answer{}, err
		}
		s.mu.Lock()
		_, found := s.ledger[a.Key]
		s.mu.Unlock()
		if !found {
			return reconcile.Answer{Verdict: reconcile.NotApplied}, nil
		}
		return reconcile.Answer{Verdict: reconcile.Applied, Result: saga.Done([]byte("auth_" + a.Key[:8]))}, nil
	}), &reconcile.Options{Clock: s.clock, Grace: grace, Handles: func(rec idemkv.Record) bool { return !r.Owns(rec) },
		OnResolve: func(ctx context.Context, rec idemkv.Record, _ reconcile.Verdict) {
			st, ok, err := waker.Wake(ctx, rec)
			mu.Lock()
			woken = append(woken, woke{rec.ID.Endpoint, st, ok, err})
			mu.Unlock()
		}})
	require.NoError(s.t, err)
	return w, &woken
}

// TestReconciledStepWakesItsSaga: a saga waiting on an authorization whose
// answer was lost goes on as soon as the reconciler has settled the step,
// in the same pass, not once its lease has run out: the step's grace is
// all the time that passes.
func TestReconciledStepWakesItsSaga(t *testing.T) {
	s := newShop(t)
	s.faults["authorize"] = []error{saga.ErrUnknown}
	r, buf := s.loggedRunner(slog.LevelInfo)
	st, err := r.Start(ctx, "acct_1", "o20", nil)
	require.NoError(t, err)
	require.Equal(t, saga.Waiting, st.Phase)
	started := s.clock.Now()

	w, woken := s.reconciler(r, r, time.Second)
	require.NoError(t, w.Pass(ctx)) // within the grace
	s.clock.Advance(time.Second)
	require.NoError(t, w.Pass(ctx))
	require.Equal(t, int64(1), w.Stats().Applied)
	require.Len(t, *woken, 1)
	assert.Equal(t, "saga/order/do/authorize", (*woken)[0].key)
	assert.True(t, (*woken)[0].ok)
	require.NoError(t, (*woken)[0].err)
	assert.Equal(t, saga.Completed, (*woken)[0].status.Phase)
	assert.Less(t, s.clock.Now().Sub(started), lease, "it did not wait for its lease")

	st, err = r.Status(ctx, "acct_1", "o20")
	require.NoError(t, err)
	assert.Equal(t, saga.Completed, st.Phase)
	assert.Equal(t, 1, s.count("authorize"))
	assert.Equal(t, 1, s.count("capture"))
	assert.Len(t, s.ledger, 2)
	assert.Equal(t, int64(1), r.Stats().Woken)
	_, lines := records(t, buf, "o20")
	assert.Contains(t, lines, "INFO saga: woken; its step was settled [authorize do]")
	n, err := r.Resume(ctx)
	require.NoError(t, err)
	assert.Zero(t, n, "nothing is left to resume")
	s.requireSound()
}

// TestStepNotAppliedIsSentAgainAtOnce: an authorization whose call never
// landed is settled as not applied; the woken saga sends it again, under
// the same key, at once.
func TestStepNotAppliedIsSentAgainAtOnce(t *testing.T) {
	s := newShop(t)
	s.faults["authorize"] = []error{errCallLost}
	r := s.runner()
	st, err := r.Start(ctx, "acct_1", "o21", nil)
	require.NoError(t, err)
	require.Equal(t, saga.Waiting, st.Phase)
	require.Empty(t, s.ledger)

	w, woken := s.reconciler(r, r, time.Second)
	require.NoError(t, w.Pass(ctx))
	s.clock.Advance(time.Second)
	require.NoError(t, w.Pass(ctx))
	require.Equal(t, int64(1), w.Stats().NotApplied)
	require.Len(t, *woken, 1)
	assert.Equal(t, saga.Completed, (*woken)[0].status.Phase)
	assert.Equal(t, 2, s.count("authorize"))
	assert.Len(t, s.ledger, 2, "authorized once, then captured")
	s.requireSound()
}

// TestWakeAfterTheSagasLeaseRanOut: with a grace longer than the saga's
// lease, the lease the runner kept has run out when the step is settled;
// no runner took the saga over, and Wake goes on with it at once.
func TestWakeAfterTheSagasLeaseRanOut(t *testing.T) {
	s := newShop(t)
	s.faults["authorize"] = []error{saga.ErrUnknown}
	r := s.runner()
	_, err := r.Start(ctx, "acct_1", "o22", nil)
	require.NoError(t, err)

	w, woken := s.reconciler(r, r, lease+5*time.Second)
	require.NoError(t, w.Pass(ctx))
	s.clock.Advance(lease + 5*time.Second)
	require.NoError(t, w.Pass(ctx))
	require.Len(t, *woken, 1)
	require.NoError(t, (*woken)[0].err)
	assert.Equal(t, saga.Completed, (*woken)[0].status.Phase)
	assert.Equal(t, 1, s.count("capture"))
	s.requireSound()
}

// TestWakeLeavesASagaItDoesNotHold: a runner that did not stop the saga
// (another process's, or this one after a restart) holds no lease of it,
// so Wake leaves a saga whose lease is live to the runner that holds it;
// Resume takes it over once that lease has run out. Wake ignores records
// that are not a saga action's.
func TestWakeLeavesASagaItDoesNotHold(t *testing.T) {
	s := newShop(t)
	s.faults["authorize"] = []error{saga.ErrUnknown}
	a, b := s.runner(), s.runner()
	_, err := a.Start(ctx, "acct_1", "o23", nil)
	require.NoError(t, err)

	w, woken := s.reconciler(a, b, time.Second)
	require.NoError(t, w.Pass(ctx))
	s.clock.Advance(time.Second)
	require.NoError(t, w.Pass(ctx))
	require.Len(t, *woken, 1)
	require.NoError(t, (*woken)[0].err)
	assert.Equal(t, saga.Status{Phase: saga.Running, Step: "confirm", Outputs: (*woken)[0].status.Outputs}, (*woken)[0].status,
		"authorized; the runner that holds the saga goes on")
	assert.Zero(t, s.count("confirm"))
	assert.Zero(t, b.Stats().Woken)

	for _, rec := range []idemkv.Record{
		{ID: idemkv.ID{Tenant: "acct_1", Endpoint: "saga/order", Key: "o23"}},
		{ID: idemkv.ID{Tenant: "acct_1", Endpoint: "POST /v1/payments", Key: "o23"}},
	} {
		_, ok, err := b.Wake(ctx, rec)
		require.NoError(t, err)
		assert.False(t, ok, rec.ID.Endpoint)
	}

	s.clock.Advance(lease)
	n, err := b.Resume(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	st, err := b.Status(ctx, "acct_1", "o23")
	require.NoError(t, err)
	assert.Equal(t, saga.Completed, st.Phase)
	s.requireSound()
}

// settlesOnMark is a store on which a step marked uncertain is settled
// at once, before the runner that marked it has returned: settle runs
// right after the mark commits.
type settlesOnMark struct {
	teststore.Store
	settle func(l idemkv.Lease)
}

func (m *settlesOnMark) MarkUncertain(ctx context.Context, l idemkv.Lease, note string) error {
	err := m.Store.MarkUncertain(ctx, l, note)
	if err == nil && m.settle != nil {
		m.settle(l)
	}
	return err
}

// TestSettledBeforeTheRunnerStops: a step settled between its mark and
// the moment its runner keeps the saga's lease is not missed: Wake, then,
// finds no lease to go on under, and the runner, looking at the step once
// more before it stops, goes on itself.
func TestSettledBeforeTheRunnerStops(t *testing.T) {
	s := newShop(t)
	s.faults["authorize"] = []error{saga.ErrUnknown}
	m := &settlesOnMark{Store: s.e}
	r, err := saga.New(m, s.definition(), &saga.Options{Lease: lease, MaxAttempts: 3,
		After: func(time.Duration) <-chan time.Time { return closedTime }})
	require.NoError(t, err)
	var wakes []saga.Status
	m.settle = func(l idemkv.Lease) {
		m.settle = nil
		rec, err := s.e.Get(ctx, l.ID)
		require.NoError(t, err)
		require.NoError(t, s.e.Resolve(ctx, idemkv.ResolveRequest{ID: rec.ID, Token: rec.Token, Result: saga.Done([]byte("auth"))}))
		st, ok, err := r.Wake(ctx, rec)
		require.NoError(t, err)
		require.True(t, ok)
		wakes = append(wakes, st)
	}
	st, err := r.Start(ctx, "acct_1", "o24", nil)
	require.NoError(t, err)
	require.Len(t, wakes, 1)
	assert.Equal(t, saga.Running, wakes[0].Phase, "the runner still holds the saga: Wake leaves it")
	assert.Equal(t, saga.Completed, st.Phase, "the runner saw the step settled and went on")
	assert.Equal(t, 1, s.count("capture"))
	s.requireSound()
}
