package saga_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/internal/layertest/teststore"
	"github.com/idemkv/idemkv/internal/tier"
	"github.com/idemkv/idemkv/reconcile"
	"github.com/idemkv/idemkv/saga"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// modelWorld is the saga model's downstream and script: per saga and
// action, the faults still to come; the processor's ledger by key; and
// every local commit, by action.
type modelWorld struct {
	mu     sync.Mutex
	script map[string][]string // "saga/action" -> faults to come: "permanent", "unknown", "transient", "crash"
	ledger map[string]int      // processor key -> effects applied (must stay 1)
	keys   map[string]string   // processor key -> "saga/action" it was sent for
}

// attemptSeq names each local attempt's commit key.
var attemptSeq atomic.Int64

func (w *modelWorld) next(saga, action string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	k := saga + "/" + action
	f := w.script[k]
	if len(f) == 0 {
		return ""
	}
	w.script[k] = f[1:]
	return f[0]
}

// TestSagaModel drives sagas whose actions fail by script (for good, with
// an unknown outcome, transiently, or by crashing the runner in the
// middle), with two runners resuming at once, reconciler passes, clock
// advances and restarts of the store, and checks that every remote action
// reached the processor under one key and took effect once, that every
// local action committed once, and that in the end every saga is
// completed, or compensated with exactly the steps before its failure
// undone.
func TestSagaModel(t *testing.T) {
	clock := fakeclock.New(t0)
	dir := t.TempDir()
	open := func() teststore.Store {
		return teststore.Open(t, dir, teststore.Options{Clock: clock, Lease: lease})
	}
	e := open()
	defer func() { _ = e.Close() }()
	n := 0
	tier.LimitRapid()
	rapid.Check(t, func(rt *rapid.T) {
		if raceEnabled && rapid.IntRange(0, 2).Draw(rt, "skip") != 0 {
			return // the race detector makes a run several times slower
		}
		w := &modelWorld{script: map[string][]string{}, ledger: map[string]int{}, keys: map[string]string{}}
		def := modelDefinition(w)
		runners := func() [2]*saga.Runner {
			var rs [2]*saga.Runner
			for i := range rs {
				r, err := saga.New(e, def, &saga.Options{Lease: lease, MaxAttempts: 2,
					After: func(time.Duration) <-chan time.Time { return closedTime }})
				require.NoError(t, err)
				rs[i] = r
			}
			return rs
		}
		rs := runners()
		// One reconciler per process, as serve runs it: it remembers when
		// it first saw a record that its store did not say when it was
		// marked, and the grace runs from then.
		rw := modelReconciler(t, e, rs[0], w, clock)
		var ids []string
		// run runs f with a context that a "crash" fault cancels: the
		// runner stops in the middle of an action, as a process would.
		run := func(f func(ctx context.Context) error) {
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			ctx = context.WithValue(ctx, crashKey{}, cancel)
			if err := f(ctx); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, idemkv.ErrFenced) {
				t.Fatalf("runner: %v", err)
			}
		}
		rt.Repeat(map[string]func(*rapid.T){
			"start": func(rt *rapid.T) {
				id := fmt.Sprintf("s%d", n)
				n++
				ids = append(ids, id)
				for _, action := range []string{"reserve", "authorize", "confirm", "capture", "unreserve", "void"} {
					f := rapid.SampledFrom([]string{"", "", "", "permanent", "unknown", "transient", "crash"}).Draw(rt, action)
					if (action == "reserve" || action == "confirm" || action == "unreserve") && f == "unknown" {
						f = "" // local actions always know
					}
					if (action == "unreserve" || action == "void") && f == "permanent" {
						f = "transient" // an undo that fails for good is escalated: the other tests cover it
					}
					w.script[id+"/"+action] = []string{f}
				}
				r := rs[rapid.IntRange(0, 1).Draw(rt, "runner")]
				run(func(ctx context.Context) error {
					_, err := r.Start(ctx, "acct_1", id, []byte(id))
					return err
				})
			},
			"resume": func(rt *rapid.T) {
				var wg sync.WaitGroup
				for _, r := range rs[:rapid.IntRange(1, 2).Draw(rt, "runners")] {
					wg.Go(func() {
						run(func(ctx context.Context) error {
							_, err := r.Resume(ctx)
							return err
						})
					})
				}
				wg.Wait()
			},
			"reconcile": func(rt *rapid.T) {
				require.NoError(t, rw.Pass(ctx))
			},
			"advance": func(rt *rapid.T) {
				clock.Advance(rapid.SampledFrom([]time.Duration{time.Second, lease}).Draw(rt, "d"))
			},
			"restart": func(rt *rapid.T) {
				if rapid.IntRange(0, 3).Draw(rt, "restart") != 0 {
					return // a reopen is most of a run's cost: one step in four of these
				}
				require.NoError(t, e.Close())
				e = open()
				rs = runners()
				rw = modelReconciler(t, e, rs[0], w, clock)
			},
			"": func(rt *rapid.T) { checkSagaModel(t, e, w) },
		})
		// With time, reconciliation and resumption, every saga ends.
		for range 6 {
			clock.Advance(lease)
			require.NoError(t, rw.Pass(ctx))
			_, err := rs[0].Resume(ctx)
			require.NoError(t, err)
		}
		checkSagaModel(t, e, w)
		for _, id := range ids {
			st, err := rs[0].Status(ctx, "acct_1", id)
			require.NoError(t, err)
			require.Contains(t, []saga.Phase{saga.Completed, saga.Compensated}, st.Phase, "%s: %+v", id, st)
			undone := func(step string) bool {
				_, err := e.Get(ctx, idemkv.ID{Tenant: "acct_1", Endpoint: "saga/order/undo/" + step, Key: id})
				return err == nil
			}
			if st.Phase == saga.Completed {
				require.Len(t, st.Outputs, 4, id)
				require.False(t, undone("reserve") || undone("authorize"), "%s completed with an undo", id)
				continue
			}
			// Compensated: the steps before the failed one, and only those.
			_, reserved := st.Outputs["reserve"]
			_, authorized := st.Outputs["authorize"]
			require.Equal(t, authorized, undone("authorize"), "%s: authorize undone iff it completed", id)
			require.Equal(t, reserved, undone("reserve"), "%s: reserve undone iff it completed", id)
		}
		teststore.RequireSound(t, e)
	})
}

type crashKey struct{}

// modelDefinition is the order saga with every action scripted by w.
func modelDefinition(w *modelWorld) saga.Definition {
	fault := func(ctx context.Context, x *saga.Exec, action string) error {
		switch w.next(x.ID, action) {
		case "permanent":
			return saga.ErrPermanent
		case "unknown":
			return saga.ErrUnknown
		case "transient":
			return errors.New("busy")
		case "crash":
			if cancel, ok := ctx.Value(crashKey{}).(context.CancelFunc); ok {
				cancel()
				return ctx.Err()
			}
		}
		return nil
	}
	local := func(action string) func(ctx context.Context, x *saga.Exec) ([]byte, error) {
		return func(ctx context.Context, x *saga.Exec) ([]byte, error) {
			if err := fault(ctx, x, action); err != nil {
				return nil, err
			}
			// A key per attempt: the store must keep exactly one.
			return []byte(action), x.Effects.Set([]byte(fmt.Sprintf("commit/%s/%s/%d", x.ID, action, attemptSeq.Add(1))), nil)
		}
	}
	remote := func(action string) func(ctx context.Context, x *saga.Exec) ([]byte, error) {
		return func(ctx context.Context, x *saga.Exec) ([]byte, error) {
			err := fault(ctx, x, action)
			if err == nil || errors.Is(err, saga.ErrUnknown) {
				w.mu.Lock()
				if w.ledger[x.Key] == 0 {
					w.ledger[x.Key] = 1 // the processor deduplicates on the key
				}
				if prev, ok := w.keys[x.Key]; ok && prev != x.ID+"/"+action {
					panic(fmt.Sprintf("key %s sent for %s and %s", x.Key, prev, x.ID+"/"+action))
				}
				w.keys[x.Key] = x.ID + "/" + action
				w.mu.Unlock()
			}
			if err != nil {
				return nil, err
			}
			return []byte(action), nil
		}
	}
	undo := func(action string, local bool) func(ctx context.Context, x *saga.Exec) error {
		return func(ctx context.Context, x *saga.Exec) error {
			var err error
			if local {
				_, err = modelLocalUndo(ctx, x, action, fault)
			} else {
				_, err = remote(action)(ctx, x)
			}
			return err
		}
	}
	return saga.Definition{Name: "order", Steps: []saga.Step{
		{Name: "reserve", Do: local("reserve"), Undo: undo("unreserve", true)},
		{Name: "authorize", Remote: true, Do: remote("authorize"), Undo: undo("void", false)},
		{Name: "confirm", Do: local("confirm")},
		{Name: "capture", Remote: true, Do: remote("capture")},
	}}
}

func modelLocalUndo(ctx context.Context, x *saga.Exec, action string, fault func(context.Context, *saga.Exec, string) error) ([]byte, error) {
	if err := fault(ctx, x, action); err != nil {
		return nil, err
	}
	return nil, x.Effects.Set([]byte(fmt.Sprintf("commit/%s/%s/%d", x.ID, action, attemptSeq.Add(1))), nil)
}

// modelReconciler settles uncertain actions by the ledger: an action whose
// key the processor saw happened; and wakes the saga of each through r.
func modelReconciler(t *testing.T, e teststore.Store, r *saga.Runner, w *modelWorld, clock *fakeclock.Clock) *reconcile.Worker {
	worker, err := reconcile.New(e, reconcile.ReconcilerFunc(func(ctx context.Context, rec idemkv.Record) (reconcile.Answer, error) {
		a, ok, err := r.ActionOf(ctx, rec)
		if err != nil || !ok {
			return reconcile.Answer{}, err
		}
		w.mu.Lock()
		seen := w.ledger[a.Key] > 0
		w.mu.Unlock()
		if !seen {
			return reconcile.Answer{Verdict: reconcile.NotApplied}, nil
		}
		return reconcile.Answer{Verdict: reconcile.Applied, Result: saga.Done([]byte(a.Step))}, nil
	}), &reconcile.Options{Clock: clock, Grace: time.Second, Handles: func(rec idemkv.Record) bool { return !r.Owns(rec) },
		OnResolve: func(ctx context.Context, rec idemkv.Record, _ reconcile.Verdict) {
			// The saga goes on at once, in the pass, as serve wires it.
			if _, _, err := r.Wake(ctx, rec); err != nil && !errors.Is(err, idemkv.ErrFenced) {
				t.Errorf("wake: %v", err)
			}
		}})
	require.NoError(t, err)
	return worker
}

// checkSagaModel: every processor key took effect once, and every local
// action committed at most once.
func checkSagaModel(t *testing.T, e teststore.Store, w *modelWorld) {
	w.mu.Lock()
	for k, n := range w.ledger {
		require.Equal(t, 1, n, "processor key %s", k)
	}
	w.mu.Unlock()
	commits := map[string]int{}
	require.NoError(t, e.ScanData(ctx, []byte("commit/"), func(k, _ []byte) bool {
		s := string(k)
		action := s[:len(s)-len(s[lastSlash(s):])]
		commits[action]++
		return true
	}))
	for action, n := range commits {
		require.Equal(t, 1, n, "local action %s committed %d times", action, n)
	}
}

func lastSlash(s string) int {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '/' {
			return i
		}
	}
	return 0
}
