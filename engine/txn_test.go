package engine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func u64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

// readU64 reads a counter through fx; absent is 0.
func readU64(t testing.TB, fx idemkv.Effects, key string) uint64 {
	v, err := fx.Get([]byte(key))
	if errors.Is(err, idemkv.ErrNotFound) {
		return 0
	}
	require.NoError(t, err)
	return binary.BigEndian.Uint64(v)
}

func TestEffectsReadTheirOwnWritesAndCommittedData(t *testing.T) {
	v := newEnv(t)
	require.NoError(t, v.e.Update(ctx, func(fx idemkv.Effects) error { return fx.Set([]byte("stock/sku1"), u64(5)) }))
	c := v.claim(id("p1"), fpA, idemkv.ModeLocal)
	require.NoError(t, v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, func(fx idemkv.Effects) error {
		require.Equal(t, uint64(5), readU64(t, fx, "stock/sku1"))
		_, err := fx.Get([]byte("absent"))
		require.ErrorIs(t, err, idemkv.ErrNotFound)
		require.NoError(t, fx.Set([]byte("stock/sku1"), u64(4)))
		require.Equal(t, uint64(4), readU64(t, fx, "stock/sku1"), "an operation reads its own write")
		require.NoError(t, fx.Delete([]byte("stock/sku1")))
		_, err = fx.Get([]byte("stock/sku1"))
		require.ErrorIs(t, err, idemkv.ErrNotFound, "and its own delete")
		return fx.Set([]byte("stock/sku1"), u64(3))
	}))
	got, err := v.e.GetData(ctx, []byte("stock/sku1"))
	require.NoError(t, err)
	require.Equal(t, u64(3), got)

	r, err := v.e.Check(ctx)
	require.NoError(t, err)
	require.Empty(t, r.Problems)
	require.Equal(t, 1, r.EffectsPaired, "the completion's value pairs with its outcome")
	require.NoError(t, v.e.Update(ctx, func(fx idemkv.Effects) error { return fx.Set([]byte("seed"), []byte("x")) }))
	r, err = v.e.Check(ctx)
	require.NoError(t, err)
	require.Empty(t, r.Problems)
	require.Equal(t, 1, r.EffectsStandalone, "a value written by Update belongs to no outcome")
}

// A commit that lands between an operation's read and its commit makes
// the operation run again on the new value, with its lease still held:
// the check (stock >= quantity) is never evaluated on stale data.
func TestConflictRunsTheApplyFunctionAgain(t *testing.T) {
	v := newEnv(t)
	require.NoError(t, v.e.Update(ctx, func(fx idemkv.Effects) error { return fx.Set([]byte("stock"), u64(1)) }))
	c := v.claim(id("order-a"), fpA, idemkv.ModeLocal)
	runs := 0
	err := v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, func(fx idemkv.Effects) error {
		runs++
		stock := readU64(t, fx, "stock")
		if runs == 1 {
			// Another order takes the last item after this one read it.
			require.NoError(t, v.e.Update(ctx, func(fx idemkv.Effects) error { return fx.Set([]byte("stock"), u64(0)) }))
		}
		if stock < 1 {
			return errOutOfStock
		}
		return fx.Set([]byte("stock"), u64(stock-1))
	})
	require.ErrorIs(t, err, errOutOfStock, "the second run sees the stock the other order left")
	require.Equal(t, 2, runs)
	got, err := v.e.GetData(ctx, []byte("stock"))
	require.NoError(t, err)
	require.Equal(t, u64(0), got, "never below zero")
	st, err := v.e.Stats()
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Conflicts)

	// The lease is still held: the holder can still finish.
	require.NoError(t, v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 409}, nil))
	require.Equal(t, idemkv.Replay, v.claim(id("order-a"), fpA, idemkv.ModeLocal).Outcome)
}

var errOutOfStock = errors.New("out of stock")

// A unique natural key: two operations that each check a key is absent
// and then create it cannot both succeed.
func TestConflictOnAbsentKey(t *testing.T) {
	v := newEnv(t)
	c := v.claim(id("signup-1"), fpA, idemkv.ModeLocal)
	runs := 0
	err := v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, func(fx idemkv.Effects) error {
		runs++
		if _, err := fx.Get([]byte("email/a@example.com")); err == nil {
			return errTaken
		}
		if runs == 1 {
			require.NoError(t, v.e.Update(ctx, func(fx idemkv.Effects) error {
				return fx.Set([]byte("email/a@example.com"), []byte("user-2"))
			}))
		}
		return fx.Set([]byte("email/a@example.com"), []byte("user-1"))
	})
	require.ErrorIs(t, err, errTaken)
	got, err := v.e.GetData(ctx, []byte("email/a@example.com"))
	require.NoError(t, err)
	require.Equal(t, "user-2", string(got))
}

var errTaken = errors.New("taken")

func TestConflictsAreBounded(t *testing.T) {
	v := newEnv(t)
	c := v.claim(id("p1"), fpA, idemkv.ModeLocal)
	runs := 0
	err := v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, func(fx idemkv.Effects) error {
		runs++
		n := readU64(t, fx, "hot")
		require.NoError(t, v.e.Update(ctx, func(fx idemkv.Effects) error { return fx.Set([]byte("hot"), u64(n+1000)) }))
		return fx.Set([]byte("hot"), u64(n+1))
	})
	require.ErrorIs(t, err, idemkv.ErrConflict)
	require.Equal(t, maxConflictRuns, runs)
	got, err := v.e.GetData(ctx, []byte("hot"))
	require.NoError(t, err)
	require.Equal(t, u64(maxConflictRuns*1000), got, "none of the conflicting runs wrote")
	require.Equal(t, idemkv.InProgress, v.claim(id("p1"), fpA, idemkv.ModeLocal).Outcome, "the lease is still held")

	// Update conflicts the same way.
	err = v.e.Update(ctx, func(fx idemkv.Effects) error {
		n := readU64(t, fx, "hot")
		c := v.claim(id(fmt.Sprint("bump-", n)), fpA, idemkv.ModeLocal)
		require.NoError(t, v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 200}, func(fx idemkv.Effects) error {
			return fx.Set([]byte("hot"), u64(n+1))
		}))
		return fx.Set([]byte("hot"), u64(0))
	})
	require.ErrorIs(t, err, idemkv.ErrConflict)
}

// Concurrent read-modify-write operations on shared keys, in random
// mixes: the counters end equal to the number of operations that
// committed, and the guarded balance never goes below zero, as if they
// had run one at a time.
func TestConcurrentTransactionsSerialize(t *testing.T) {
	v := newEnv(t)
	round := 0
	rapid.Check(t, func(rt *rapid.T) {
		round++
		keys := rapid.IntRange(1, 3).Draw(rt, "keys")
		workers := rapid.IntRange(2, 8).Draw(rt, "workers")
		start := rapid.IntRange(0, 6).Draw(rt, "balance")
		pfx := fmt.Sprintf("r%d/", round)
		require.NoError(rt, v.e.Update(ctx, func(fx idemkv.Effects) error { return fx.Set([]byte(pfx+"balance"), u64(uint64(start))) }))
		var wg sync.WaitGroup
		var mu sync.Mutex
		var committed, refused int
		perKey := make([]int, keys)
		for w := range workers {
			k := w % keys
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := v.e.Claim(ctx, idemkv.ClaimRequest{ID: id(fmt.Sprintf("%s%d", pfx, w)), Fingerprint: fpA})
				if err != nil {
					rt.Error(err)
					return
				}
				err = v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, func(fx idemkv.Effects) error {
					bal := readU64(t, fx, pfx+"balance")
					if bal == 0 {
						return errOutOfStock
					}
					if err := fx.Set([]byte(pfx+"balance"), u64(bal-1)); err != nil {
						return err
					}
					n := readU64(t, fx, fmt.Sprintf("%scount/%d", pfx, k))
					return fx.Set([]byte(fmt.Sprintf("%scount/%d", pfx, k)), u64(n+1))
				})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					committed++
					perKey[k]++
				case errors.Is(err, errOutOfStock), errors.Is(err, idemkv.ErrConflict):
					refused++
					if err := v.e.Release(ctx, c.Lease, nil); err != nil {
						rt.Error(err)
					}
				default:
					rt.Error(err)
				}
			}()
		}
		wg.Wait()
		require.Equal(rt, min(workers, start), committed, "every operation commits while the balance lasts (%d refused)", refused)
		bal, err := v.e.GetData(ctx, []byte(pfx+"balance"))
		require.NoError(rt, err)
		require.Equal(rt, uint64(start-committed), binary.BigEndian.Uint64(bal), "no lost update")
		for k, n := range perKey {
			got, err := v.e.GetData(ctx, []byte(fmt.Sprintf("%scount/%d", pfx, k)))
			if n == 0 {
				require.ErrorIs(rt, err, idemkv.ErrNotFound)
				continue
			}
			require.NoError(rt, err)
			require.Equal(rt, uint64(n), binary.BigEndian.Uint64(got), "counter %d", k)
		}
	})
	r, err := v.e.Check(ctx)
	require.NoError(t, err)
	require.Empty(t, r.Problems)
}

// The apply function can set the result it computed from what it read:
// the stored result is the committing run's.
func TestApplySetsTheResult(t *testing.T) {
	v := newEnv(t)
	c := v.claim(id("count"), fpA, idemkv.ModeLocal)
	runs := 0
	require.NoError(t, v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 500}, func(fx idemkv.Effects) error {
		runs++
		n := readU64(t, fx, "n")
		if runs == 1 {
			require.NoError(t, v.e.Update(ctx, func(fx idemkv.Effects) error { return fx.Set([]byte("n"), u64(41)) }))
		}
		require.ErrorIs(t, fx.(idemkv.ResultSetter).SetResult(idemkv.Result{Status: -1}), idemkv.ErrInvalidResult)
		require.NoError(t, fx.(idemkv.ResultSetter).SetResult(idemkv.Result{Status: 200, Body: []byte(fmt.Sprint(n + 1))}))
		return fx.Set([]byte("n"), u64(n+1))
	}))
	r := v.claim(id("count"), fpA, idemkv.ModeLocal)
	require.Equal(t, idemkv.Replay, r.Outcome)
	require.Equal(t, idemkv.Result{Status: 200, Body: []byte("42")}, r.Record.Result)
	require.ErrorIs(t, v.e.Update(ctx, func(fx idemkv.Effects) error {
		return fx.(idemkv.ResultSetter).SetResult(idemkv.Result{Status: 200})
	}), idemkv.ErrInvalidArgument)
}

// TestASecondReadSeesWhatTheFirstSaw: an apply function reads a key that
// a group still committing writes (so it sees that group's value, newer
// than its snapshot), and reads it again once the group has committed.
// The second read returns what the first did, not the snapshot's older
// value: the commit's check knows only the first read's version, so an
// older value written back would undo the group's write.
func TestASecondReadSeesWhatTheFirstSaw(t *testing.T) {
	v := newEnv(t)
	k, other := []byte("balance"), []byte("other")
	require.NoError(t, v.e.Update(ctx, func(fx idemkv.Effects) error {
		require.NoError(t, fx.Set(other, []byte("o")))
		return fx.Set(k, []byte("10"))
	}))

	finish := v.committing(func(fx idemkv.Effects) error { return fx.Set(k, []byte("20")) })

	runs := 0
	require.NoError(t, v.e.Update(ctx, func(fx idemkv.Effects) error {
		runs++
		_, err := fx.Get(other) // the snapshot: from before the group
		require.NoError(t, err)
		first, err := fx.Get(k)
		require.NoError(t, err)
		if runs == 1 {
			require.Equal(t, "20", string(first), "the group's pending write")
			finish()
		}
		second, err := fx.Get(k)
		require.NoError(t, err)
		require.Equal(t, string(first), string(second), "run %d", runs)
		return fx.Set(k, append(second, '+'))
	}))
	got, err := v.e.GetData(ctx, k)
	require.NoError(t, err)
	require.Equal(t, "20+", string(got), "nothing the group wrote is undone")
}

// TestAFailureOnAMixedStateRunsAgain: a group moves 5 from a to b (their
// sum stays 10). An apply function reads a from that group while it is
// still committing, and b after it committed, from its snapshot, older:
// a state the data never had, in which the function fails its own check.
// Its reads have changed since, so the failure is not returned: it runs
// again on fresh reads, and passes.
func TestAFailureOnAMixedStateRunsAgain(t *testing.T) {
	v := newEnv(t)
	a, b, other := []byte("a"), []byte("b"), []byte("other")
	require.NoError(t, v.e.Update(ctx, func(fx idemkv.Effects) error {
		require.NoError(t, fx.Set(other, []byte("o")))
		require.NoError(t, fx.Set(a, []byte("5")))
		return fx.Set(b, []byte("5"))
	}))
	finish := v.committing(func(fx idemkv.Effects) error {
		require.NoError(t, fx.Set(a, []byte("0")))
		return fx.Set(b, []byte("10"))
	})

	var seen []string
	err := v.e.Update(ctx, func(fx idemkv.Effects) error {
		_, err := fx.Get(other) // the snapshot: from before the group
		require.NoError(t, err)
		av, err := fx.Get(a)
		require.NoError(t, err)
		if len(seen) == 0 {
			finish()
		}
		bv, err := fx.Get(b)
		require.NoError(t, err)
		seen = append(seen, string(av)+"+"+string(bv))
		if string(av)+"+"+string(bv) != "0+10" && string(av)+"+"+string(bv) != "5+5" {
			return fmt.Errorf("a and b sum to other than 10: %s", seen[len(seen)-1])
		}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, []string{"0+5", "0+10"}, seen)
}

// TestAFailureIsReturnedAsItIs: an apply function that fails on one
// state of the data has its error returned, however the data moved on
// after its read: Update's contract, which a caller such as package once
// relies on to tell its own errors (a panic it recovered) from the store's.
func TestAFailureIsReturnedAsItIs(t *testing.T) {
	v := newEnv(t)
	require.NoError(t, v.e.Update(ctx, func(fx idemkv.Effects) error { return fx.Set([]byte("hot"), []byte("0")) }))
	errInsufficient := errors.New("insufficient funds")
	runs := 0
	err := v.e.Update(ctx, func(fx idemkv.Effects) error {
		runs++
		_, err := fx.Get([]byte("hot"))
		require.NoError(t, err)
		require.NoError(t, v.e.Update(ctx, func(fx idemkv.Effects) error { return fx.Set([]byte("hot"), []byte("x")) }))
		return errInsufficient
	})
	require.ErrorIs(t, err, errInsufficient)
	require.Equal(t, 1, runs)
}

// committing starts Update(fn) and returns once its group is committing,
// its writes listed as pending; finish lets it commit, and returns once
// the committer has forgotten them, so that reads come from Pebble again.
func (v *env) committing(fn func(idemkv.Effects) error) (finish func()) {
	held, release := make(chan struct{}), make(chan struct{})
	v.e.commits.stamp = func(*pebble.Batch) {
		v.e.commits.stamp = nil
		close(held)
		<-release
	}
	committed := make(chan error, 1)
	var keys [][]byte
	go func() {
		committed <- v.e.Update(ctx, func(fx idemkv.Effects) error { return fn(recording{fx, &keys}) })
	}()
	<-held
	return func() {
		close(release)
		require.NoError(v.t, <-committed)
		for _, k := range keys {
			for { // until the committer forgets the group's write
				if _, _, pending := v.e.commits.pendingRead(dataKey(k)); !pending {
					break
				}
				runtime.Gosched()
			}
		}
	}
}

// recording is Effects that notes the keys set.
type recording struct {
	idemkv.Effects
	keys *[][]byte
}

func (r recording) Set(key, value []byte) error {
	*r.keys = append(*r.keys, key)
	return r.Effects.Set(key, value)
}
