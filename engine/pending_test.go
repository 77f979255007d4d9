package engine

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine/internal/record"
	"github.com/stretchr/testify/require"
)

// listAll pages through a listing in pages of one record and returns the
// keys, in order.
func (v *env) listAll(req idemkv.ListRequest) []string {
	v.t.Helper()
	req.Limit = 1
	var keys []string
	for {
		page, err := v.e.List(ctx, req)
		require.NoError(v.t, err)
		require.LessOrEqual(v.t, len(page.Records), 1)
		for _, r := range page.Records {
			keys = append(keys, r.ID.Key)
		}
		if page.Next == "" {
			return keys
		}
		req.After = page.Next
	}
}

func (v *env) requireSound() {
	v.t.Helper()
	rep, err := v.e.Check(ctx)
	require.NoError(v.t, err)
	require.Zero(v.t, rep.ProblemCount, "%v", rep.Problems)
}

// TestListFindsWhatNeedsSettling walks records through every state the
// pending index knows, and checks the listings, the counts in Stats and
// the store's soundness at each step, across a reopen too.
func TestListFindsWhatNeedsSettling(t *testing.T) {
	v := newEnv(t)
	remote := func(key string) idemkv.Lease {
		c := v.claim(id(key), fpA, idemkv.ModeRemote)
		require.Equal(t, idemkv.Acquired, c.Outcome)
		v.clock.Advance(time.Second) // distinct creation times: a known order
		return c.Lease
	}
	crashed := remote("crashed")
	timedOut := remote("timed-out")
	live := remote("live")
	local := v.claim(id("local"), fpA, idemkv.ModeLocal).Lease
	other, err := v.e.Claim(ctx, idemkv.ClaimRequest{ID: idemkv.ID{Tenant: "acct_2", Endpoint: "POST /v1/payments", Key: "other"},
		Fingerprint: fpA, Mode: idemkv.ModeRemote})
	require.NoError(t, err)
	require.NoError(t, v.e.MarkUncertain(ctx, timedOut, "processor timed out"))
	require.NoError(t, v.e.MarkUncertain(ctx, other.Lease, "processor timed out"))

	// Nothing is past its lease yet: only the uncertain records await.
	require.Equal(t, []string{"timed-out", "other"}, v.listAll(idemkv.ListRequest{}))
	require.Equal(t, []string{"other"}, v.listAll(idemkv.ListRequest{Tenant: "acct_2"}))
	st, err := v.e.Stats()
	require.NoError(t, err)
	require.Equal(t, [3]int64{2, 0, 2}, [3]int64{st.UncertainRecords, st.EscalatedRecords, st.RemoteRecords})
	require.Equal(t, 2*time.Second, st.OldestUnsettled) // timed-out, created at t0+1s

	// Past the lease, the remote claims are abandoned: the one renewed is
	// not, and local claims never are.
	v.clock.Advance(20 * time.Second)
	_, err = v.e.Renew(ctx, live, time.Minute)
	require.NoError(t, err)
	v.clock.Advance(20 * time.Second)
	require.Equal(t, []string{"crashed", "timed-out", "other"}, v.listAll(idemkv.ListRequest{}))
	st, err = v.e.Stats()
	require.NoError(t, err)
	require.Equal(t, 43*time.Second, st.OldestUnsettled) // crashed, created at t0
	v.requireSound()

	// Escalated records move to their own listing, and stay uncertain.
	require.NoError(t, v.e.Escalate(ctx, idemkv.EscalateRequest{ID: id("crashed"), Token: crashed.Token, Note: "8 attempts"}))
	require.Equal(t, []string{"timed-out", "other"}, v.listAll(idemkv.ListRequest{}))
	require.Equal(t, []string{"crashed"}, v.listAll(idemkv.ListRequest{Escalated: true}))
	rec, err := v.e.Get(ctx, id("crashed"))
	require.NoError(t, err)
	require.True(t, rec.Escalated)
	require.Equal(t, idemkv.StateUncertain, rec.State)
	require.Equal(t, "8 attempts", rec.Note)
	c := v.claim(id("crashed"), fpA, idemkv.ModeRemote)
	require.Equal(t, idemkv.Reconciling, c.Outcome, "an escalated record is never re-run")

	// The crashed holder comes back: it is fenced.
	require.ErrorIs(t, v.e.Complete(ctx, crashed, idemkv.Result{Status: 201}, nil), idemkv.ErrFenced)

	// Counts and listings survive a reopen (the abandoned holder is gone).
	v.reopen()
	st, err = v.e.Stats()
	require.NoError(t, err)
	require.Equal(t, [3]int64{2, 1, 1}, [3]int64{st.UncertainRecords, st.EscalatedRecords, st.RemoteRecords})
	require.Equal(t, []string{"timed-out", "other"}, v.listAll(idemkv.ListRequest{}),
		"the renewal was written: its lease holds after a restart")
	v.clock.Advance(40 * time.Second)
	require.Equal(t, []string{"timed-out", "live", "other"}, v.listAll(idemkv.ListRequest{}), "until it runs out")

	// Resolving takes records out, with an audit note on the outcome.
	require.NoError(t, v.e.Resolve(ctx, idemkv.ResolveRequest{ID: id("crashed"), Token: crashed.Token,
		Result: idemkv.Result{Status: 201, Pointer: "/v1/payments/pay_1"}, Note: "ops: charge found at the processor"}))
	rec, err = v.e.Get(ctx, id("crashed"))
	require.NoError(t, err)
	require.Equal(t, idemkv.StateCompleted, rec.State)
	require.False(t, rec.Escalated)
	require.Equal(t, "ops: charge found at the processor", rec.Note)
	require.NoError(t, v.e.Resolve(ctx, idemkv.ResolveRequest{ID: id("timed-out"), Token: timedOut.Token, NoEffect: true}))
	require.NoError(t, v.e.Resolve(ctx, idemkv.ResolveRequest{ID: id("live"), Token: live.Token, NoEffect: true}))
	require.Equal(t, []string{"other"}, v.listAll(idemkv.ListRequest{}))
	require.Empty(t, v.listAll(idemkv.ListRequest{Escalated: true}))
	st, err = v.e.Stats()
	require.NoError(t, err)
	require.Equal(t, [3]int64{1, 0, 0}, [3]int64{st.UncertainRecords, st.EscalatedRecords, st.RemoteRecords})
	v.requireSound()
	_ = local
}

// TestSettleRefusesLiveWork: a record under a live lease, local or remote,
// cannot be resolved or escalated; a stale token is fenced.
func TestSettleRefusesLiveWork(t *testing.T) {
	v := newEnv(t)
	r := v.claim(id("r"), fpA, idemkv.ModeRemote).Lease
	l := v.claim(id("l"), fpA, idemkv.ModeLocal).Lease
	for _, lease := range []idemkv.Lease{r, l} {
		err := v.e.Resolve(ctx, idemkv.ResolveRequest{ID: lease.ID, Token: lease.Token, NoEffect: true})
		require.ErrorIs(t, err, idemkv.ErrWrongState)
		err = v.e.Escalate(ctx, idemkv.EscalateRequest{ID: lease.ID, Token: lease.Token})
		require.ErrorIs(t, err, idemkv.ErrWrongState)
	}
	v.clock.Advance(time.Minute)
	err := v.e.Resolve(ctx, idemkv.ResolveRequest{ID: l.ID, Token: l.Token, NoEffect: true})
	require.ErrorIs(t, err, idemkv.ErrWrongState, "a local claim past its lease is taken over, never reconciled")
	err = v.e.Escalate(ctx, idemkv.EscalateRequest{ID: r.ID, Token: r.Token + 1})
	require.ErrorIs(t, err, idemkv.ErrFenced)
	err = v.e.Escalate(ctx, idemkv.EscalateRequest{ID: r.ID, Token: r.Token, Note: string(make([]byte, idemkv.MaxNoteLen+1))})
	require.ErrorIs(t, err, idemkv.ErrInvalidArgument)
	_, err = v.e.List(ctx, idemkv.ListRequest{After: "zz"})
	require.ErrorIs(t, err, idemkv.ErrInvalidArgument)
	_, err = v.e.List(ctx, idemkv.ListRequest{After: "0578"})
	require.ErrorIs(t, err, idemkv.ErrInvalidArgument, "a cursor of the escalated section given to the other")
	_, err = v.e.List(ctx, idemkv.ListRequest{Limit: -1})
	require.ErrorIs(t, err, idemkv.ErrInvalidArgument)
	_, err = v.e.List(ctx, idemkv.ListRequest{Tenant: "\xff"})
	require.ErrorIs(t, err, idemkv.ErrInvalidScope)
	require.NoError(t, v.e.Escalate(ctx, idemkv.EscalateRequest{ID: r.ID, Token: r.Token}))
	v.requireSound()
}

// TestOpenMigratesLayout3 writes a store, takes it back to layout 3 (no
// pending index, the marker saying 3) with raw Pebble, and opens it: the
// read-write Open indexes its unsettled records in one batch with the new
// marker; a read-only Open refuses it.
func TestOpenMigratesLayout3(t *testing.T) {
	v := newEnv(t)
	timedOut := v.claim(id("timed-out"), fpA, idemkv.ModeRemote).Lease
	require.NoError(t, v.e.MarkUncertain(ctx, timedOut, "timeout"))
	v.claim(id("held"), fpA, idemkv.ModeRemote)
	done := v.claim(id("done"), fpA, idemkv.ModeRemote).Lease
	require.NoError(t, v.e.Complete(ctx, done, idemkv.Result{Status: 201}, nil))
	require.NoError(t, v.e.Close())
	v.e = nil

	db, err := pebble.Open(v.dir, v.opts.EnsureDefaults().PebbleOptions())
	require.NoError(t, err)
	require.NoError(t, db.DeleteRange(pendingStart, pendingEnd, pebble.Sync))
	require.NoError(t, db.Set(layoutKey, binary.BigEndian.AppendUint64(nil, layoutWithoutIndex), pebble.Sync))
	require.NoError(t, db.Close())

	ro := v.opts
	ro.ReadOnly = true
	_, err = Open(v.dir, &ro)
	require.ErrorIs(t, err, ErrLayout)

	v.open()
	v.requireSound()
	st, err := v.e.Stats()
	require.NoError(t, err)
	require.Equal(t, [2]int64{1, 1}, [2]int64{st.UncertainRecords, st.RemoteRecords})
	v.clock.Advance(time.Minute)
	require.Equal(t, []string{"held", "timed-out"}, v.listAll(idemkv.ListRequest{}), "created in the same second: by key")
}

// TestCheckFindsPendingIndexFaults: an entry for no record, an entry in
// the wrong state, and a record the index lacks are each reported.
func TestCheckFindsPendingIndexFaults(t *testing.T) {
	v := newEnv(t)
	a := v.claim(id("a"), fpA, idemkv.ModeRemote).Lease
	b := v.claim(id("b"), fpA, idemkv.ModeRemote).Lease
	require.NoError(t, v.e.MarkUncertain(ctx, b, ""))
	require.NoError(t, v.e.Close())
	v.e = nil
	db, err := pebble.Open(v.dir, v.opts.EnsureDefaults().PebbleOptions())
	require.NoError(t, err)
	recA := idemkv.Record{State: idemkv.StateInProgress, Mode: idemkv.ModeRemote, Created: t0}
	ka := record.AppendPendingKey(nil, &recA, appendRecordKey(nil, a.ID))
	require.NoError(t, db.Delete(ka, pebble.Sync))
	recB := idemkv.Record{State: idemkv.StateUncertain, Created: t0}
	kb := record.AppendPendingKey(nil, &recB, appendRecordKey(nil, b.ID))
	require.NoError(t, db.Set(kb, []byte{byte(idemkv.StateInProgress)}, pebble.Sync))
	ghost := idemkv.Record{State: idemkv.StateUncertain, Created: t0}
	require.NoError(t, db.Set(record.AppendPendingKey(nil, &ghost, appendRecordKey(nil, id("ghost"))), []byte{2}, pebble.Sync))
	require.NoError(t, db.Close())
	v.open()
	rep, err := v.e.Check(ctx)
	require.NoError(t, err)
	var whats []string
	for _, p := range rep.Problems {
		whats = append(whats, p.String())
	}
	require.Len(t, whats, 3, "%v", whats)
	require.Contains(t, whats, "acct_1/POST /v1/payments/a: unsettled record missing from the pending index")
	require.Contains(t, whats, "pending acct_1/POST /v1/payments/b: pending-index entry holds 01, want the record's state 2")
	require.Contains(t, whats, "pending acct_1/POST /v1/payments/ghost: pending-index entry for no unsettled record in its state and section")
}

// TestPendingCountsSurviveConflicts: a resolution whose reads conflict
// runs again; the runs that wrote nothing leave the counts of records
// that need settling (Stats, the metrics) as they were.
func TestPendingCountsSurviveConflicts(t *testing.T) {
	v := newEnv(t)
	k := []byte("k")
	c := v.claim(id("r1"), fpA, idemkv.ModeRemote)
	require.NoError(t, v.e.MarkUncertain(ctx, c.Lease, "timeout"))
	require.EqualValues(t, 1, v.stats().UncertainRecords)
	runs := 0
	require.NoError(t, v.e.Resolve(ctx, idemkv.ResolveRequest{ID: id("r1"), Token: c.Lease.Token, Result: idemkv.Result{Status: 200},
		Apply: func(fx idemkv.Effects) error {
			runs++
			if _, err := fx.Get(k); err != nil && !errors.Is(err, idemkv.ErrNotFound) {
				return err
			}
			if runs <= 3 { // another commit writes what this run read
				require.NoError(t, v.e.Update(ctx, func(w idemkv.Effects) error { return w.Set(k, []byte{byte(runs)}) }))
			}
			return fx.Set(k, []byte("resolved"))
		}}))
	require.Equal(t, 4, runs)
	st := v.stats()
	require.Zero(t, st.UncertainRecords)
	require.Zero(t, st.RemoteRecords)
}
