package engine

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
)

// TestAbortedResolveLeavesTheHolderFenced: a resolution whose checked
// read changed (another writer moved the balance it read) writes nothing
// and is rerun; when its Apply then gives up, the record stays uncertain,
// and the attempt that a retry fenced off stays fenced: it can neither
// renew its lease nor complete. The slot made for the resolution's write
// must not outlive it as if it were a holder's.
func TestAbortedResolveLeavesTheHolderFenced(t *testing.T) {
	v := newEnv(t)
	i := id("pay")
	stale := v.claim(i, fpA, idemkv.ModeRemote).Lease
	v.clock.Advance(31 * time.Second)
	retry := v.claim(i, fpA, idemkv.ModeRemote)
	require.Equal(t, idemkv.Reconciling, retry.Outcome, "the abandoned attempt's record turns uncertain")

	runs := 0
	err := v.e.Resolve(ctx, idemkv.ResolveRequest{ID: i, Token: retry.Record.Token, Result: idemkv.Result{Status: 201},
		Apply: func(fx idemkv.Effects) error {
			if runs++; runs > 1 {
				return errors.New("the ledger refuses")
			}
			if _, err := fx.Get([]byte("balance")); !errors.Is(err, idemkv.ErrNotFound) {
				return err
			}
			// Another writer moves the balance this run read.
			require.NoError(t, v.e.Update(ctx, func(w idemkv.Effects) error { return w.Set([]byte("balance"), []byte("1")) }))
			return fx.Set([]byte("balance"), []byte("2"))
		}})
	require.EqualError(t, err, "the ledger refuses")
	require.Equal(t, 2, runs)

	_, err = v.e.Renew(ctx, stale, time.Minute)
	require.ErrorIs(t, err, idemkv.ErrFenced)
	require.ErrorIs(t, v.e.Complete(ctx, stale, idemkv.Result{Status: 201}, nil), idemkv.ErrFenced)
	require.ErrorIs(t, v.e.MarkUncertain(ctx, stale, "timeout"), idemkv.ErrFenced)
	rec, err := v.e.Get(ctx, i)
	require.NoError(t, err)
	require.Equal(t, idemkv.StateUncertain, rec.State)
	require.NoError(t, v.e.Resolve(ctx, idemkv.ResolveRequest{ID: i, Token: rec.Token, NoEffect: true}), "still settleable")
}
