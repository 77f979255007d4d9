package pgstore_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/pgstore"
	"github.com/stretchr/testify/require"
)

// runLocal runs RunLocal of key with fingerprint fp, writing key's value
// and emitting one event.
func runLocal(t *testing.T, s *pgstore.Store, key string, fp byte, value string) (idemkv.Claim, error) {
	t.Helper()
	return s.RunLocal(ctx, idemkv.ClaimRequest{ID: reviewID(key), Fingerprint: []byte{fp}},
		idemkv.Result{Status: 201, Pointer: "/things/" + key},
		func(fx idemkv.Effects) error {
			if err := fx.Set([]byte("v/"+key), []byte(value)); err != nil {
				return err
			}
			return fx.Emit(idemkv.Event{Topic: "things.created", Key: key, Payload: []byte(value)})
		})
}

func requireData(t *testing.T, s *pgstore.Store, key, want string) {
	t.Helper()
	v, err := s.GetData(ctx, []byte("v/"+key))
	if want == "" {
		require.ErrorIs(t, err, idemkv.ErrNotFound)
		return
	}
	require.NoError(t, err)
	require.Equal(t, want, string(v))
}

// TestRunLocal: one statement claims and completes; a duplicate replays
// and keeps nothing its apply wrote; a different payload is a mismatch.
func TestRunLocal(t *testing.T) {
	s, _ := reviewStore(t, nil)
	c, err := runLocal(t, s, "a", 1, "first")
	require.NoError(t, err)
	require.Equal(t, idemkv.Acquired, c.Outcome)
	require.Equal(t, idemkv.StateCompleted, c.Record.State)
	require.Equal(t, idemkv.Result{Status: 201, Pointer: "/things/a"}, c.Record.Result)
	require.Equal(t, 1, c.Record.Effects)
	require.Equal(t, c.Record.Token, c.Lease.Token)
	rec, err := s.Get(ctx, reviewID("a"))
	require.NoError(t, err)
	require.Equal(t, c.Record, rec)
	requireData(t, s, "a", "first")

	c, err = runLocal(t, s, "a", 1, "second")
	require.NoError(t, err)
	require.Equal(t, idemkv.Replay, c.Outcome)
	require.Equal(t, rec.Result, c.Record.Result)
	c, err = runLocal(t, s, "a", 2, "third")
	require.NoError(t, err)
	require.Equal(t, idemkv.Mismatch, c.Outcome)
	requireData(t, s, "a", "first")

	evs, err := s.ReadOutbox(ctx, 0, 10)
	require.NoError(t, err)
	require.Len(t, evs, 1, "only the committed run's event")
	require.Equal(t, "first", string(evs[0].Payload))
	rep, err := s.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%v", rep.Problems)
}

// TestRunLocalConcurrentDuplicates: of many concurrent runs of one key,
// one commits; the others replay its outcome.
func TestRunLocalConcurrentDuplicates(t *testing.T) {
	s, _ := reviewStore(t, nil)
	for k := range 5 {
		key := fmt.Sprint("k", k)
		var (
			wg       sync.WaitGroup
			mu       sync.Mutex
			outcomes = map[idemkv.Outcome]int{}
			winner   string
		)
		for w := range 12 {
			wg.Go(func() {
				c, err := runLocal(t, s, key, 1, fmt.Sprint("w", w))
				require.NoError(t, err)
				mu.Lock()
				defer mu.Unlock()
				outcomes[c.Outcome]++
				if c.Outcome == idemkv.Acquired {
					winner = fmt.Sprint("w", w)
				}
			})
		}
		wg.Wait()
		require.Equal(t, map[idemkv.Outcome]int{idemkv.Acquired: 1, idemkv.Replay: 11}, outcomes)
		requireData(t, s, key, winner)
	}
	evs, err := s.ReadOutbox(ctx, 0, 100)
	require.NoError(t, err)
	require.Len(t, evs, 5)
	rep, err := s.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%v", rep.Problems)
}

// TestRunLocalAgainstClaims: RunLocal meets the records Claim leaves as
// Claim would: a live lease is in progress, an expired local lease is
// taken over (its holder fenced), an expired outcome is replaced, and an
// abandoned remote claim becomes uncertain.
func TestRunLocalAgainstClaims(t *testing.T) {
	clock := fakeclock.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	s, _ := reviewStore(t, func(o *pgstore.Options) { o.Clock = clock; o.Lease = time.Minute; o.Retention = time.Hour })

	held := reviewClaim(t, s, reviewID("held"), idemkv.ModeLocal)
	c, err := runLocal(t, s, "held", 1, "x")
	require.NoError(t, err)
	require.Equal(t, idemkv.InProgress, c.Outcome)
	requireData(t, s, "held", "")

	remote := reviewClaim(t, s, reviewID("remote"), idemkv.ModeRemote)
	_, err = runLocal(t, s, "done", 1, "old")
	require.NoError(t, err)

	clock.Advance(2 * time.Minute)
	c, err = runLocal(t, s, "held", 1, "taken over")
	require.NoError(t, err)
	require.Equal(t, idemkv.Acquired, c.Outcome)
	require.EqualValues(t, 2, c.Record.Attempt)
	require.Greater(t, c.Lease.Token, held.Token)
	require.ErrorIs(t, s.Complete(ctx, held, idemkv.Result{Status: 200}, nil), idemkv.ErrFenced)
	requireData(t, s, "held", "taken over")

	c, err = runLocal(t, s, "remote", 1, "x")
	require.NoError(t, err)
	require.Equal(t, idemkv.Reconciling, c.Outcome)
	require.ErrorIs(t, s.Complete(ctx, remote, idemkv.Result{Status: 200}, nil), idemkv.ErrFenced)
	requireData(t, s, "remote", "")

	clock.Advance(2 * time.Hour)
	c, err = runLocal(t, s, "done", 1, "new")
	require.NoError(t, err)
	require.Equal(t, idemkv.Acquired, c.Outcome)
	require.EqualValues(t, 1, c.Record.Attempt)
	requireData(t, s, "done", "new")
	rep, err := s.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%v", rep.Problems)
}

// TestRunLocalApply: an apply error writes nothing; a result apply sets
// is stored; an apply function that reads runs as Claim and Complete,
// its read checked; a remote claim is refused.
func TestRunLocalApply(t *testing.T) {
	s, _ := reviewStore(t, nil)
	boom := errors.New("boom")
	_, err := s.RunLocal(ctx, idemkv.ClaimRequest{ID: reviewID("err"), Fingerprint: []byte{1}}, idemkv.Result{Status: 201},
		func(fx idemkv.Effects) error {
			require.NoError(t, fx.Set([]byte("v/err"), []byte("x")))
			return boom
		})
	require.ErrorIs(t, err, boom)
	_, err = s.Get(ctx, reviewID("err"))
	require.ErrorIs(t, err, idemkv.ErrNotFound)
	requireData(t, s, "err", "")

	c, err := s.RunLocal(ctx, idemkv.ClaimRequest{ID: reviewID("set"), Fingerprint: []byte{1}}, idemkv.Result{Status: 201},
		func(fx idemkv.Effects) error {
			return fx.(idemkv.ResultSetter).SetResult(idemkv.Result{Status: 409, Pointer: "/conflict"})
		})
	require.NoError(t, err)
	require.Equal(t, idemkv.Result{Status: 409, Pointer: "/conflict"}, c.Record.Result)

	require.NoError(t, s.Update(ctx, func(fx idemkv.Effects) error { return fx.Set([]byte("counter"), []byte("1")) }))
	runs := 0
	c, err = s.RunLocal(ctx, idemkv.ClaimRequest{ID: reviewID("reads"), Fingerprint: []byte{1}}, idemkv.Result{Status: 200},
		func(fx idemkv.Effects) error {
			runs++
			v, err := fx.Get([]byte("counter"))
			if err != nil {
				return err
			}
			return fx.Set([]byte("counter"), append(v, '1'))
		})
	require.NoError(t, err)
	require.Equal(t, idemkv.Acquired, c.Outcome)
	require.Equal(t, idemkv.StateCompleted, c.Record.State)
	require.Equal(t, 2, runs, "refused in the statement, then run in Complete")
	v, err := s.GetData(ctx, []byte("counter"))
	require.NoError(t, err)
	require.Equal(t, "11", string(v))

	_, err = s.RunLocal(ctx, idemkv.ClaimRequest{ID: reviewID("remote"), Fingerprint: []byte{1}, Mode: idemkv.ModeRemote},
		idemkv.Result{Status: 200}, nil)
	require.ErrorIs(t, err, idemkv.ErrInvalidArgument)
	_, err = s.RunLocal(ctx, idemkv.ClaimRequest{ID: reviewID("bad"), Fingerprint: []byte{1}}, idemkv.Result{Status: -1}, nil)
	require.ErrorIs(t, err, idemkv.ErrInvalidResult)
	rep, err := s.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%v", rep.Problems)
}

// TestDeletes: each statement variant that deletes data keys (Complete
// and RunLocal, with and without events) deletes them with the outcome,
// and a fenced Complete deletes nothing.
func TestDeletes(t *testing.T) {
	s, _ := reviewStore(t, nil)
	require.NoError(t, s.Update(ctx, func(fx idemkv.Effects) error {
		for _, k := range []string{"a", "b", "c", "d", "e"} {
			if err := fx.Set([]byte("v/"+k), []byte("x")); err != nil {
				return err
			}
		}
		return nil
	}))
	del := func(key string, event bool) func(idemkv.Effects) error {
		return func(fx idemkv.Effects) error {
			if err := fx.Delete([]byte("v/" + key)); err != nil {
				return err
			}
			if event {
				return fx.Emit(idemkv.Event{Topic: "things.deleted", Key: key})
			}
			return nil
		}
	}
	for i, event := range []bool{false, true} {
		l := reviewClaim(t, s, reviewID(fmt.Sprint("complete", i)), idemkv.ModeLocal)
		require.NoError(t, s.Complete(ctx, l, idemkv.Result{Status: 200}, del([]string{"a", "b"}[i], event)))
		c, err := s.RunLocal(ctx, idemkv.ClaimRequest{ID: reviewID(fmt.Sprint("local", i)), Fingerprint: []byte{1}},
			idemkv.Result{Status: 200}, del([]string{"c", "d"}[i], event))
		require.NoError(t, err)
		require.Equal(t, idemkv.Acquired, c.Outcome)
	}
	fenced := reviewClaim(t, s, reviewID("fenced"), idemkv.ModeLocal)
	require.NoError(t, s.Release(ctx, fenced, nil))
	require.ErrorIs(t, s.Complete(ctx, fenced, idemkv.Result{Status: 200}, del("e", true)), idemkv.ErrFenced)
	for _, k := range []string{"a", "b", "c", "d"} {
		requireData(t, s, k, "")
	}
	requireData(t, s, "e", "x")
	evs, err := s.ReadOutbox(ctx, 0, 10)
	require.NoError(t, err)
	require.Len(t, evs, 2)
	rep, err := s.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%v", rep.Problems)
}
