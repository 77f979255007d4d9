package engine

import (
	"errors"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine/internal/record"
	"github.com/idemkv/idemkv/internal/fakeclock"
)

// failingRand is a Rand that must not be read.
type failingRand struct{}

func (failingRand) Read([]byte) (int, error) { return 0, errors.New("the secret was drawn again") }

// seeded is a Rand that gives the same bytes for the same seed.
func seeded(seed uint64) *rand.ChaCha8 {
	var s [32]byte
	s[0] = byte(seed)
	return rand.NewChaCha8(s)
}

// TestStoreSecret: a new store draws its secret from Options.Rand, so a
// seeded Rand gives a deterministic store and two seeds two secrets; it
// is drawn once, kept across reopens, and carried by a backup. A store
// in the current layout whose secret is gone is refused read-write (a
// new one would change every derived id) and reported by Check.
func TestStoreSecret(t *testing.T) {
	open := func(dir string, opts Options) *Engine {
		t.Helper()
		e, err := Open(dir, &opts)
		require.NoError(t, err)
		return e
	}
	v := &env{t: t, dir: t.TempDir(), clock: fakeclock.New(t0)}
	v.opts = Options{Clock: v.clock, Rand: seeded(1), NoBackgroundSweep: true}
	v.open()
	t.Cleanup(func() { _ = v.e.Close() })
	s1 := v.e.secret
	require.Len(t, s1, record.SecretLen)
	same := open(t.TempDir(), Options{Rand: seeded(1), NoBackgroundSweep: true})
	require.Equal(t, s1, same.secret, "a seeded Rand gives a deterministic store")
	require.NoError(t, same.Close())
	other := open(t.TempDir(), Options{Rand: seeded(2), NoBackgroundSweep: true})
	require.NotEqual(t, s1, other.secret)
	require.NoError(t, other.Close())
	_, err := Open(t.TempDir(), &Options{Rand: failingRand{}, NoBackgroundSweep: true})
	require.ErrorContains(t, err, "drawn again", "a new store needs its secret")

	v.opts.Rand = failingRand{}
	v.reopen()
	require.Equal(t, s1, v.e.secret, "kept, not drawn again")
	backup := filepath.Join(t.TempDir(), "backup")
	require.NoError(t, v.e.Backup(ctx, backup))
	b := open(backup, v.opts)
	require.Equal(t, s1, b.secret, "a backup carries the secret")
	require.NoError(t, b.Close())
	v.requireSound()

	for name, secret := range map[string][]byte{"no secret": nil, "a short secret": make([]byte, 16)} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "copy")
			require.NoError(t, v.e.Backup(ctx, dir))
			db, err := pebble.Open(dir, v.opts.EnsureDefaults().PebbleOptions())
			require.NoError(t, err)
			if secret == nil {
				require.NoError(t, db.Delete(secretKey, pebble.Sync))
			} else {
				require.NoError(t, db.Set(secretKey, secret, pebble.Sync))
			}
			require.NoError(t, db.Close())
			_, err = Open(dir, &v.opts)
			require.ErrorIs(t, err, record.ErrCorrupt)
			ro := v.opts
			ro.ReadOnly = true
			e, err := Open(dir, &ro)
			if secret != nil {
				require.ErrorIs(t, err, record.ErrCorrupt)
				return
			}
			require.NoError(t, err)
			defer e.Close()
			rep, err := e.Check(ctx)
			require.NoError(t, err)
			require.Equal(t, 1, rep.ProblemCount, "%v", rep.Problems)
			require.Contains(t, rep.Problems[0].What, "no secret")
		})
	}
}

// claimRemote claims i for fp remotely in generation gen, and requires it
// acquired.
func (v *env) claimRemote(i idemkv.ID, fp []byte, gen uint32) idemkv.Lease {
	v.t.Helper()
	c, err := v.e.Claim(ctx, idemkv.ClaimRequest{ID: i, Fingerprint: fp, Mode: idemkv.ModeRemote, Generation: gen})
	require.NoError(v.t, err)
	require.Equal(v.t, idemkv.Acquired, c.Outcome)
	return c.Lease
}

// TestOperationIDOfTheRequest: a new remote record's operation id is the
// one DeriveOperationID gives for its request under the store's secret,
// so the same request, claimed again after its record was released,
// resolved with no effect, evicted, expired or the store reopened, is
// sent downstream under the same identity.
func TestOperationIDOfTheRequest(t *testing.T) {
	v := newEnv(t)
	a := id("pay")
	want := idemkv.DeriveOperationID(v.e.secret, a, fpA, 0)
	l := v.claimRemote(a, fpA, 0)
	require.Equal(t, want, l.OperationID)
	rec, err := v.e.Get(ctx, a)
	require.NoError(t, err)
	require.Equal(t, want, rec.OperationID)

	settle := map[string]func(l idemkv.Lease){
		"release": func(l idemkv.Lease) { require.NoError(t, v.e.Release(ctx, l, nil)) },
		"resolve with no effect": func(l idemkv.Lease) {
			require.NoError(t, v.e.MarkUncertain(ctx, l, "timeout"))
			require.NoError(t, v.e.Resolve(ctx, idemkv.ResolveRequest{ID: a, Token: l.Token, NoEffect: true}))
		},
		"evict": func(l idemkv.Lease) {
			require.NoError(t, v.e.Complete(ctx, l, idemkv.Result{Status: 201}, nil))
			_, err := v.e.Evict(ctx, idemkv.EvictRequest{ID: a})
			require.NoError(t, err)
		},
		"expiry": func(l idemkv.Lease) {
			require.NoError(t, v.e.Complete(ctx, l, idemkv.Result{Status: 201}, nil))
			require.Equal(t, idemkv.Replay, v.claim(a, fpA, idemkv.ModeRemote).Outcome)
			v.clock.Advance(v.e.opts.Retention + time.Second)
		},
		"reopen": func(l idemkv.Lease) {
			require.NoError(t, v.e.Release(ctx, l, nil))
			v.reopen()
		},
	}
	for _, how := range []string{"release", "resolve with no effect", "evict", "expiry", "reopen"} {
		settle[how](l)
		l = v.claimRemote(a, fpA, 0)
		require.Equal(t, want, l.OperationID, "claimed again after %s", how)
		require.Equal(t, uint32(1), l.Attempt, "a new record after %s", how)
	}
	v.requireSound()
}

// TestOperationIDsDiffer: another tenant, endpoint, key, fingerprint or
// generation is another logical request, with an id of its own; the
// request claimed again in generation 0 has its first id again; a local
// claim has none.
func TestOperationIDsDiffer(t *testing.T) {
	v := newEnv(t)
	a := id("pay")
	seen := map[idemkv.OperationID]string{}
	add := func(what string, l idemkv.Lease) {
		t.Helper()
		require.False(t, l.OperationID.IsZero(), what)
		prev, dup := seen[l.OperationID]
		require.False(t, dup, "%s has the id of %s", what, prev)
		seen[l.OperationID] = what
	}
	first := v.claimRemote(a, fpA, 0)
	add("the request", first)
	add("another tenant", v.claimRemote(idemkv.ID{Tenant: "acct_2", Endpoint: a.Endpoint, Key: a.Key}, fpA, 0))
	add("another endpoint", v.claimRemote(idemkv.ID{Tenant: a.Tenant, Endpoint: "POST /v1/refunds", Key: a.Key}, fpA, 0))
	add("another key", v.claimRemote(id("pay2"), fpA, 0))

	// Under the same key, once the record is gone (another body is a
	// mismatch while it lives).
	require.Equal(t, idemkv.Mismatch, v.claim(a, fpB, idemkv.ModeRemote).Outcome)
	l := first
	for _, next := range []struct {
		what string
		fp   []byte
		gen  uint32
	}{{"generation 1", fpA, 1}, {"generation 2", fpA, 2}, {"another body", fpB, 0}} {
		require.NoError(t, v.e.Release(ctx, l, nil))
		l = v.claimRemote(a, next.fp, next.gen)
		add(next.what, l)
	}
	require.NoError(t, v.e.Release(ctx, l, nil))
	require.Equal(t, first.OperationID, v.claimRemote(a, fpA, 0).OperationID, "generation 0 again")

	require.True(t, v.claim(id("local"), fpA, idemkv.ModeLocal).Lease.OperationID.IsZero())
	v.requireSound()
}

// TestOperationIDPerStore: two stores (two secrets) give one request two
// ids; a store opened from a backup has its original's secret, and gives
// the ids the original gives.
func TestOperationIDPerStore(t *testing.T) {
	v, w := newEnv(t), newEnv(t)
	a := id("pay")
	la := v.claimRemote(a, fpA, 0)
	require.NotEqual(t, la.OperationID, w.claimRemote(a, fpA, 0).OperationID, "two secrets")

	backup := filepath.Join(t.TempDir(), "backup")
	require.NoError(t, v.e.Backup(ctx, backup))
	b := &env{t: t, dir: backup, clock: v.clock, opts: v.opts}
	b.open()
	defer b.e.Close()
	// The claim in flight at the backup, released in the copy and claimed
	// again, and a request new to both.
	require.NoError(t, b.e.Release(ctx, la, nil))
	require.Equal(t, la.OperationID, b.claimRemote(a, fpA, 0).OperationID)
	require.Equal(t, v.claimRemote(id("new"), fpA, 0).OperationID, b.claimRemote(id("new"), fpA, 0).OperationID)
	b.requireSound()
	v.requireSound()
	w.requireSound()
}

// TestTakeoverKeepsTheStoredID: a takeover resumes the id stored with the
// record, whatever the claim would derive: a random one, as stores gave
// before they derived (written here by Load, which keeps the id it is
// given), and one of another generation.
func TestTakeoverKeepsTheStoredID(t *testing.T) {
	clock := fakeclock.New(t0)
	dir := t.TempDir()
	random := idemkv.OperationID{0xde, 0xad, 0xbe, 0xef, 1, 2, 3}
	old := idemkv.Record{ID: id("old"), State: idemkv.StateInProgress, Mode: idemkv.ModeRemote, Fingerprint: fpA,
		OperationID: random, LeaseExpires: t0.Add(-time.Second)}
	derived := idemkv.Record{ID: id("derived"), State: idemkv.StateInProgress, Mode: idemkv.ModeRemote, Fingerprint: fpA,
		LeaseExpires: t0.Add(-time.Second)}
	_, err := Load(ctx, dir, loadOpts(clock), slices.Values([]idemkv.Record{old, derived}), nil)
	require.NoError(t, err)
	v := &env{t: t, dir: dir, clock: clock, opts: *loadOpts(clock)}
	v.open()
	defer v.e.Close()

	rec, err := v.e.Get(ctx, id("derived"))
	require.NoError(t, err)
	require.Equal(t, idemkv.DeriveOperationID(v.e.secret, id("derived"), fpA, 0), rec.OperationID, "Load derives as a claim does")
	rec, err = v.e.Get(ctx, id("old"))
	require.NoError(t, err)
	require.Equal(t, random, rec.OperationID)

	resume := func(i idemkv.ID, gen uint32) idemkv.Lease {
		c, err := v.e.Claim(ctx, idemkv.ClaimRequest{ID: i, Fingerprint: fpA, Mode: idemkv.ModeRemote, Resumable: true, Generation: gen})
		require.NoError(t, err)
		require.Equal(t, idemkv.Acquired, c.Outcome)
		require.True(t, c.Lease.Takeover())
		return c.Lease
	}
	require.Equal(t, random, resume(id("old"), 0).OperationID)
	v.reopen()
	v.clock.Advance(time.Minute)
	require.Equal(t, random, resume(id("old"), 0).OperationID, "after a reopen too")

	g1 := v.claimRemote(id("g"), fpA, 1)
	v.clock.Advance(time.Minute)
	require.Equal(t, g1.OperationID, resume(id("g"), 0).OperationID, "a takeover resumes, whatever generation it names")
	v.requireSound()
}
