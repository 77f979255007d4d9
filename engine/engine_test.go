package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/stretchr/testify/require"
)

var ctx = context.Background()

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// env is an engine on a real on-disk directory with a fake clock.
type env struct {
	t     testing.TB
	dir   string
	clock *fakeclock.Clock
	opts  Options
	e     *Engine
}

func newEnv(t testing.TB) *env {
	v := &env{t: t, dir: t.TempDir(), clock: fakeclock.New(t0)}
	v.opts = Options{Clock: v.clock, Lease: 30 * time.Second, CacheSize: 8 << 20, MemTableSize: 4 << 20}
	v.open()
	t.Cleanup(func() {
		if v.e != nil {
			_ = v.e.Close()
		}
	})
	return v
}

func (v *env) open() {
	e, err := Open(v.dir, &v.opts)
	require.NoError(v.t, err)
	v.e = e
}

func (v *env) reopen() {
	require.NoError(v.t, v.e.Close())
	v.open()
}

func id(key string) idemkv.ID {
	return idemkv.ID{Tenant: "acct_1", Endpoint: "POST /v1/payments", Key: key}
}

var fpA, fpB = []byte{1, 'a'}, []byte{1, 'b'}

func (v *env) claim(i idemkv.ID, fp []byte, mode idemkv.Mode) idemkv.Claim {
	c, err := v.e.Claim(ctx, idemkv.ClaimRequest{ID: i, Fingerprint: fp, Mode: mode})
	require.NoError(v.t, err)
	return c
}

func TestClaimCompleteReplay(t *testing.T) {
	v := newEnv(t)
	c := v.claim(id("p42"), fpA, idemkv.ModeLocal)
	require.Equal(t, idemkv.Acquired, c.Outcome)
	require.NotZero(t, c.Lease.Token)
	require.Equal(t, t0.Add(30*time.Second), c.Lease.Expires)

	dup := v.claim(id("p42"), fpA, idemkv.ModeLocal)
	require.Equal(t, idemkv.InProgress, dup.Outcome)
	require.Equal(t, 30*time.Second, dup.RetryAfter)

	res := idemkv.Result{Status: 201, Pointer: "/v1/payments/p42", Body: []byte(`{"id":"p42"}`)}
	require.NoError(t, v.e.Complete(ctx, c.Lease, res, func(w idemkv.Effects) error {
		return w.Set([]byte("payment/p42"), []byte("5000"))
	}))
	for range 2 {
		r := v.claim(id("p42"), fpA, idemkv.ModeLocal)
		require.Equal(t, idemkv.Replay, r.Outcome)
		require.Equal(t, res, r.Record.Result)
		v.reopen()
	}
	got, err := v.e.GetData(ctx, []byte("payment/p42"))
	require.NoError(t, err)
	require.Equal(t, "5000", string(got))

	m := v.claim(id("p42"), fpB, idemkv.ModeLocal)
	require.Equal(t, idemkv.Mismatch, m.Outcome)
	require.Equal(t, fpA, m.Record.Fingerprint)
	require.Zero(t, m.Record.Result, "a mismatch must not leak the stored result")
}

func TestTenantIsolation(t *testing.T) {
	v := newEnv(t)
	a := idemkv.ID{Tenant: "alice", Endpoint: "POST /x", Key: "k1"}
	b := idemkv.ID{Tenant: "bob", Endpoint: "POST /x", Key: "k1"}
	ca := v.claim(a, fpA, idemkv.ModeLocal)
	require.Equal(t, idemkv.Acquired, ca.Outcome)
	// Bob's same key string is not blocked by Alice's claim...
	cb := v.claim(b, fpB, idemkv.ModeLocal)
	require.Equal(t, idemkv.Acquired, cb.Outcome)
	require.NoError(t, v.e.Complete(ctx, ca.Lease, idemkv.Result{Status: 200, Body: []byte("alice")}, nil))
	require.NoError(t, v.e.Complete(ctx, cb.Lease, idemkv.Result{Status: 200, Body: []byte("bob")}, nil))
	// ...and neither replays the other's result.
	require.Equal(t, "alice", string(v.claim(a, fpA, idemkv.ModeLocal).Record.Result.Body))
	require.Equal(t, "bob", string(v.claim(b, fpB, idemkv.ModeLocal).Record.Result.Body))
	// Scope parts are length-prefixed: ("ab","c") is not ("a","bc").
	x := idemkv.ID{Tenant: "ab", Endpoint: "c", Key: "k"}
	y := idemkv.ID{Tenant: "a", Endpoint: "bc", Key: "k"}
	require.Equal(t, idemkv.Acquired, v.claim(x, fpA, idemkv.ModeLocal).Outcome)
	require.Equal(t, idemkv.Acquired, v.claim(y, fpA, idemkv.ModeLocal).Outcome)
}

func TestLocalTakeoverFencesStaleHolder(t *testing.T) {
	v := newEnv(t)
	a := v.claim(id("k"), fpA, idemkv.ModeLocal)
	v.clock.Advance(31 * time.Second)
	b := v.claim(id("k"), fpA, idemkv.ModeLocal)
	require.Equal(t, idemkv.Acquired, b.Outcome)
	require.True(t, b.Lease.Takeover())
	require.Greater(t, b.Lease.Token, a.Lease.Token)

	err := v.e.Complete(ctx, a.Lease, idemkv.Result{Status: 200}, func(w idemkv.Effects) error {
		return w.Set([]byte("effect/k"), []byte("stale"))
	})
	require.ErrorIs(t, err, idemkv.ErrFenced)
	_, err = v.e.GetData(ctx, []byte("effect/k"))
	require.ErrorIs(t, err, idemkv.ErrNotFound, "a fenced completion must not apply its effects")
	_, err = v.e.Renew(ctx, a.Lease, 0)
	require.ErrorIs(t, err, idemkv.ErrFenced)
	require.ErrorIs(t, v.e.Release(ctx, a.Lease, nil), idemkv.ErrFenced)
	require.ErrorIs(t, v.e.MarkUncertain(ctx, a.Lease, "x"), idemkv.ErrFenced)

	require.NoError(t, v.e.Complete(ctx, b.Lease, idemkv.Result{Status: 200}, nil))
	require.Equal(t, idemkv.Replay, v.claim(id("k"), fpA, idemkv.ModeLocal).Outcome)
}

func TestRemoteClaimIsDurableAndNeverRerunBlind(t *testing.T) {
	v := newEnv(t)
	a := v.claim(id("r"), fpA, idemkv.ModeRemote)
	require.Equal(t, idemkv.Acquired, a.Outcome)
	require.False(t, a.Lease.OperationID.IsZero())
	v.reopen() // the holder is gone; its claim is not

	c := v.claim(id("r"), fpA, idemkv.ModeRemote)
	require.Equal(t, idemkv.InProgress, c.Outcome, "lease still live after restart")
	v.clock.Advance(31 * time.Second)
	c = v.claim(id("r"), fpA, idemkv.ModeRemote)
	require.Equal(t, idemkv.Reconciling, c.Outcome, "an expired remote claim must not re-run blind")
	require.Equal(t, idemkv.StateUncertain, c.Record.State)
	v.reopen()
	require.Equal(t, idemkv.Reconciling, v.claim(id("r"), fpA, idemkv.ModeRemote).Outcome)

	rec, err := v.e.Get(ctx, id("r"))
	require.NoError(t, err)
	require.Equal(t, a.Lease.OperationID, rec.OperationID)
	require.ErrorIs(t, v.e.Resolve(ctx, idemkv.ResolveRequest{ID: id("r"), Token: rec.Token + 1, Result: idemkv.Result{Status: 201}}), idemkv.ErrFenced)
	require.NoError(t, v.e.Resolve(ctx, idemkv.ResolveRequest{ID: id("r"), Token: rec.Token, Result: idemkv.Result{Status: 201, Pointer: "/p/r"}}))
	r := v.claim(id("r"), fpA, idemkv.ModeRemote)
	require.Equal(t, idemkv.Replay, r.Outcome)
	require.Equal(t, "/p/r", r.Record.Result.Pointer)
}

func TestRemoteResumeKeepsOperationID(t *testing.T) {
	v := newEnv(t)
	req := idemkv.ClaimRequest{ID: id("r"), Fingerprint: fpA, Mode: idemkv.ModeRemote, Resumable: true}
	a, err := v.e.Claim(ctx, req)
	require.NoError(t, err)
	v.clock.Advance(time.Minute)
	b, err := v.e.Claim(ctx, req)
	require.NoError(t, err)
	require.Equal(t, idemkv.Acquired, b.Outcome)
	require.Equal(t, uint32(2), b.Lease.Attempt)
	require.Equal(t, a.Lease.OperationID, b.Lease.OperationID, "the downstream identity survives a takeover")
	require.ErrorIs(t, v.e.Complete(ctx, a.Lease, idemkv.Result{Status: 200}, nil), idemkv.ErrFenced)
	require.NoError(t, v.e.Complete(ctx, b.Lease, idemkv.Result{Status: 200}, nil))
}

func TestReleaseAndMarkUncertain(t *testing.T) {
	v := newEnv(t)
	for _, mode := range []idemkv.Mode{idemkv.ModeLocal, idemkv.ModeRemote} {
		key := "rel-" + mode.String()
		a := v.claim(id(key), fpA, mode)
		require.NoError(t, v.e.Release(ctx, a.Lease, nil))
		v.reopen()
		b := v.claim(id(key), fpB, mode)
		require.Equal(t, idemkv.Acquired, b.Outcome, "a released key runs anew, even with another body")

		key = "unc-" + mode.String()
		c := v.claim(id(key), fpA, mode)
		require.NoError(t, v.e.MarkUncertain(ctx, c.Lease, "provider timed out"))
		v.reopen()
		r := v.claim(id(key), fpA, mode)
		require.Equal(t, idemkv.Reconciling, r.Outcome)
		require.Equal(t, "provider timed out", r.Record.Note)
		v.clock.Advance(48 * time.Hour)
		require.Equal(t, idemkv.Reconciling, v.claim(id(key), fpA, mode).Outcome, "uncertain records never expire into a re-run")
		require.NoError(t, v.e.Resolve(ctx, idemkv.ResolveRequest{ID: id(key), Token: r.Record.Token, NoEffect: true}))
		require.Equal(t, idemkv.Acquired, v.claim(id(key), fpA, mode).Outcome)
	}
}

func TestRenew(t *testing.T) {
	v := newEnv(t)
	a := v.claim(id("k"), fpA, idemkv.ModeLocal)
	v.clock.Advance(20 * time.Second)
	l, err := v.e.Renew(ctx, a.Lease, time.Minute)
	require.NoError(t, err)
	require.Equal(t, a.Lease.Token, l.Token)
	v.clock.Advance(50 * time.Second) // past the original lease, within the renewed one
	require.Equal(t, idemkv.InProgress, v.claim(id("k"), fpA, idemkv.ModeLocal).Outcome)
	v.clock.Advance(11 * time.Second)
	require.Equal(t, idemkv.Acquired, v.claim(id("k"), fpA, idemkv.ModeLocal).Outcome)
}

func TestRetentionExpiry(t *testing.T) {
	v := newEnv(t)
	a := v.claim(id("k"), fpA, idemkv.ModeLocal)
	require.NoError(t, v.e.Complete(ctx, a.Lease, idemkv.Result{Status: 200}, nil))
	v.clock.Advance(24*time.Hour - time.Millisecond)
	require.Equal(t, idemkv.Replay, v.claim(id("k"), fpA, idemkv.ModeLocal).Outcome)
	v.clock.Advance(time.Millisecond)
	_, err := v.e.Get(ctx, id("k"))
	require.ErrorIs(t, err, idemkv.ErrNotFound)
	require.Equal(t, idemkv.Acquired, v.claim(id("k"), fpB, idemkv.ModeLocal).Outcome)
}

func TestConcurrentClaimsOneWinner(t *testing.T) {
	v := newEnv(t)
	for round := range 20 {
		key := idemkv.ID{Tenant: "t", Endpoint: "e", Key: strings.Repeat("x", round+1)}
		const n = 16
		var wg sync.WaitGroup
		outcomes := make([]idemkv.Outcome, n)
		for i := range n {
			wg.Go(func() {
				mode := idemkv.Mode(i % 2)
				c, err := v.e.Claim(ctx, idemkv.ClaimRequest{ID: key, Fingerprint: fpA, Mode: mode})
				if err != nil {
					t.Error(err)
					return
				}
				outcomes[i] = c.Outcome
			})
		}
		wg.Wait()
		won := 0
		for _, o := range outcomes {
			if o == idemkv.Acquired {
				won++
			} else {
				require.Equal(t, idemkv.InProgress, o)
			}
		}
		require.Equal(t, 1, won)
	}
}

func TestBadInput(t *testing.T) {
	v := newEnv(t)
	good := v.claim(id("good"), fpA, idemkv.ModeLocal)
	require.NoError(t, v.e.Complete(ctx, good.Lease, idemkv.Result{Status: 200, Body: []byte("kept")}, nil))
	held := v.claim(id("held"), fpA, idemkv.ModeRemote)

	claimErr := func(i idemkv.ID, fp []byte) error {
		_, err := v.e.Claim(ctx, idemkv.ClaimRequest{ID: i, Fingerprint: fp})
		return err
	}
	require.ErrorIs(t, claimErr(id(""), fpA), idemkv.ErrInvalidKey)
	require.ErrorIs(t, claimErr(id(strings.Repeat("k", 256)), fpA), idemkv.ErrInvalidKey)
	require.NoError(t, claimErr(id(strings.Repeat("k", 255)), fpA))
	require.ErrorIs(t, claimErr(id("café"), fpA), idemkv.ErrInvalidKey)
	require.ErrorIs(t, claimErr(id("tab\there"), fpA), idemkv.ErrInvalidKey)
	require.ErrorIs(t, claimErr(idemkv.ID{Endpoint: "e", Key: "k"}, fpA), idemkv.ErrInvalidScope)
	require.ErrorIs(t, claimErr(idemkv.ID{Tenant: "t", Key: "k"}, fpA), idemkv.ErrInvalidScope)
	require.ErrorIs(t, claimErr(idemkv.ID{Tenant: "\xff", Endpoint: "e", Key: "k"}, fpA), idemkv.ErrInvalidScope)
	require.ErrorIs(t, claimErr(id("k"), nil), idemkv.ErrInvalidFingerprint)
	require.ErrorIs(t, claimErr(id("k"), make([]byte, 65)), idemkv.ErrInvalidFingerprint)
	_, err := v.e.Claim(ctx, idemkv.ClaimRequest{ID: id("k"), Fingerprint: fpA, Mode: 7})
	require.ErrorIs(t, err, idemkv.ErrInvalidArgument)
	_, err = v.e.Claim(ctx, idemkv.ClaimRequest{ID: id("k"), Fingerprint: fpA, Lease: -time.Second})
	require.ErrorIs(t, err, idemkv.ErrInvalidArgument)

	// Completing with a stale, forged or zero token.
	stale := held.Lease
	stale.Token++
	require.ErrorIs(t, v.e.Complete(ctx, stale, idemkv.Result{Status: 200}, nil), idemkv.ErrFenced)
	require.ErrorIs(t, v.e.Complete(ctx, idemkv.Lease{ID: id("held")}, idemkv.Result{}, nil), idemkv.ErrInvalidArgument)
	require.ErrorIs(t, v.e.Complete(ctx, held.Lease, idemkv.Result{Status: 70000}, nil), idemkv.ErrInvalidResult)
	require.ErrorIs(t, v.e.Complete(ctx, held.Lease, idemkv.Result{Body: make([]byte, 64<<10+1)}, nil), idemkv.ErrInvalidResult)
	// An effect with an empty key fails the whole completion.
	err = v.e.Complete(ctx, held.Lease, idemkv.Result{Status: 200}, func(w idemkv.Effects) error {
		require.NoError(t, w.Set([]byte("ok"), []byte("1")))
		return w.Set(nil, []byte("x"))
	})
	require.ErrorIs(t, err, idemkv.ErrInvalidArgument)
	_, err = v.e.GetData(ctx, []byte("ok"))
	require.ErrorIs(t, err, idemkv.ErrNotFound)
	// A caller's own error from apply aborts the completion and keeps the lease.
	boom := errors.New("boom")
	require.ErrorIs(t, v.e.Complete(ctx, held.Lease, idemkv.Result{Status: 200}, func(idemkv.Effects) error { return boom }), boom)

	// The store is unchanged by all of the above.
	r := v.claim(id("good"), fpA, idemkv.ModeLocal)
	require.Equal(t, idemkv.Replay, r.Outcome)
	require.Equal(t, "kept", string(r.Record.Result.Body))
	require.Equal(t, idemkv.InProgress, v.claim(id("held"), fpA, idemkv.ModeRemote).Outcome)
	require.NoError(t, v.e.Complete(ctx, held.Lease, idemkv.Result{Status: 200}, nil))

	// A closed engine refuses everything, clearly.
	require.NoError(t, v.e.Close())
	require.ErrorIs(t, claimErr(id("k2"), fpA), idemkv.ErrClosed)
	require.ErrorIs(t, v.e.Complete(ctx, held.Lease, idemkv.Result{}, nil), idemkv.ErrClosed)
	_, err = v.e.Get(ctx, id("good"))
	require.ErrorIs(t, err, idemkv.ErrClosed)
	_, err = v.e.Stats()
	require.ErrorIs(t, err, idemkv.ErrClosed)
	require.ErrorIs(t, v.e.Close(), idemkv.ErrClosed)
	v.open()
	r = v.claim(id("good"), fpA, idemkv.ModeLocal)
	require.Equal(t, "kept", string(r.Record.Result.Body))
}

func TestOptionsValidate(t *testing.T) {
	_, err := Open(t.TempDir(), &Options{Lease: -1})
	require.ErrorContains(t, err, "Lease")
	_, err = Open(t.TempDir(), &Options{Lease: time.Hour, Retention: time.Minute})
	require.ErrorContains(t, err, "exceeds Retention")
	_, err = Open(t.TempDir(), &Options{Shards: -1})
	require.ErrorContains(t, err, "Shards")
}

// The engine's L0 thresholds reach Pebble: by default L0 compacts at 8
// sublevels (Pebble starts at half the threshold) and stops writes at 48,
// and a caller's threshold replaces both.
func TestL0CompactionThreshold(t *testing.T) {
	po := (&Options{}).EnsureDefaults().PebbleOptions()
	require.Equal(t, 16, po.L0CompactionThreshold)
	require.Equal(t, 48, po.L0StopWritesThreshold)
	po = (&Options{L0CompactionThreshold: 4}).EnsureDefaults().PebbleOptions()
	require.Equal(t, 4, po.L0CompactionThreshold)
	require.Equal(t, 12, po.L0StopWritesThreshold)
	require.NoError(t, po.Validate())
	_, err := Open(t.TempDir(), &Options{L0CompactionThreshold: -1})
	require.ErrorContains(t, err, "L0CompactionThreshold")
}

// ConfigurePebble sees the options the engine set and its changes reach
// the store: here a flush listener, called when the engine flushes.
func TestConfigurePebble(t *testing.T) {
	var calls, flushes atomic.Int64
	var sawMemTable uint64
	o := &Options{MemTableSize: 1 << 20, ConfigurePebble: func(po *pebble.Options) {
		calls.Add(1)
		sawMemTable = po.MemTableSize
		po.EventListener = &pebble.EventListener{FlushEnd: func(pebble.FlushInfo) { flushes.Add(1) }}
	}}
	e, err := Open(t.TempDir(), o)
	require.NoError(t, err)
	defer e.Close()
	require.EqualValues(t, 1, calls.Load())
	require.EqualValues(t, 1<<20, sawMemTable)
	c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id("k"), Fingerprint: fpA})
	require.NoError(t, err)
	require.NoError(t, e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, nil))
	require.NoError(t, e.Flush())
	require.Positive(t, flushes.Load())
}

func TestTokensGrowAcrossRestarts(t *testing.T) {
	fs := vfs.NewMem()
	clock := fakeclock.New(t0)
	var last uint64
	for range 3 {
		e, err := Open("db", &Options{FS: fs, Clock: clock})
		require.NoError(t, err)
		c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id("k"), Fingerprint: fpA})
		require.NoError(t, err)
		require.Greater(t, c.Lease.Token, last)
		last = c.Lease.Token
		require.NoError(t, e.Close())
	}
}

func TestStatsAndCensus(t *testing.T) {
	v := newEnv(t)
	a := v.claim(id("a"), fpA, idemkv.ModeLocal)
	v.claim(id("b"), fpA, idemkv.ModeRemote)
	c := v.claim(id("c"), fpA, idemkv.ModeRemote)
	require.NoError(t, v.e.MarkUncertain(ctx, c.Lease, ""))
	require.NoError(t, v.e.Complete(ctx, a.Lease, idemkv.Result{Status: 200}, nil))
	v.claim(id("a"), fpA, idemkv.ModeLocal)
	v.claim(id("d"), fpA, idemkv.ModeLocal)

	st, err := v.e.Stats()
	require.NoError(t, err)
	require.Equal(t, 1, st.HeldLocal)
	require.Equal(t, 1, st.HeldRemote)
	require.EqualValues(t, 4, st.Acquired)
	require.EqualValues(t, 1, st.Replays)
	require.Positive(t, st.DiskBytes)

	cen, err := v.e.Census(ctx)
	require.NoError(t, err)
	require.Equal(t, Census{InProgress: 2, Uncertain: 1, Completed: 1}, cen)
	v.clock.Advance(25 * time.Hour)
	cen, err = v.e.Census(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, cen.Expired)
}

func TestResolveWithEffects(t *testing.T) {
	v := newEnv(t)
	c := v.claim(id("r"), fpA, idemkv.ModeRemote)
	require.NoError(t, v.e.MarkUncertain(ctx, c.Lease, "timeout"))
	boom := errors.New("boom")
	req := idemkv.ResolveRequest{ID: id("r"), Token: c.Lease.Token, Result: idemkv.Result{Status: 201},
		Apply: func(w idemkv.Effects) error {
			require.NoError(t, w.Set([]byte("ledger/r"), []byte("charged")))
			return boom
		}}
	require.ErrorIs(t, v.e.Resolve(ctx, req), boom)
	_, err := v.e.GetData(ctx, []byte("ledger/r"))
	require.ErrorIs(t, err, idemkv.ErrNotFound)
	require.Equal(t, idemkv.Reconciling, v.claim(id("r"), fpA, idemkv.ModeRemote).Outcome)

	req.Apply = func(w idemkv.Effects) error { return w.Set([]byte("ledger/r"), []byte("charged")) }
	require.NoError(t, v.e.Resolve(ctx, req))
	v.reopen()
	got, err := v.e.GetData(ctx, []byte("ledger/r"))
	require.NoError(t, err)
	require.Equal(t, "charged", string(got))
	require.Equal(t, idemkv.Replay, v.claim(id("r"), fpA, idemkv.ModeRemote).Outcome)
}

// TestReapBoundsMemory: holders that vanish without finishing do not grow
// the lease table forever. Once a stripe holds minReapAt slots, expired
// ones are dropped; a reaped local holder is fenced, a reaped remote
// holder still finishes through its durable record.
func TestReapBoundsMemory(t *testing.T) {
	v := newEnv(t)
	require.NoError(t, v.e.Close())
	v.opts.Shards = 1
	v.open()
	first := v.claim(id("first-local"), fpA, idemkv.ModeLocal)
	remote := v.claim(id("first-remote"), fpA, idemkv.ModeRemote)
	for i := range minReapAt - 3 {
		v.claim(id(fmt.Sprintf("abandoned-%d", i)), fpA, idemkv.ModeLocal)
	}
	st, err := v.e.Stats()
	require.NoError(t, err)
	require.Equal(t, minReapAt-2, st.HeldLocal)

	v.clock.Advance(31 * time.Second)
	live := v.claim(id("live"), fpA, idemkv.ModeLocal) // the 1024th slot triggers a reap
	st, err = v.e.Stats()
	require.NoError(t, err)
	require.Equal(t, 1, st.HeldLocal, "expired slots must be reaped")
	require.Zero(t, st.HeldRemote)

	require.ErrorIs(t, v.e.Complete(ctx, first.Lease, idemkv.Result{Status: 200}, nil), idemkv.ErrFenced)
	require.NoError(t, v.e.Complete(ctx, remote.Lease, idemkv.Result{Status: 200}, nil))
	require.NoError(t, v.e.Complete(ctx, live.Lease, idemkv.Result{Status: 200}, nil))
	require.Equal(t, idemkv.Acquired, v.claim(id("abandoned-7"), fpA, idemkv.ModeLocal).Outcome)
}

func TestFlushCompactAndTableStats(t *testing.T) {
	v := newEnv(t)
	for i := range 100 {
		c := v.claim(id(fmt.Sprintf("k%03d", i)), fpA, idemkv.ModeLocal)
		require.NoError(t, v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, nil))
	}
	require.NoError(t, v.e.Flush())
	st, err := v.e.Stats()
	require.NoError(t, err)
	require.Positive(t, st.TableBytes)
	require.Positive(t, st.TableBytesFlush)
	require.NoError(t, v.e.Compact(ctx))
	st2, err := v.e.Stats()
	require.NoError(t, err)
	require.GreaterOrEqual(t, st2.TableBytesWritten, st.TableBytesWritten)
	require.GreaterOrEqual(t, st2.WriteAmp, 1.0)
	require.Equal(t, idemkv.Replay, v.claim(id("k042"), fpA, idemkv.ModeLocal).Outcome)
}

// Defaults applied twice (a caller's EnsureDefaults, then Open's) change
// nothing: a feature turned off with a negative value stays off.
func TestEnsureDefaultsIsIdempotent(t *testing.T) {
	o := (&Options{ReplayCacheSize: -1, ClaimFilterBitsPerKey: -1, MinFreeDisk: -1}).EnsureDefaults()
	require.Equal(t, o, o.EnsureDefaults())

	e, err := Open(t.TempDir(), o)
	require.NoError(t, err)
	defer e.Close()
	<-e.ClaimFilterBuilt()
	c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id("k"), Fingerprint: fpA})
	require.NoError(t, err)
	require.NoError(t, e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, nil))
	_, err = e.Claim(ctx, idemkv.ClaimRequest{ID: id("k"), Fingerprint: fpA})
	require.NoError(t, err)
	st, err := e.Stats()
	require.NoError(t, err)
	require.Zero(t, st.ClaimFilterBuilds)
	require.Zero(t, st.ReplayCacheHits)
	require.Zero(t, st.ReplayCached)
}

// The default compression (zstd, Pebble's Balanced profile) stores
// completed records in clearly less space than Snappy, the previous
// default: 60 against 94 bytes a record in the full benchmark.
func TestDefaultCompressionShrinksRecords(t *testing.T) {
	tableBytes := func(o *Options) uint64 {
		e, err := Open(t.TempDir(), o)
		require.NoError(t, err)
		defer e.Close()
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Go(func() {
				for i := range 500 {
					k := id(fmt.Sprintf("%08x-4e2a-4b1c-9d3e-%012x", w, i*7919))
					c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: k, Fingerprint: []byte{1, byte(i), byte(w), 9, 8, 7, 6, 5, 4}})
					if err == nil {
						err = e.Complete(ctx, c.Lease, idemkv.Result{Status: 201, Pointer: fmt.Sprintf("/v1/payments/pay_%08x%016x", w, i)}, nil)
					}
					if err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		require.NoError(t, e.Flush())
		require.NoError(t, e.Compact(ctx))
		st, err := e.Stats()
		require.NoError(t, err)
		return st.TableBytes
	}
	def := tableBytes(&Options{})
	snappy := tableBytes(&Options{Compression: sstable.SnappyCompression})
	t.Logf("8,000 records: %d table bytes with the default, %d with Snappy", def, snappy)
	require.Less(t, float64(def), 0.85*float64(snappy))
}
