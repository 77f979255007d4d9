package engine

import (
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/stretchr/testify/require"
)

// TestEvictKeepsEffectsPaired: evicting a completed record leaves its
// effects, and Check pairs them with the mark of the evicted outcome, so
// the store stays clean; the key then runs anew, and its new effects
// supersede the old ones.
func TestEvictKeepsEffectsPaired(t *testing.T) {
	v := newSweepEnv(t, nil)
	c, err := v.e.Claim(ctx, idemkv.ClaimRequest{ID: id("pay"), Fingerprint: []byte{1}})
	require.NoError(t, err)
	require.NoError(t, v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, func(fx idemkv.Effects) error {
		return fx.Set([]byte("ledger/pay"), []byte("1"))
	}))

	got, err := v.e.Evict(ctx, idemkv.EvictRequest{ID: id("pay"), Token: c.Lease.Token})
	require.NoError(t, err)
	require.Equal(t, 1, got.Effects)
	_, err = v.e.Get(ctx, id("pay"))
	require.ErrorIs(t, err, idemkv.ErrNotFound)
	val, err := v.e.GetData(ctx, []byte("ledger/pay"))
	require.NoError(t, err)
	require.Equal(t, "1", string(val), "the effect stays")
	rep, err := v.e.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%+v", rep.Problems)
	require.Equal(t, 1, rep.EvictedOutcomes)
	require.Equal(t, 1, rep.EffectsPaired)

	c, err = v.e.Claim(ctx, idemkv.ClaimRequest{ID: id("pay"), Fingerprint: []byte{2}})
	require.NoError(t, err)
	require.Equal(t, idemkv.Acquired, c.Outcome, "the key runs anew")
	require.NoError(t, v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, func(fx idemkv.Effects) error {
		return fx.Set([]byte("ledger/pay"), []byte("2"))
	}))
	v.reopen()
	rep, err = v.e.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%+v", rep.Problems)
	require.Equal(t, 1, rep.Superseded, "the evicted outcome's effect was overwritten")
}

// TestSweepDropsExpiredEvictedMarks: once an evicted outcome would have
// expired, the sweeper deletes its mark, and its effects count as
// expired.
func TestSweepDropsExpiredEvictedMarks(t *testing.T) {
	v := newSweepEnv(t, nil)
	c, err := v.e.Claim(ctx, idemkv.ClaimRequest{ID: id("pay"), Fingerprint: []byte{1}, Retention: "short"})
	require.NoError(t, err)
	require.NoError(t, v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, func(fx idemkv.Effects) error {
		return fx.Set([]byte("ledger/pay"), []byte("1"))
	}))
	_, err = v.e.Evict(ctx, idemkv.EvictRequest{ID: id("pay")})
	require.NoError(t, err)
	_, err = v.e.Sweep(ctx)
	require.NoError(t, err)
	rep, err := v.e.Check(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, rep.EvictedOutcomes, "kept while the outcome would have been retained")

	v.clock.Advance(2 * time.Hour) // past the "short" class's hour
	_, err = v.e.Sweep(ctx)
	require.NoError(t, err)
	rep, err = v.e.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%+v", rep.Problems)
	require.Zero(t, rep.EvictedOutcomes)
	require.Equal(t, 1, rep.EffectsExpired)
}
