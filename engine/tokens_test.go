package engine

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
)

// Once an Open has issued the last token of its epoch, the next
// acquisition fails the engine instead of issuing a token that spills
// into the epoch's bits; reopening advances the epoch and tokens keep
// growing.
func TestTokensNeverRepeat(t *testing.T) {
	v := newEnv(t)
	first := v.claim(id("first"), fpA, idemkv.ModeLocal)
	v.e.seq.Store(maxSeq - 1)
	last := v.claim(id("last"), fpA, idemkv.ModeLocal)
	require.Equal(t, first.Lease.Token>>tokenSeqBits, last.Lease.Token>>tokenSeqBits, "the same epoch")
	require.EqualValues(t, maxSeq, last.Lease.Token&maxSeq)

	_, err := v.e.Claim(ctx, idemkv.ClaimRequest{ID: id("one-too-many"), Fingerprint: fpA})
	require.ErrorIs(t, err, idemkv.ErrFailed)
	require.ErrorContains(t, err, "reopen")
	_, err = v.e.Get(ctx, id("one-too-many"))
	require.ErrorIs(t, err, idemkv.ErrFailed, "the engine says it has failed")

	require.ErrorIs(t, v.e.Close(), idemkv.ErrFailed)
	v.open()
	next := v.claim(id("one-too-many"), fpA, idemkv.ModeLocal)
	require.Equal(t, idemkv.Acquired, next.Outcome)
	require.Greater(t, next.Lease.Token, last.Lease.Token)
	require.Greater(t, next.Lease.Token>>tokenSeqBits, last.Lease.Token>>tokenSeqBits, "a new epoch")
}

// A read-only engine refuses every state-changing call with ErrReadOnly,
// and still reads.
func TestReadOnlyRefusesChanges(t *testing.T) {
	v := newEnv(t)
	c := v.claim(id("done"), fpA, idemkv.ModeLocal)
	require.NoError(t, v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, nil))
	u := v.claim(id("u"), fpA, idemkv.ModeRemote)
	require.NoError(t, v.e.MarkUncertain(ctx, u.Lease, "timeout"))
	require.NoError(t, v.e.Close())
	v.opts.ReadOnly = true
	v.open()

	_, err := v.e.Claim(ctx, idemkv.ClaimRequest{ID: id("new"), Fingerprint: fpA})
	require.ErrorIs(t, err, ErrReadOnly)
	require.ErrorIs(t, err, idemkv.ErrInvalidArgument)
	_, err = v.e.Claim(ctx, idemkv.ClaimRequest{ID: id("done"), Fingerprint: fpA})
	require.ErrorIs(t, err, ErrReadOnly, "a claim is a change even when it would replay")
	require.ErrorIs(t, v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, nil), ErrReadOnly)
	require.ErrorIs(t, v.e.Release(ctx, c.Lease, nil), ErrReadOnly)
	require.ErrorIs(t, v.e.MarkUncertain(ctx, c.Lease, "x"), ErrReadOnly)
	_, err = v.e.Renew(ctx, c.Lease, 0)
	require.ErrorIs(t, err, ErrReadOnly)
	rec, err := v.e.Get(ctx, id("u"))
	require.NoError(t, err, "reads work")
	require.ErrorIs(t, v.e.Resolve(ctx, idemkv.ResolveRequest{ID: id("u"), Token: rec.Token, NoEffect: true}), ErrReadOnly)
	_, err = v.e.Sweep(ctx)
	require.ErrorIs(t, err, ErrReadOnly)

	rec, err = v.e.Get(ctx, id("done"))
	require.NoError(t, err)
	require.Equal(t, idemkv.StateCompleted, rec.State, "nothing poisoned the reads")
}
