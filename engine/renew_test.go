package engine

import (
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/fakeclock"
)

// requireLease requires that i's stored record is in progress with its
// lease running out at want (the codec keeps it to the millisecond).
func requireLease(t *testing.T, e *Engine, i idemkv.ID, want time.Time) {
	t.Helper()
	rec, err := e.Get(ctx, i)
	require.NoError(t, err)
	require.Equal(t, idemkv.StateInProgress, rec.State)
	require.True(t, rec.LeaseExpires.Equal(want), "lease runs out at %v, want %v", rec.LeaseExpires, want)
}

// TestRenewRemoteSurvivesACrash: a remote claim's renewal is durable when
// Renew returns. A crash right after it (the clone keeps only synced
// data) leaves the renewed lease, so the record is not abandoned, and
// neither listed nor resolvable, before the renewed lease runs out. So
// does a renewal by a holder whose slot a reopen dropped, and a clean
// reopen. The pending index stays sound throughout.
func TestRenewRemoteSurvivesACrash(t *testing.T) {
	mem := vfs.NewCrashableMem()
	clock := fakeclock.New(t0)
	opts := Options{FS: mem, Clock: clock, Lease: 30 * time.Second, CacheSize: 1 << 20, MemTableSize: 256 << 10,
		NoBackgroundSweep: true}
	e, err := Open("db", &opts)
	require.NoError(t, err)
	c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id("r"), Fingerprint: fpA, Mode: idemkv.ModeRemote})
	require.NoError(t, err)
	clock.Advance(10*time.Second + 1500*time.Microsecond)
	l, err := e.Renew(ctx, c.Lease, time.Minute)
	require.NoError(t, err)
	renewed := t0.Add(70*time.Second + time.Millisecond) // the codec keeps milliseconds
	require.True(t, l.Expires.Truncate(time.Millisecond).Equal(renewed))

	// crashed opens the store as a crash now would leave it, on a clock
	// of its own.
	crashed := func() (*Engine, *fakeclock.Clock) {
		t.Helper()
		o := opts
		o.FS = mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
		o.Clock = fakeclock.New(clock.Now())
		r, err := Open("db", &o)
		require.NoError(t, err)
		return r, o.Clock.(*fakeclock.Clock)
	}
	r, rclock := crashed()
	requireLease(t, r, id("r"), renewed)
	// Past the lease it was claimed with, the renewed one is live.
	rclock.Advance(time.Minute - time.Second)
	requireAbandoned(t, r, id("r"), false)
	rclock.Advance(time.Second)
	requireAbandoned(t, r, id("r"), true)
	requireCheck(t, r)
	require.NoError(t, r.Close())

	// A clean reopen drops the holder's slot; the holder renews through
	// the stored record, durably too.
	require.NoError(t, e.Close())
	e, err = Open("db", &opts)
	require.NoError(t, err)
	requireLease(t, e, id("r"), renewed)
	clock.Advance(30 * time.Second)
	l, err = e.Renew(ctx, l, 2*time.Minute)
	require.NoError(t, err)
	renewed = clock.Now().Add(2 * time.Minute).Truncate(time.Millisecond)
	r, _ = crashed()
	requireLease(t, r, id("r"), renewed)
	requireCheck(t, r)
	require.NoError(t, r.Close())

	// The holder still holds it, and completes.
	require.NoError(t, e.Complete(ctx, l, idemkv.Result{Status: 201}, nil))
	requireCheck(t, e)
	require.NoError(t, e.Close())
}

// requireAbandoned requires that i's record is, or is not, listed as
// awaiting reconciliation and resolvable.
func requireAbandoned(t *testing.T, e *Engine, i idemkv.ID, want bool) {
	t.Helper()
	page, err := e.List(ctx, idemkv.ListRequest{})
	require.NoError(t, err)
	listed := false
	for _, r := range page.Records {
		listed = listed || r.ID == i
	}
	require.Equal(t, want, listed, "listed")
	rec, err := e.Get(ctx, i)
	require.NoError(t, err)
	err = e.Escalate(ctx, idemkv.EscalateRequest{ID: i, Token: rec.Token + 1})
	if want {
		require.ErrorIs(t, err, idemkv.ErrFenced, "settleable, but not under another token")
	} else {
		require.ErrorIs(t, err, idemkv.ErrWrongState, "in progress under a live lease")
	}
}

func requireCheck(t *testing.T, e *Engine) {
	t.Helper()
	rep, err := e.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%v", rep.Problems)
}

// TestRenewLocalStaysInMemory: a local claim's renewal writes nothing
// (nothing of a local claim is stored), and the renewed lease holds.
func TestRenewLocalStaysInMemory(t *testing.T) {
	v := newEnv(t)
	c := v.claim(id("l"), fpA, idemkv.ModeLocal)
	v.e.testHookWrite = func() { t.Error("a local renewal wrote") }
	v.clock.Advance(20 * time.Second)
	l, err := v.e.Renew(ctx, c.Lease, time.Minute)
	require.NoError(t, err)
	v.e.testHookWrite = nil
	v.clock.Advance(30 * time.Second) // past the first lease
	dup := v.claim(id("l"), fpA, idemkv.ModeLocal)
	require.Equal(t, idemkv.InProgress, dup.Outcome)
	require.Equal(t, 30*time.Second, dup.RetryAfter)
	require.NoError(t, v.e.Complete(ctx, l, idemkv.Result{Status: 200}, nil))
	v.requireSound()
}

// TestRenewalInFlight: while a remote renewal's write is in flight its key
// is busy, as for every write of a record: a duplicate claim answers
// InProgress within about an fsync, and a read sees the lease before it.
func TestRenewalInFlight(t *testing.T) {
	v := newEnv(t)
	c := v.claim(id("r"), fpA, idemkv.ModeRemote)
	v.clock.Advance(10 * time.Second)
	in := false
	v.e.testHookWrite = func() {
		in = true
		dup := v.claim(id("r"), fpA, idemkv.ModeRemote)
		require.Equal(t, idemkv.InProgress, dup.Outcome)
		require.Equal(t, busyRetry, dup.RetryAfter)
		rec, err := v.e.Get(ctx, id("r"))
		require.NoError(t, err)
		require.True(t, rec.LeaseExpires.Equal(c.Lease.Expires), "the lease before the renewal")
	}
	_, err := v.e.Renew(ctx, c.Lease, time.Minute)
	require.NoError(t, err)
	require.True(t, in)
	v.e.testHookWrite = nil
	dup := v.claim(id("r"), fpA, idemkv.ModeRemote)
	require.Equal(t, idemkv.InProgress, dup.Outcome)
	require.Equal(t, time.Minute, dup.RetryAfter)
	v.requireSound()
}
