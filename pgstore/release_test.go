package pgstore_test

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/pgstore"
	"github.com/stretchr/testify/require"
)

// Release with compensations (releaseWith), beyond the conformance
// suite: its events, its reads, and what it refuses.

// TestReleaseCompensationEvents: the events a compensation emits are
// stored with the release, and only if it commits: not for a holder
// whose lease was taken over, nor when the compensation fails.
func TestReleaseCompensationEvents(t *testing.T) {
	clock := fakeclock.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	s, _ := reviewStore(t, func(o *pgstore.Options) { o.Clock = clock; o.NoListen = true })
	emit := func(payload string, fail bool) func(idemkv.Effects) error {
		return func(fx idemkv.Effects) error {
			if err := fx.Emit(idemkv.Event{Topic: "holds.released", Key: "acct-1", Payload: []byte(payload)}); err != nil {
				return err
			}
			if fail {
				return errBoom
			}
			return nil
		}
	}
	req := idemkv.ClaimRequest{ID: reviewID("pay"), Fingerprint: []byte{1}, Mode: idemkv.ModeRemote, Resumable: true,
		Lease: 5 * time.Second}
	stale, err := s.Claim(ctx, req)
	require.NoError(t, err)
	clock.Advance(5 * time.Second)
	live, err := s.Claim(ctx, req)
	require.NoError(t, err)
	require.True(t, live.Lease.Takeover())

	require.ErrorIs(t, s.Release(ctx, stale.Lease, emit("stale", false)), idemkv.ErrFenced)
	require.ErrorIs(t, s.Release(ctx, live.Lease, emit("failed", true)), errBoom)
	require.NoError(t, s.Release(ctx, live.Lease, emit("released", false)))
	evs, err := s.ReadOutbox(ctx, 0, 10)
	require.NoError(t, err)
	require.Len(t, evs, 1)
	require.Equal(t, "released", string(evs[0].Payload))
	require.EqualValues(t, 1, evs[0].EntitySeq)
	rep, err := s.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%v", rep.Problems)
}

var errBoom = errors.New("boom")

// TestReleaseCompensationReads: a compensation that reads runs in a
// serializable transaction, as Complete's apply function does: when what
// it read is changed by another commit before its own, it runs again on
// the new value; when that keeps happening it ends in ErrConflict having
// written nothing, and the lease is still held.
func TestReleaseCompensationReads(t *testing.T) {
	s, _ := reviewStore(t, nil)
	require.NoError(t, s.Update(ctx, func(fx idemkv.Effects) error { return fx.Set([]byte("held"), []byte("100")) }))
	// giveBack reads the hold, lets another process add to it in the
	// first interfere runs, and takes 40 off what it read.
	giveBack := func(runs *int, interfere int) func(idemkv.Effects) error {
		return func(fx idemkv.Effects) error {
			*runs++
			v, err := fx.Get([]byte("held"))
			if err != nil {
				return err
			}
			held, err := strconv.Atoi(string(v))
			if err != nil {
				return err
			}
			if *runs <= interfere {
				if err := s.Update(ctx, func(fx idemkv.Effects) error {
					return fx.Set([]byte("held"), strconv.AppendInt(nil, int64(held+1), 10))
				}); err != nil {
					return err
				}
			}
			return fx.Set([]byte("held"), strconv.AppendInt(nil, int64(held-40), 10))
		}
	}
	held := func() string {
		v, err := s.GetData(ctx, []byte("held"))
		require.NoError(t, err)
		return string(v)
	}

	l := reviewClaim(t, s, reviewID("retried"), idemkv.ModeRemote)
	conflicts := s.Counts().Conflicts
	runs := 0
	require.NoError(t, s.Release(ctx, l, giveBack(&runs, 1)))
	require.Equal(t, 2, runs, "the run whose read went stale ran again")
	require.Equal(t, conflicts+1, s.Counts().Conflicts)
	require.Equal(t, "61", held(), "100, +1 by the other commit, -40 by the second run")
	_, err := s.Get(ctx, l.ID)
	require.ErrorIs(t, err, idemkv.ErrNotFound)

	l = reviewClaim(t, s, reviewID("conflicted"), idemkv.ModeRemote)
	runs = 0
	err = s.Release(ctx, l, giveBack(&runs, 1000))
	require.ErrorIs(t, err, idemkv.ErrConflict)
	require.Equal(t, 16, runs)
	require.Equal(t, "77", held(), "only the other commits' writes, 16 of them")
	rec, err := s.Get(ctx, l.ID)
	require.NoError(t, err)
	require.Equal(t, idemkv.StateInProgress, rec.State)
	require.Equal(t, l.Token, rec.Token)
	require.NoError(t, s.Complete(ctx, l, idemkv.Result{Status: 201}, nil), "the lease is still held")
}

// TestReleaseRefusesResult: a release stores no result; a compensation
// that sets one is refused, as the engine refuses it, and the lease is
// still held.
func TestReleaseRefusesResult(t *testing.T) {
	s, _ := reviewStore(t, nil)
	l := reviewClaim(t, s, reviewID("k"), idemkv.ModeLocal)
	err := s.Release(ctx, l, func(fx idemkv.Effects) error {
		if err := fx.Set([]byte("comp"), []byte("x")); err != nil {
			return err
		}
		_ = fx.(idemkv.ResultSetter).SetResult(idemkv.Result{Status: 200})
		return nil
	})
	require.ErrorIs(t, err, idemkv.ErrInvalidArgument)
	_, err = s.GetData(ctx, []byte("comp"))
	require.ErrorIs(t, err, idemkv.ErrNotFound)
	require.NoError(t, s.Complete(ctx, l, idemkv.Result{Status: 201}, nil))
}
