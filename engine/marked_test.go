package engine

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine/internal/record"
)

// pastSecond puts the clock 1.234567 ms past a whole second: a mark is kept
// to the millisecond, rounded up.
const pastSecond = 1234567 * time.Nanosecond

// requireMarked requires that every read of i (Get, List of what awaits
// or is escalated, Scan) reports the record uncertain and marked at want,
// a whole millisecond.
func (v *env) requireMarked(i idemkv.ID, want time.Time) {
	v.t.Helper()
	require.Equal(v.t, want, want.Truncate(time.Millisecond), "a whole millisecond")
	rec, err := v.e.Get(ctx, i)
	require.NoError(v.t, err)
	require.Equal(v.t, idemkv.StateUncertain, rec.State)
	require.True(v.t, rec.Marked.Equal(want), "Get: marked %v, want %v", rec.Marked, want)
	page, err := v.e.List(ctx, idemkv.ListRequest{Escalated: rec.Escalated})
	require.NoError(v.t, err)
	listed := false
	for _, r := range page.Records {
		if r.ID == i {
			listed = true
			require.True(v.t, r.Marked.Equal(want), "List: marked %v, want %v", r.Marked, want)
		}
	}
	require.True(v.t, listed)
	scan, err := v.e.Scan(ctx, idemkv.ScanRequest{State: idemkv.StateUncertain})
	require.NoError(v.t, err)
	scanned := false
	for _, r := range scan.Records {
		if r.ID == i {
			scanned = true
			require.True(v.t, r.Marked.Equal(want), "Scan: marked %v, want %v", r.Marked, want)
		}
	}
	require.True(v.t, scanned)
}

// TestMarked: a record is marked uncertain, to the millisecond rounded
// up, by MarkUncertain, by a claim that finds its remote lease run out,
// and by escalating it while abandoned; escalating an uncertain record
// keeps its mark, and settling it drops it. Every read returns the mark,
// and it survives a reopen.
func TestMarked(t *testing.T) {
	v := newEnv(t)
	v.clock.Advance(pastSecond)
	ceil := func() time.Time { return v.clock.Now().Truncate(time.Millisecond).Add(time.Millisecond) }

	// By its holder.
	l := v.claim(id("held"), fpA, idemkv.ModeRemote).Lease
	v.clock.Advance(time.Second)
	byHolder := ceil()
	require.NoError(t, v.e.MarkUncertain(ctx, l, "timeout"))
	require.True(t, record.Milliseconds(v.clock.Now()).Equal(byHolder))
	v.requireMarked(id("held"), byHolder)

	// By a claim that found its remote lease run out.
	v.claim(id("expired"), fpA, idemkv.ModeRemote)
	v.clock.Advance(v.e.opts.Lease + 3*time.Second)
	byClaim := ceil()
	c := v.claim(id("expired"), fpA, idemkv.ModeRemote)
	require.Equal(t, idemkv.Reconciling, c.Outcome)
	require.True(t, c.Record.Marked.Equal(byClaim), "the claim's answer: %v", c.Record.Marked)
	v.requireMarked(id("expired"), byClaim)

	// By escalating an abandoned record, and not by escalating an
	// uncertain one.
	v.claim(id("abandoned"), fpA, idemkv.ModeRemote)
	v.clock.Advance(v.e.opts.Lease + 5*time.Second)
	rec, err := v.e.Get(ctx, id("abandoned"))
	require.NoError(t, err)
	require.Equal(t, idemkv.StateInProgress, rec.State)
	require.Zero(t, rec.Marked)
	byEscalation := ceil()
	require.NoError(t, v.e.Escalate(ctx, idemkv.EscalateRequest{ID: id("abandoned"), Token: rec.Token, Note: "gave up"}))
	v.requireMarked(id("abandoned"), byEscalation)
	v.clock.Advance(time.Minute)
	rec, err = v.e.Get(ctx, id("held"))
	require.NoError(t, err)
	require.NoError(t, v.e.Escalate(ctx, idemkv.EscalateRequest{ID: id("held"), Token: rec.Token, Note: "gave up"}))
	v.requireMarked(id("held"), byHolder)

	v.reopen()
	v.requireMarked(id("held"), byHolder)
	v.requireMarked(id("expired"), byClaim)
	v.requireMarked(id("abandoned"), byEscalation)
	v.requireSound()

	// Settled: a completed record has no mark, in memory or on disk.
	rec, err = v.e.Get(ctx, id("expired"))
	require.NoError(t, err)
	require.NoError(t, v.e.Resolve(ctx, idemkv.ResolveRequest{ID: rec.ID, Token: rec.Token, Result: idemkv.Result{Status: 201}}))
	c = v.claim(id("expired"), fpA, idemkv.ModeRemote)
	require.Equal(t, idemkv.Replay, c.Outcome)
	require.Zero(t, c.Record.Marked)
	v.reopen()
	rec, err = v.e.Get(ctx, id("expired"))
	require.NoError(t, err)
	require.Equal(t, idemkv.StateCompleted, rec.State)
	require.Zero(t, rec.Marked)
	v.requireSound()
}
