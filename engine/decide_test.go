package engine

import (
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/stretchr/testify/require"
)

// decideClaim's answers, one case per rule of the precedence in
// docs/design.md ("States and transitions"), without a store.
func TestDecideClaim(t *testing.T) {
	now := t0.Add(time.Hour)
	op := idemkv.OperationID{7}
	held := func(mode idemkv.Mode, leaseLeft time.Duration) *idemkv.Record {
		return &idemkv.Record{ID: id("k"), State: idemkv.StateInProgress, Mode: mode, Fingerprint: fpA,
			Token: 41, Attempt: 2, OperationID: op, Created: t0, LeaseExpires: now.Add(leaseLeft),
			Expires: t0.Add(24 * time.Hour), Class: "money"}
	}
	with := func(r *idemkv.Record, f func(*idemkv.Record)) *idemkv.Record { f(r); return r }
	completed := with(held(idemkv.ModeLocal, 0), func(r *idemkv.Record) {
		r.State, r.Result = idemkv.StateCompleted, idemkv.Result{Status: 201, Pointer: "/p/1"}
	})
	uncertain := with(held(idemkv.ModeRemote, 0), func(r *idemkv.Record) { r.State = idemkv.StateUncertain })
	expiresAt := func(now time.Time, class string) time.Time {
		if class == "money" {
			return now.Add(30 * 24 * time.Hour)
		}
		return now.Add(24 * time.Hour)
	}

	for _, tc := range []struct {
		name          string
		cur           *idemkv.Record
		busy, durable bool
		mode          idemkv.Mode
		resumable     bool
		fp            []byte
		check         func(t *testing.T, d claimDecision)
	}{
		{name: "absent: a new attempt", check: func(t *testing.T, d claimDecision) {
			require.Equal(t, idemkv.Acquired, d.outcome)
			require.Equal(t, idemkv.StateInProgress, d.rec.State)
			require.EqualValues(t, 1, d.rec.Attempt)
			require.Zero(t, d.rec.Token, "the engine assigns the token")
			require.True(t, d.rec.OperationID.IsZero(), "the engine assigns the operation id")
			require.Equal(t, now.Add(time.Minute), d.rec.LeaseExpires)
			require.Equal(t, now.Add(24*time.Hour), d.rec.Expires, "the claim's class, not the record's")
			require.Equal(t, now.Truncate(time.Second), d.rec.Created)
		}},
		{name: "another fingerprint beats every state", cur: completed, fp: []byte("other"), check: func(t *testing.T, d claimDecision) {
			require.Equal(t, idemkv.Mismatch, d.outcome)
			require.Zero(t, d.rec.Result, "another request's outcome is not shown")
		}},
		{name: "mismatch while held", cur: held(idemkv.ModeLocal, time.Second), busy: true, fp: []byte("other"), check: func(t *testing.T, d claimDecision) {
			require.Equal(t, idemkv.Mismatch, d.outcome)
		}},
		{name: "completed replays", cur: completed, check: func(t *testing.T, d claimDecision) {
			require.Equal(t, idemkv.Replay, d.outcome)
			require.Equal(t, 201, d.rec.Result.Status)
		}},
		{name: "uncertain reconciles", cur: uncertain, durable: true, check: func(t *testing.T, d claimDecision) {
			require.Equal(t, idemkv.Reconciling, d.outcome)
			require.False(t, d.write)
		}},
		{name: "a write in flight: retry in about an fsync", cur: held(idemkv.ModeLocal, -time.Second), busy: true, check: func(t *testing.T, d claimDecision) {
			require.Equal(t, idemkv.InProgress, d.outcome)
			require.Equal(t, busyRetry, d.retryAfter)
		}},
		{name: "a live lease: retry when it runs out", cur: held(idemkv.ModeRemote, 3*time.Second), durable: true, check: func(t *testing.T, d claimDecision) {
			require.Equal(t, idemkv.InProgress, d.outcome)
			require.Equal(t, 3*time.Second, d.retryAfter)
		}},
		{name: "expired local lease: taken over as a fresh attempt", cur: held(idemkv.ModeLocal, 0), mode: idemkv.ModeRemote, check: func(t *testing.T, d claimDecision) {
			require.Equal(t, idemkv.Acquired, d.outcome)
			require.Equal(t, idemkv.ModeRemote, d.rec.Mode, "the new attempt's mode")
			require.True(t, d.rec.OperationID.IsZero(), "a new operation")
			require.EqualValues(t, 3, d.rec.Attempt)
			require.Zero(t, d.rec.Token)
			require.Equal(t, t0.Add(24*time.Hour), d.rec.Expires, "the first claim's window stays")
		}},
		{name: "expired remote lease, resumable: the same operation", cur: held(idemkv.ModeRemote, 0), durable: true, mode: idemkv.ModeRemote, resumable: true, check: func(t *testing.T, d claimDecision) {
			require.Equal(t, idemkv.Acquired, d.outcome)
			require.Equal(t, op, d.rec.OperationID)
			require.EqualValues(t, 3, d.rec.Attempt)
		}},
		{name: "expired remote lease, not resumable: uncertain, written first", cur: held(idemkv.ModeRemote, 0), durable: true, mode: idemkv.ModeRemote, check: func(t *testing.T, d claimDecision) {
			require.Equal(t, idemkv.Reconciling, d.outcome)
			require.True(t, d.write)
			require.Equal(t, idemkv.StateUncertain, d.rec.State)
			require.EqualValues(t, 41, d.rec.Token, "the token stays for Resolve")
			require.Zero(t, d.rec.LeaseExpires)
			require.Equal(t, now.Add(30*24*time.Hour), d.rec.Expires, "the record's class")
			require.Contains(t, d.rec.Note, "attempt 2")
			require.True(t, d.rec.Marked.Equal(now), "marked uncertain now, not %v", d.rec.Marked)
		}},
		{name: "expired remote lease, local claim: uncertain", cur: held(idemkv.ModeRemote, 0), durable: true, resumable: true, check: func(t *testing.T, d claimDecision) {
			require.Equal(t, idemkv.Reconciling, d.outcome)
			require.True(t, d.write)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fp := tc.fp
			if fp == nil {
				fp = fpA
			}
			req := idemkv.ClaimRequest{ID: id("k"), Fingerprint: fp, Mode: tc.mode, Resumable: tc.resumable}
			c := claimCase{busy: tc.busy, durable: tc.durable, now: now, lease: time.Minute, class: "",
				expires: expiresAt(now, "")}
			if tc.cur != nil {
				c.cur, c.found, c.curExpires = *tc.cur, true, expiresAt(now, tc.cur.Class)
			}
			tc.check(t, decideClaim(&req, &c))
		})
	}
}
