package engine

import (
	"fmt"
	"iter"
	"slices"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/stretchr/testify/require"
)

// loadOpts are the options of the stores the Load tests seed and open.
func loadOpts(clock *fakeclock.Clock) *Options {
	return &Options{Clock: clock, Lease: 30 * time.Second, CacheSize: 8 << 20, MemTableSize: 1 << 20,
		RetentionClasses: map[string]time.Duration{"money": 30 * 24 * time.Hour}}
}

// seedRecords is a mix of what a store holds: completed records of two
// classes (with and without bodies), uncertain ones, and remote claims in
// progress whose lease has run out.
func seedRecords(n int) []idemkv.Record {
	var recs []idemkv.Record
	for i := range n {
		r := idemkv.Record{ID: id(fmt.Sprintf("done-%d", i)), State: idemkv.StateCompleted,
			Fingerprint: fpA, Result: idemkv.Result{Status: 201, Pointer: fmt.Sprintf("/p/%d", i)}}
		if i%3 == 0 {
			r.Class, r.Result.Body = "money", []byte(fmt.Sprintf(`{"id":%d}`, i))
		}
		recs = append(recs, r)
	}
	for i := range 10 {
		recs = append(recs, idemkv.Record{ID: id(fmt.Sprintf("unc-%d", i)), State: idemkv.StateUncertain,
			Mode: idemkv.ModeRemote, Fingerprint: fpA, Note: "provider timed out"})
	}
	for i := range 5 {
		recs = append(recs, idemkv.Record{ID: id(fmt.Sprintf("held-%d", i)), State: idemkv.StateInProgress,
			Mode: idemkv.ModeRemote, Fingerprint: fpA, LeaseExpires: t0.Add(-time.Second)})
	}
	return recs
}

// A seeded store is one the engine could have written: Check finds
// nothing wrong, replays of completed records come from their expiry
// buckets, uncertain records reconcile, expired remote claims are taken
// over with their operation id, and tokens handed out afterwards are
// later than the loaded ones.
func TestLoadWritesTheEngineLayout(t *testing.T) {
	clock := fakeclock.New(t0)
	dir := t.TempDir()
	recs := seedRecords(3000)
	n, err := Load(ctx, dir, loadOpts(clock), slices.Values(recs), nil)
	require.NoError(t, err)
	require.Equal(t, len(recs), n)

	e, err := Open(dir, loadOpts(clock))
	require.NoError(t, err)
	defer e.Close()
	rep, err := e.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%v", rep.Problems)
	require.Equal(t, 3000, rep.Completed)
	require.Equal(t, 10, rep.Uncertain)
	require.Equal(t, 5, rep.InProgress)

	var maxToken uint64
	for i, want := range recs {
		got, err := e.Get(ctx, want.ID)
		require.NoError(t, err, want.ID.Key)
		require.Equal(t, want.State, got.State)
		maxToken = max(maxToken, got.Token)
		if i < 3000 {
			require.Equal(t, want.Result.Pointer, got.Result.Pointer)
			require.Equal(t, want.Class, got.Class)
		}
	}
	<-e.ClaimFilterBuilt() // the filter must hold the keys in the buckets too
	c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id("done-3"), Fingerprint: fpA})
	require.NoError(t, err)
	require.Equal(t, idemkv.Replay, c.Outcome)
	require.Equal(t, `{"id":3}`, string(c.Record.Result.Body))
	require.True(t, t0.Add(30*24*time.Hour).Equal(c.Record.Expires), "the money class's window: %v", c.Record.Expires)
	c, err = e.Claim(ctx, idemkv.ClaimRequest{ID: id("unc-0"), Fingerprint: fpA})
	require.NoError(t, err)
	require.Equal(t, idemkv.Reconciling, c.Outcome)
	held, err := e.Get(ctx, id("held-0"))
	require.NoError(t, err)
	require.False(t, held.OperationID.IsZero(), "a remote record gets an operation id")
	c, err = e.Claim(ctx, idemkv.ClaimRequest{ID: id("held-0"), Fingerprint: fpA, Mode: idemkv.ModeRemote, Resumable: true})
	require.NoError(t, err)
	require.Equal(t, idemkv.Acquired, c.Outcome)
	require.Equal(t, held.OperationID, c.Lease.OperationID)
	require.Greater(t, c.Lease.Token, maxToken)
	c, err = e.Claim(ctx, idemkv.ClaimRequest{ID: id("new"), Fingerprint: fpA})
	require.NoError(t, err)
	require.Equal(t, idemkv.Acquired, c.Outcome)
	require.Greater(t, c.Lease.Token, maxToken)

	// Completed records expire with their class, as the engine's own do.
	clock.Advance(24 * time.Hour)
	_, err = e.Get(ctx, id("done-1"))
	require.ErrorIs(t, err, idemkv.ErrNotFound)
	_, err = e.Get(ctx, id("done-3"))
	require.NoError(t, err)
}

// An ID given twice, or already live in the store, is refused; records
// the engine would never store are refused; and the store Load leaves
// after a refusal is sound.
func TestLoadRefuses(t *testing.T) {
	clock := fakeclock.New(t0)
	dir := t.TempDir()
	one := func(r idemkv.Record) iter.Seq[idemkv.Record] { return slices.Values([]idemkv.Record{r}) }
	done := idemkv.Record{ID: id("k"), State: idemkv.StateCompleted, Fingerprint: fpA, Result: idemkv.Result{Status: 200}}

	_, err := Load(ctx, dir, loadOpts(clock), slices.Values([]idemkv.Record{done, done}), nil)
	require.ErrorIs(t, err, ErrExists)
	_, err = Load(ctx, dir, loadOpts(clock), one(done), nil)
	require.NoError(t, err)
	_, err = Load(ctx, dir, loadOpts(clock), one(done), nil)
	require.ErrorIs(t, err, ErrExists, "already live in the store")

	for name, r := range map[string]idemkv.Record{
		"local claim in progress": {ID: id("a"), State: idemkv.StateInProgress, Fingerprint: fpA},
		"effects":                 {ID: id("b"), State: idemkv.StateCompleted, Fingerprint: fpA, Effects: 1},
		"unknown class":           {ID: id("c"), State: idemkv.StateCompleted, Fingerprint: fpA, Class: "nope"},
		"no state":                {ID: id("d"), Fingerprint: fpA},
		"no fingerprint":          {ID: id("e"), State: idemkv.StateCompleted},
		"bad result":              {ID: id("f"), State: idemkv.StateCompleted, Fingerprint: fpA, Result: idemkv.Result{Status: -1}},
		"created after expiry": {ID: id("g"), State: idemkv.StateUncertain, Mode: idemkv.ModeRemote, Fingerprint: fpA,
			Expires: t0.Add(-time.Hour)}, // Created defaults to now
	} {
		_, err := Load(ctx, dir, loadOpts(clock), one(r), nil)
		require.Error(t, err, name)
	}

	e, err := Open(dir, loadOpts(clock))
	require.NoError(t, err)
	rep, err := e.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%v", rep.Problems)
	require.Equal(t, 1, rep.Records)

	// A store an engine holds cannot be loaded.
	_, err = Load(ctx, dir, loadOpts(clock), one(idemkv.Record{ID: id("z"), State: idemkv.StateCompleted, Fingerprint: fpA}), nil)
	require.Error(t, err)
	require.NoError(t, e.Close())
}
