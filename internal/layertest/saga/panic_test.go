package saga_test

import (
	"log/slog"
	"testing"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/saga"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// get reads the record of the saga id's action ("" for the saga's own),
// and whether there is one.
func (s *shop) get(id, action string) (idemkv.Record, bool) {
	endpoint := "saga/order"
	if action != "" {
		endpoint += "/" + action
	}
	rec, err := s.e.Get(ctx, idemkv.ID{Tenant: "acct_1", Endpoint: endpoint, Key: id})
	if err != nil {
		require.ErrorIs(s.t, err, idemkv.ErrNotFound)
		return rec, false
	}
	return rec, true
}

// TestPanickingStepIsLeftForALaterPass: a local step that panics stops
// the runner, as a crash would, without a recovery point: its writes are
// dropped, its claim given up, the saga's record left in progress. The
// panic is counted and logged with its stack; Resume goes on once the
// saga's lease has run out.
func TestPanickingStepIsLeftForALaterPass(t *testing.T) {
	s := newShop(t)
	s.faults["confirm"] = []error{errPanicNow}
	r, buf := s.loggedRunner(slog.LevelInfo)
	before := func() idemkv.Record { rec, _ := s.get("o11", ""); return rec }

	var err error
	require.NotPanics(t, func() { _, err = r.Start(ctx, "acct_1", "o11", nil) })
	require.ErrorIs(t, err, saga.ErrPanicked)
	assert.Equal(t, int64(1), r.Stats().Panics)
	rec := before()
	assert.Equal(t, idemkv.StateInProgress, rec.State, "the saga's record is left as it was")
	assert.Equal(t, uint32(1), rec.Attempt)
	_, ok := s.get("o11", "do/confirm")
	assert.False(t, ok, "no recovery point, and the claim is given up")
	assert.Empty(t, s.data("order/o11/confirm"), "nothing the step wrote is stored")
	st, err := r.Status(ctx, "acct_1", "o11")
	require.NoError(t, err)
	assert.Equal(t, saga.Running, st.Phase)
	assert.Equal(t, "confirm", st.Step)

	recs, lines := records(t, buf, "o11")
	assert.Contains(t, lines, "ERROR saga: step panicked; left for a later pass [confirm do]")
	for _, m := range recs {
		if m["msg"] == "saga: step panicked; left for a later pass" {
			assert.Equal(t, "confirm: nil map", m["panic"])
			assert.Contains(t, m["stack"], "saga_test.(*shop).act", "the stack of the panic")
		}
	}
	assert.NotContains(t, lines, "ERROR saga: store error [confirm do]")

	n, err := r.Resume(ctx)
	require.NoError(t, err)
	assert.Zero(t, n, "its lease is live")
	s.clock.Advance(lease)
	n, err = r.Resume(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	st, err = r.Status(ctx, "acct_1", "o11")
	require.NoError(t, err)
	assert.Equal(t, saga.Completed, st.Phase)
	for action, want := range map[string]int{"reserve": 1, "authorize": 1, "confirm": 2, "capture": 1} {
		assert.Equal(t, want, s.count(action), action)
	}
	assert.Equal(t, "confirmed", s.data("order/o11/confirm"))
	s.requireSound()
}

// TestPanickingRemoteStepIsSentAgainUnderItsKey: a remote step whose call
// landed before its code panicked is left in progress, as a crash would
// leave it; the runner that takes the saga over sends it again under the
// same key, which the processor deduplicates.
func TestPanickingRemoteStepIsSentAgainUnderItsKey(t *testing.T) {
	s := newShop(t)
	s.faults["authorize"] = []error{errPanicAfterCall}
	r := s.runner()
	var err error
	require.NotPanics(t, func() { _, err = r.Start(ctx, "acct_1", "o12", nil) })
	require.ErrorIs(t, err, saga.ErrPanicked)
	rec, ok := s.get("o12", "do/authorize")
	require.True(t, ok)
	assert.Equal(t, idemkv.StateInProgress, rec.State, "its call may have landed: left for a takeover")

	s.clock.Advance(lease)
	n, err := r.Resume(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	st, err := r.Status(ctx, "acct_1", "o12")
	require.NoError(t, err)
	assert.Equal(t, saga.Completed, st.Phase)
	assert.Equal(t, 2, s.count("authorize"))
	assert.Len(t, s.ledger, 2, "authorized once, under one key, and captured")
	s.requireSound()
}

// TestCompensationThatKeepsPanickingIsEscalated: an undo that panics at
// every pass is escalated once it has panicked MaxAttempts times, as one
// that keeps failing is; an operator settles it, and the saga ends
// compensated.
func TestCompensationThatKeepsPanickingIsEscalated(t *testing.T) {
	s := newShop(t)
	s.faults["capture"] = []error{saga.ErrPermanent}
	s.faults["void"] = []error{errPanicNow, errPanicNow, errPanicNow}
	r := s.runner() // MaxAttempts: 3
	var err error
	require.NotPanics(t, func() { _, err = r.Start(ctx, "acct_1", "o13", nil) })
	require.ErrorIs(t, err, saga.ErrPanicked)
	st, err := r.Status(ctx, "acct_1", "o13")
	require.NoError(t, err)
	assert.Equal(t, saga.Status{Phase: saga.Running, Step: "authorize", Compensating: true, Failure: st.Failure,
		Outputs: st.Outputs}, st)

	s.clock.Advance(lease)
	require.NotPanics(t, func() { _, err = r.Resume(ctx) })
	require.ErrorIs(t, err, saga.ErrPanicked, "the second panic")
	s.clock.Advance(lease)
	var n int
	require.NotPanics(t, func() { n, err = r.Resume(ctx) })
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	assert.Equal(t, int64(3), r.Stats().Panics)
	assert.Equal(t, 3, s.count("void"))

	st, err = r.Status(ctx, "acct_1", "o13")
	require.NoError(t, err)
	assert.Equal(t, saga.Escalated, st.Phase)
	assert.Equal(t, "authorize", st.Step)
	page, err := s.e.List(ctx, idemkv.ListRequest{Escalated: true})
	require.NoError(t, err)
	require.Len(t, page.Records, 1)
	undo := page.Records[0]
	assert.Equal(t, "saga/order/undo/authorize", undo.ID.Endpoint)
	assert.Contains(t, undo.Note, "undo authorize panicked 3 times, the last: void: nil map")

	require.NoError(t, s.e.Resolve(ctx, idemkv.ResolveRequest{ID: undo.ID, Token: undo.Token, Result: idemkv.Result{Status: 200},
		Note: "ops: voided by hand"}))
	s.clock.Advance(lease)
	n, err = r.Resume(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	st, err = r.Status(ctx, "acct_1", "o13")
	require.NoError(t, err)
	assert.Equal(t, saga.Compensated, st.Phase)
	assert.Equal(t, "released", s.data("order/o13/reserve"))
	s.requireSound()
}
