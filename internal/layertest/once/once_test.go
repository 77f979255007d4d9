package once_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/internal/layertest/teststore"
	"github.com/idemkv/idemkv/once"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var ctx = context.Background()

var t0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

const lease = 30 * time.Second

// env is a real store (teststore: the engine in a temporary directory,
// or PostgreSQL), on a fake clock.
type env struct {
	t     *testing.T
	dir   string
	opts  teststore.Options
	clock *fakeclock.Clock
	e     teststore.Store
}

func newEnv(t *testing.T, opts *teststore.Options) *env {
	v := &env{t: t, dir: t.TempDir(), clock: fakeclock.New(t0)}
	if opts != nil {
		v.opts = *opts
	}
	v.opts.Clock, v.opts.Lease = v.clock, lease
	v.open()
	t.Cleanup(func() { _ = v.e.Close() })
	return v
}

func (v *env) open() {
	v.e = teststore.Open(v.t, v.dir, v.opts)
}

// reopen closes the store and opens it again, as a restart does.
func (v *env) reopen() {
	require.NoError(v.t, v.e.Close())
	v.open()
}

func id(key string) idemkv.ID {
	return idemkv.ID{Tenant: "acct_1", Endpoint: "jobs.send", Key: key}
}

func call(key string) once.Call {
	return once.Call{ID: id(key), Fingerprint: []byte("fp-" + key)}
}

func remote(key string) once.Call {
	c := call(key)
	c.Mode = idemkv.ModeRemote
	return c
}

// data returns a value written through Effects, or "" if it is absent.
func (v *env) data(key string) string {
	b, err := v.e.GetData(ctx, []byte(key))
	if errors.Is(err, idemkv.ErrNotFound) {
		return ""
	}
	require.NoError(v.t, err)
	return string(b)
}

// state returns the state of key's record, 0 if it has none.
func (v *env) state(key string) idemkv.State {
	rec, err := v.e.Get(ctx, id(key))
	if errors.Is(err, idemkv.ErrNotFound) {
		return 0
	}
	require.NoError(v.t, err)
	return rec.State
}

func (v *env) record(key string) idemkv.Record {
	rec, err := v.e.Get(ctx, id(key))
	require.NoError(v.t, err)
	return rec
}

// counted wraps fn, counting its runs.
type counted struct {
	mu   sync.Mutex
	runs int
	fn   once.Func
}

func count(fn once.Func) *counted { return &counted{fn: fn} }

func (c *counted) Func(ctx context.Context, x *once.Exec) (idemkv.Result, error) {
	c.mu.Lock()
	c.runs++
	c.mu.Unlock()
	return c.fn(ctx, x)
}

func (c *counted) n() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runs
}

var created = idemkv.Result{Status: 201, Pointer: "/orders/1", Body: []byte(`{"id":1}`)}

// noSetter is a store whose Effects do not implement idemkv.ResultSetter:
// the engine, with SetResult hidden from the apply functions of Complete,
// so that Do takes its fallback (offering results).
type noSetter struct{ idemkv.Store }

func (s noSetter) Complete(ctx context.Context, l idemkv.Lease, r idemkv.Result, apply func(idemkv.Effects) error) error {
	if apply == nil {
		return s.Store.Complete(ctx, l, r, nil)
	}
	return s.Store.Complete(ctx, l, r, func(fx idemkv.Effects) error { return apply(plainEffects{fx}) })
}

// plainEffects has only the methods of idemkv.Effects.
type plainEffects struct{ idemkv.Effects }

// storeKinds are the two paths of a local result: a store whose Effects
// set it (the engine), and the fallback for one whose do not.
var storeKinds = []struct {
	name     string
	fallback bool
}{{"setter", false}, {"fallback", true}}

// store returns the engine, or, for the fallback, the engine behind
// noSetter.
func (v *env) store(fallback bool) idemkv.Store {
	if fallback {
		return noSetter{v.e}
	}
	return v.e
}

func TestNoSetterHidesSetResult(t *testing.T) {
	v := newEnv(t, nil)
	for _, k := range storeKinds {
		var isSetter bool
		_, err := once.Do(ctx, v.store(k.fallback), call(k.name), func(_ context.Context, x *once.Exec) (idemkv.Result, error) {
			_, isSetter = x.Effects.(idemkv.ResultSetter)
			return idemkv.Result{}, nil
		})
		require.NoError(t, err)
		assert.Equal(t, !k.fallback, isSetter, k.name)
	}
}

func TestLocalCommitsResultWithEffects(t *testing.T) {
	for _, k := range storeKinds {
		t.Run(k.name, func(t *testing.T) { testLocalCommitsResultWithEffects(t, k.fallback) })
	}
}

func testLocalCommitsResultWithEffects(t *testing.T, fallback bool) {
	v := newEnv(t, nil)
	var runs []int
	out, err := once.Do(ctx, v.store(fallback), call("k"), func(_ context.Context, x *once.Exec) (idemkv.Result, error) {
		runs = append(runs, x.Run)
		require.Equal(t, idemkv.ModeLocal, x.Lease.Mode)
		if err := x.Effects.Set([]byte("order/1"), []byte("paid")); err != nil {
			return idemkv.Result{}, err
		}
		if err := x.Apply(func(fx idemkv.Effects) error { return fx.Set([]byte("order/1/note"), []byte("via apply")) }); err != nil {
			return idemkv.Result{}, err
		}
		return created, x.Effects.Emit(idemkv.Event{Topic: "orders.paid", Key: "1", Payload: []byte("p")})
	})
	require.NoError(t, err)
	assert.Equal(t, once.Outcome{Result: created}, out)
	if fallback {
		// A result other than the zero one costs a first run to learn it
		// (its writes discarded), then the run that commits.
		assert.Equal(t, []int{1, 2}, runs)
	} else {
		assert.Equal(t, []int{1}, runs, "the run sets its result in its commit")
	}

	rec := v.record("k")
	assert.Equal(t, idemkv.StateCompleted, rec.State)
	assert.Equal(t, created, rec.Result)
	assert.Equal(t, 2, rec.Effects, "the two values set commit with the result")
	assert.Equal(t, "paid", v.data("order/1"))
	assert.Equal(t, "via apply", v.data("order/1/note"))
	evs, err := v.e.ReadOutbox(ctx, 0, 10)
	require.NoError(t, err)
	require.Len(t, evs, 1, "one event, however often the function ran")
	assert.Equal(t, "orders.paid", evs[0].Topic)
}

func TestLocalZeroResultRunsOnce(t *testing.T) {
	v := newEnv(t, nil)
	fn := count(func(_ context.Context, x *once.Exec) (idemkv.Result, error) {
		return idemkv.Result{}, x.Effects.Set([]byte("job/1"), []byte("done"))
	})
	out, err := once.Do(ctx, v.e, call("k"), fn.Func)
	require.NoError(t, err)
	assert.Equal(t, once.Outcome{}, out)
	assert.Equal(t, 1, fn.n())
	assert.Equal(t, "done", v.data("job/1"))
}

func TestReplay(t *testing.T) {
	for _, mode := range []idemkv.Mode{idemkv.ModeLocal, idemkv.ModeRemote} {
		t.Run(mode.String(), func(t *testing.T) {
			v := newEnv(t, nil)
			c := call("k")
			c.Mode = mode
			fn := count(func(context.Context, *once.Exec) (idemkv.Result, error) { return created, nil })
			first, err := once.Do(ctx, v.e, c, fn.Func)
			require.NoError(t, err)
			runs := fn.n()

			again, err := once.Do(ctx, v.e, c, fn.Func)
			require.NoError(t, err)
			assert.True(t, again.Replayed)
			assert.Equal(t, created, again.Result)
			assert.Equal(t, first.OperationID, again.OperationID)
			assert.Equal(t, runs, fn.n(), "a replay runs nothing")
			if mode == idemkv.ModeRemote {
				assert.False(t, first.OperationID.IsZero())
			}
		})
	}
}

func TestMismatch(t *testing.T) {
	v := newEnv(t, nil)
	fn := count(func(context.Context, *once.Exec) (idemkv.Result, error) { return created, nil })
	_, err := once.Do(ctx, v.e, call("k"), fn.Func)
	require.NoError(t, err)
	runs := fn.n()

	other := call("k")
	other.Fingerprint = []byte("other input")
	_, err = once.Do(ctx, v.e, other, fn.Func)
	require.ErrorIs(t, err, once.ErrMismatch)
	assert.Contains(t, err.Error(), "jobs.send key_hash "+other.ID.Hash(), "named by endpoint and key hash, never by key")
	assert.Equal(t, runs, fn.n())
}

var errDeclined = errors.New("validation: amount missing")

func TestNoEffectReleases(t *testing.T) {
	for _, mode := range []idemkv.Mode{idemkv.ModeLocal, idemkv.ModeRemote} {
		t.Run(mode.String(), func(t *testing.T) {
			v := newEnv(t, nil)
			c := call("k")
			c.Mode = mode
			_, err := once.Do(ctx, v.e, c, func(_ context.Context, x *once.Exec) (idemkv.Result, error) {
				require.NoError(t, x.Effects.Set([]byte("order/1"), []byte("half-done")))
				return idemkv.Result{}, once.NoEffect(errDeclined)
			})
			require.ErrorIs(t, err, once.ErrNoEffect)
			require.ErrorIs(t, err, errDeclined)
			assert.Equal(t, errDeclined.Error(), err.Error())
			assert.Zero(t, v.state("k"), "released")
			assert.Empty(t, v.data("order/1"), "nothing written")

			out, err := once.Do(ctx, v.e, c, func(context.Context, *once.Exec) (idemkv.Result, error) { return created, nil })
			require.NoError(t, err, "a retry runs anew")
			assert.False(t, out.Replayed)
		})
	}
}

func TestLocalErrorReleases(t *testing.T) {
	v := newEnv(t, nil)
	boom := errors.New("insufficient stock")
	_, err := once.Do(ctx, v.e, call("k"), func(_ context.Context, x *once.Exec) (idemkv.Result, error) {
		require.NoError(t, x.Effects.Set([]byte("stock/1"), []byte("-1")))
		return idemkv.Result{}, boom
	})
	require.Equal(t, boom, err, "the function's own error, as it is")
	assert.Zero(t, v.state("k"))
	assert.Empty(t, v.data("stock/1"))

	_, err = once.Do(ctx, v.e, call("k"), func(_ context.Context, x *once.Exec) (idemkv.Result, error) {
		return idemkv.Result{}, x.Effects.Set([]byte("stock/1"), []byte("-1"))
	})
	require.NoError(t, err)
	assert.Equal(t, "-1", v.data("stock/1"))
}

func TestRemoteErrorIsUncertain(t *testing.T) {
	v := newEnv(t, nil)
	timeout := errors.New("psp: read timeout")
	_, err := once.Do(ctx, v.e, remote("k"), func(_ context.Context, x *once.Exec) (idemkv.Result, error) {
		require.NoError(t, x.Effects.Set([]byte("charge/1"), []byte("ch_1")))
		return idemkv.Result{}, timeout
	})
	require.ErrorIs(t, err, once.ErrUncertain)
	require.ErrorIs(t, err, timeout)
	rec := v.record("k")
	assert.Equal(t, idemkv.StateUncertain, rec.State)
	assert.Contains(t, rec.Note, "psp: read timeout")
	assert.Empty(t, v.data("charge/1"), "deferred writes are dropped")

	fn := count(func(context.Context, *once.Exec) (idemkv.Result, error) { return created, nil })
	_, err = once.Do(ctx, v.e, remote("k"), fn.Func)
	require.ErrorIs(t, err, once.ErrReconciling)
	assert.Contains(t, err.Error(), "psp: read timeout", "the error carries the record's note")
	assert.Zero(t, fn.n(), "an uncertain operation is not run again")

	// Once a reconciler learns it did not happen, a retry runs.
	require.NoError(t, v.e.Resolve(ctx, idemkv.ResolveRequest{ID: id("k"), Token: rec.Token, NoEffect: true}))
	_, err = once.Do(ctx, v.e, remote("k"), fn.Func)
	require.NoError(t, err)
	assert.Equal(t, 1, fn.n())
}

func TestLocalPanicReleasesAndRepanics(t *testing.T) {
	v := newEnv(t, nil)
	require.PanicsWithValue(t, "boom", func() {
		_, _ = once.Do(ctx, v.e, call("k"), func(_ context.Context, x *once.Exec) (idemkv.Result, error) {
			require.NoError(t, x.Effects.Set([]byte("order/1"), []byte("paid")))
			panic("boom")
		})
	})
	assert.Zero(t, v.state("k"), "released")
	assert.Empty(t, v.data("order/1"))
	_, err := once.Do(ctx, v.e, call("k"), func(context.Context, *once.Exec) (idemkv.Result, error) { return created, nil })
	require.NoError(t, err, "the store is unharmed and the key free")
}

func TestRemotePanicIsUncertain(t *testing.T) {
	v := newEnv(t, nil)
	require.PanicsWithValue(t, "boom", func() {
		_, _ = once.Do(ctx, v.e, remote("k"), func(context.Context, *once.Exec) (idemkv.Result, error) {
			panic("boom")
		})
	})
	rec := v.record("k")
	assert.Equal(t, idemkv.StateUncertain, rec.State)
	assert.Contains(t, rec.Note, "panicked: boom")
}

func TestGoexitSettles(t *testing.T) {
	for _, tc := range []struct {
		c    once.Call
		want idemkv.State
	}{{call("k"), 0}, {remote("k"), idemkv.StateUncertain}} {
		t.Run(tc.c.Mode.String(), func(t *testing.T) {
			v := newEnv(t, nil)
			done := make(chan struct{})
			go func() {
				defer close(done)
				_, _ = once.Do(ctx, v.e, tc.c, func(context.Context, *once.Exec) (idemkv.Result, error) {
					runtime.Goexit()
					return idemkv.Result{}, nil
				})
			}()
			<-done
			assert.Equal(t, tc.want, v.state("k"))
		})
	}
}

func TestRemoteSuccess(t *testing.T) {
	v := newEnv(t, nil)
	var sent idemkv.OperationID
	out, err := once.Do(ctx, v.e, remote("k"), func(_ context.Context, x *once.Exec) (idemkv.Result, error) {
		sent = x.Lease.OperationID
		_, err := x.Effects.Get([]byte("balance"))
		require.ErrorIs(t, err, idemkv.ErrInvalidArgument, "a remote function reads in Apply")
		require.NoError(t, x.Effects.Set([]byte("charge/1"), []byte(x.Lease.OperationID.StepKey("charge"))))
		require.NoError(t, x.Apply(func(fx idemkv.Effects) error { return addTo(fx, "charges", 1) }))
		require.NoError(t, x.Effects.Delete([]byte("charge/0")))
		require.NoError(t, x.Effects.Emit(idemkv.Event{Topic: "charges.made", Payload: []byte("ch_1")}))
		return created, nil
	})
	require.NoError(t, err)
	assert.False(t, sent.IsZero())
	assert.Equal(t, once.Outcome{Result: created, OperationID: sent}, out)
	assert.Equal(t, idemkv.StateCompleted, v.state("k"))
	assert.Equal(t, sent.StepKey("charge"), v.data("charge/1"))
	assert.Equal(t, "1", v.data("charges"))
	evs, err := v.e.ReadOutbox(ctx, 0, 10)
	require.NoError(t, err)
	require.Len(t, evs, 1)
}

func TestApplyAfterReturnFails(t *testing.T) {
	v := newEnv(t, nil)
	for _, c := range []once.Call{call("a"), remote("b")} {
		var kept *once.Exec
		_, err := once.Do(ctx, v.e, c, func(_ context.Context, x *once.Exec) (idemkv.Result, error) {
			kept = x
			return idemkv.Result{}, nil
		})
		require.NoError(t, err)
		require.ErrorIs(t, kept.Apply(func(idemkv.Effects) error { return nil }), idemkv.ErrInvalidArgument)
	}
}

// addTo adds n to the decimal counter at key, reading it through fx.
func addTo(fx idemkv.Effects, key string, n int) error {
	cur := 0
	b, err := fx.Get([]byte(key))
	switch {
	case errors.Is(err, idemkv.ErrNotFound):
	case err != nil:
		return err
	default:
		if cur, err = strconv.Atoi(string(b)); err != nil {
			return err
		}
	}
	return fx.Set([]byte(key), []byte(strconv.Itoa(cur+n)))
}

func TestRemoteSettlesDespiteCancelledContext(t *testing.T) {
	v := newEnv(t, nil)
	cctx, cancel := context.WithCancel(ctx)
	out, err := once.Do(cctx, v.e, remote("ok"), func(_ context.Context, x *once.Exec) (idemkv.Result, error) {
		cancel() // the caller gives up while the downstream answers
		return created, x.Effects.Set([]byte("charge/ok"), []byte("ch"))
	})
	require.NoError(t, err)
	assert.Equal(t, created, out.Result)
	assert.Equal(t, idemkv.StateCompleted, v.state("ok"))
	assert.Equal(t, "ch", v.data("charge/ok"))

	cctx, cancel = context.WithCancel(ctx)
	_, err = once.Do(cctx, v.e, remote("gone"), func(ctx context.Context, _ *once.Exec) (idemkv.Result, error) {
		cancel()
		return idemkv.Result{}, ctx.Err() // the call was cut off: it may have landed
	})
	require.ErrorIs(t, err, once.ErrUncertain)
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, idemkv.StateUncertain, v.state("gone"))
}

func TestRemoteResultTooLargeIsUncertain(t *testing.T) {
	v := newEnv(t, &teststore.Options{MaxBodySize: 16})
	_, err := once.Do(ctx, v.e, remote("k"), func(context.Context, *once.Exec) (idemkv.Result, error) {
		return idemkv.Result{Status: 200, Body: make([]byte, 17)}, nil
	})
	require.ErrorIs(t, err, once.ErrUncertain)
	require.ErrorIs(t, err, idemkv.ErrInvalidResult)
	rec := v.record("k")
	assert.Equal(t, idemkv.StateUncertain, rec.State)
	assert.Contains(t, rec.Note, "could not be stored")
}

func TestLocalInvalidResultReleases(t *testing.T) {
	for _, k := range storeKinds {
		t.Run(k.name, func(t *testing.T) {
			v := newEnv(t, &teststore.Options{MaxBodySize: 16})
			_, err := once.Do(ctx, v.store(k.fallback), call("k"), func(_ context.Context, x *once.Exec) (idemkv.Result, error) {
				return idemkv.Result{Status: 200, Body: make([]byte, 17)}, x.Effects.Set([]byte("x"), []byte("y"))
			})
			require.ErrorIs(t, err, idemkv.ErrInvalidResult)
			assert.Contains(t, err.Error(), "committing the result", "the store's refusal, not the function's error")
			assert.Zero(t, v.state("k"))
			assert.Empty(t, v.data("x"))
		})
	}
}

// holder claims key as another attempt would, and returns its lease.
func (v *env) holder(key string, mode idemkv.Mode, resumable bool) idemkv.Lease {
	c := call(key)
	cl, err := v.e.Claim(ctx, idemkv.ClaimRequest{ID: c.ID, Fingerprint: c.Fingerprint, Mode: mode, Resumable: resumable})
	require.NoError(v.t, err)
	require.Equal(v.t, idemkv.Acquired, cl.Outcome)
	return cl.Lease
}

// waits is a Call.After that records each wait and, on it, runs the next
// of then (the other attempt finishing, say) before it lets the wait end.
type waits struct {
	got  []time.Duration
	then []func()
}

func (w *waits) After(d time.Duration) <-chan time.Time {
	w.got = append(w.got, d)
	if len(w.then) > 0 {
		w.then[0]()
		w.then = w.then[1:]
	}
	ch := make(chan time.Time, 1)
	ch <- t0
	return ch
}

func TestInProgressWaitsForHolder(t *testing.T) {
	v := newEnv(t, nil)
	l := v.holder("k", idemkv.ModeLocal, false)
	w := &waits{then: []func(){
		func() { v.clock.Advance(10 * time.Second) }, // still held: wait again
		func() { require.NoError(t, v.e.Complete(ctx, l, created, nil)) },
	}}
	c := call("k")
	c.After = w.After
	fn := count(func(context.Context, *once.Exec) (idemkv.Result, error) { return idemkv.Result{Status: 500}, nil })
	out, err := once.Do(ctx, v.e, c, fn.Func)
	require.NoError(t, err)
	assert.True(t, out.Replayed)
	assert.Equal(t, created, out.Result, "the holder's result")
	assert.Zero(t, fn.n())
	assert.Equal(t, []time.Duration{once.DefaultPoll, once.DefaultPoll}, w.got)
}

// lostWatches is a store whose every watch ends at once, as pgstore's do
// when its listener loses the database, until it cannot watch at all.
type lostWatches struct {
	idemkv.Store
	watches int
}

func (s *lostWatches) Watch(context.Context, idemkv.ID, uint64) (<-chan struct{}, func(), error) {
	s.watches++
	if s.watches > 3 {
		return nil, nil, idemkv.ErrCannotWatch
	}
	ch := make(chan struct{})
	close(ch)
	return ch, func() {}, nil
}

// TestInProgressWatchesAfreshAfterAWatchEnds: a watch that ended (the
// holder settled, or the store lost its notifications) is not waited on
// again: each wait watches anew, and polls once the store cannot watch,
// rather than claiming again and again at once.
func TestInProgressWatchesAfreshAfterAWatchEnds(t *testing.T) {
	v := newEnv(t, nil)
	l := v.holder("k", idemkv.ModeLocal, false)
	st := &lostWatches{Store: v.e}
	c := call("k")
	var polls int
	c.After = func(time.Duration) <-chan time.Time {
		polls++
		if polls <= 3 {
			return nil // never: the watch ends the wait
		}
		require.NoError(t, v.e.Release(ctx, l, nil))
		ch := make(chan time.Time, 1)
		ch <- t0
		return ch
	}
	out, err := once.Do(ctx, st, c, func(context.Context, *once.Exec) (idemkv.Result, error) { return created, nil })
	require.NoError(t, err)
	assert.False(t, out.Replayed)
	assert.Equal(t, 4, st.watches, "a watch a wait")
	assert.Equal(t, 4, polls)
}

func TestInProgressWaitHonoursRetryAfter(t *testing.T) {
	v := newEnv(t, nil)
	l := v.holder("k", idemkv.ModeLocal, false)
	v.clock.Advance(lease - 2*time.Second) // the lease ends in 2 s
	w := &waits{then: []func(){func() { require.NoError(t, v.e.Release(ctx, l, nil)) }}}
	c := call("k")
	c.Poll, c.After = time.Minute, w.After
	out, err := once.Do(ctx, v.e, c, func(context.Context, *once.Exec) (idemkv.Result, error) { return created, nil })
	require.NoError(t, err)
	assert.False(t, out.Replayed, "the holder released: this call ran")
	assert.Equal(t, []time.Duration{2 * time.Second}, w.got, "the store's RetryAfter, sooner than Poll")
}

func TestInProgressNoWait(t *testing.T) {
	v := newEnv(t, nil)
	v.holder("k", idemkv.ModeLocal, false)
	c := call("k")
	c.NoWait = true
	c.After = func(time.Duration) <-chan time.Time { t.Fatal("NoWait must not wait"); return nil }
	_, err := once.Do(ctx, v.e, c, func(context.Context, *once.Exec) (idemkv.Result, error) { return created, nil })
	require.ErrorIs(t, err, once.ErrInProgress)
}

func TestInProgressContextEnds(t *testing.T) {
	v := newEnv(t, nil)
	v.holder("k", idemkv.ModeLocal, false)
	cctx, cancel := context.WithCancel(ctx)
	c := call("k")
	c.After = func(time.Duration) <-chan time.Time { cancel(); return nil } // never fires
	_, err := once.Do(cctx, v.e, c, func(context.Context, *once.Exec) (idemkv.Result, error) { return created, nil })
	require.ErrorIs(t, err, once.ErrInProgress)
	require.ErrorIs(t, err, context.Canceled)
}

func TestReconcilingAfterExpiredRemoteHolder(t *testing.T) {
	v := newEnv(t, nil)
	v.holder("k", idemkv.ModeRemote, false) // then crashes
	v.clock.Advance(lease + time.Second)
	fn := count(func(context.Context, *once.Exec) (idemkv.Result, error) { return created, nil })
	_, err := once.Do(ctx, v.e, remote("k"), fn.Func)
	require.ErrorIs(t, err, once.ErrReconciling)
	assert.Zero(t, fn.n())
}

func TestResumableTakeover(t *testing.T) {
	v := newEnv(t, nil)
	crashed := v.holder("k", idemkv.ModeRemote, true)
	v.clock.Advance(lease + time.Second)
	c := remote("k")
	c.Resumable = true
	out, err := once.Do(ctx, v.e, c, func(_ context.Context, x *once.Exec) (idemkv.Result, error) {
		assert.True(t, x.Lease.Takeover())
		assert.Equal(t, uint32(2), x.Lease.Attempt)
		assert.Equal(t, crashed.OperationID, x.Lease.OperationID, "the same operation, sent again")
		return created, nil
	})
	require.NoError(t, err)
	assert.Equal(t, crashed.OperationID, out.OperationID)
}

func TestRenew(t *testing.T) {
	v := newEnv(t, nil)
	c := remote("k")
	c.Lease = 10 * time.Second
	_, err := once.Do(ctx, v.e, c, func(ctx context.Context, x *once.Exec) (idemkv.Result, error) {
		now := v.clock.Advance(8 * time.Second) // a slow downstream
		if err := x.Renew(ctx); err != nil {
			return idemkv.Result{}, err
		}
		assert.Equal(t, now.Add(10*time.Second), x.Lease.Expires)
		v.clock.Advance(8 * time.Second) // past the first lease, within the renewed one
		cl, err := v.e.Claim(ctx, idemkv.ClaimRequest{ID: id("k"), Fingerprint: c.Fingerprint, Mode: idemkv.ModeRemote})
		require.NoError(t, err)
		assert.Equal(t, idemkv.InProgress, cl.Outcome, "renewed: nobody takes the key over")
		return created, nil
	})
	require.NoError(t, err)
	assert.Equal(t, idemkv.StateCompleted, v.state("k"))

	_, err = once.Do(ctx, v.e, call("local"), func(ctx context.Context, x *once.Exec) (idemkv.Result, error) {
		return idemkv.Result{}, x.Renew(ctx)
	})
	require.ErrorIs(t, err, idemkv.ErrInvalidArgument)
	assert.Zero(t, v.state("local"))
}

// TestSending: right before its call, a remote Func with most of its
// lease left writes nothing; one that stalled past half of it renews it,
// so that a reconciler that judged the record abandoned before settles
// nothing; and one whose record a reconciler settled meanwhile is told
// not to send.
func TestSending(t *testing.T) {
	v := newEnv(t, nil)
	c := remote("renewed")
	c.Lease = 10 * time.Second
	_, err := once.Do(ctx, v.e, c, func(ctx context.Context, x *once.Exec) (idemkv.Result, error) {
		first := x.Lease
		require.NoError(t, x.Sending(ctx))
		assert.Equal(t, first, x.Lease, "most of the lease left: no renewal")
		v.clock.Advance(12 * time.Second) // the process paused past the lease
		judged, err := v.e.Get(ctx, id("renewed"))
		require.NoError(t, err)
		require.NoError(t, x.Sending(ctx))
		assert.True(t, x.Lease.Expires.After(first.Expires), "renewed")
		v.clock.Advance(12 * time.Second)
		err = v.e.Resolve(ctx, idemkv.ResolveRequest{ID: judged.ID, Token: judged.Token, NoEffect: true, Since: judged.LeaseExpires})
		assert.ErrorIs(t, err, idemkv.ErrFenced, "an answer older than the call settles nothing")
		return created, nil
	})
	require.NoError(t, err, "no one took the key: the outcome is stored")
	assert.Equal(t, idemkv.StateCompleted, v.state("renewed"))

	c = remote("lost")
	c.Lease = 10 * time.Second
	sent := false
	_, err = once.Do(ctx, v.e, c, func(ctx context.Context, x *once.Exec) (idemkv.Result, error) {
		v.clock.Advance(12 * time.Second)
		rec, err := v.e.Get(ctx, id("lost"))
		require.NoError(t, err)
		require.NoError(t, v.e.Resolve(ctx, idemkv.ResolveRequest{ID: rec.ID, Token: rec.Token, NoEffect: true, Since: rec.LeaseExpires}))
		if err := x.Sending(ctx); err != nil {
			return idemkv.Result{}, err
		}
		sent = true
		return created, nil
	})
	assert.ErrorIs(t, err, idemkv.ErrFenced)
	assert.False(t, sent, "nothing sent")
}

func TestLocalLeaseLost(t *testing.T) {
	v := newEnv(t, nil)
	var other idemkv.Lease
	_, err := once.Do(ctx, v.e, call("k"), func(_ context.Context, x *once.Exec) (idemkv.Result, error) {
		if x.Run == 1 {
			v.clock.Advance(lease + time.Second) // too slow: another attempt takes the key over
			other = v.holder("k", idemkv.ModeLocal, false)
		}
		return idemkv.Result{}, x.Effects.Set([]byte("order/1"), []byte("stale"))
	})
	require.ErrorIs(t, err, idemkv.ErrFenced)
	assert.Empty(t, v.data("order/1"), "the stale holder's writes are fenced off with its result")
	require.NoError(t, v.e.Complete(ctx, other, created, nil), "the other attempt still holds the key")
}

func TestRemoteLeaseLost(t *testing.T) {
	v := newEnv(t, nil)
	_, err := once.Do(ctx, v.e, remote("k"), func(context.Context, *once.Exec) (idemkv.Result, error) {
		v.clock.Advance(lease + time.Second) // too slow, and not resumable
		_, err := once.Do(ctx, v.e, remote("k"), func(context.Context, *once.Exec) (idemkv.Result, error) {
			t.Error("a second attempt ran while the first may still act")
			return idemkv.Result{}, nil
		})
		require.ErrorIs(t, err, once.ErrReconciling, "the expired remote claim turned uncertain")
		return created, nil
	})
	require.ErrorIs(t, err, once.ErrUncertain)
	require.ErrorIs(t, err, idemkv.ErrFenced)
	assert.Equal(t, idemkv.StateUncertain, v.state("k"))
}

func TestInvalidCall(t *testing.T) {
	v := newEnv(t, nil)
	fn := count(func(context.Context, *once.Exec) (idemkv.Result, error) { return created, nil })
	_, err := once.Do(ctx, nil, call("k"), fn.Func)
	require.ErrorIs(t, err, idemkv.ErrInvalidArgument)
	_, err = once.Do(ctx, v.e, call("k"), nil)
	require.ErrorIs(t, err, idemkv.ErrInvalidArgument)
	_, err = once.Do(ctx, v.e, once.Call{ID: id("k")}, fn.Func)
	require.ErrorIs(t, err, idemkv.ErrInvalidFingerprint)
	bad := call("k")
	bad.ID.Key = "no\nnewlines"
	_, err = once.Do(ctx, v.e, bad, fn.Func)
	require.ErrorIs(t, err, idemkv.ErrInvalidKey)
	bad = call("k")
	bad.Retention = "no-such-class"
	_, err = once.Do(ctx, v.e, bad, fn.Func)
	require.ErrorIs(t, err, idemkv.ErrInvalidArgument, "the retention class reaches the store")
	bad = call("k")
	bad.Poll = -time.Second
	_, err = once.Do(ctx, v.e, bad, fn.Func)
	require.ErrorIs(t, err, idemkv.ErrInvalidArgument)
	assert.Zero(t, fn.n())
}

type codeErr struct{ code int }

func (e *codeErr) Error() string { return "psp: refused with code " + strconv.Itoa(e.code) }

func TestNoEffectMatching(t *testing.T) {
	assert.NoError(t, once.NoEffect(nil))
	err := fmt.Errorf("sending: %w", once.NoEffect(fmt.Errorf("%w: %w", errDeclined, &codeErr{code: 7})))
	assert.ErrorIs(t, err, once.ErrNoEffect)
	assert.ErrorIs(t, err, errDeclined)
	var ce *codeErr
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, 7, ce.code)
	assert.Equal(t, "sending: validation: amount missing: psp: refused with code 7", err.Error(), "the message is the wrapped error's")
	assert.ErrorIs(t, fmt.Errorf("%w: bad input", once.ErrNoEffect), once.ErrNoEffect)
}

// TestLocalConflictReRuns plays a conflict step by step: A reads the
// counter, B commits an increment, A's commit finds its read stale and
// runs again; its result (the counter it wrote) changes with it.
func TestLocalConflictReRuns(t *testing.T) {
	for _, tc := range []struct {
		name     string
		fallback bool
		slipIn   int   // the run of A during which B commits
		runs     []int // A's runs
	}{
		// 1 reads the counter and sets the result "1"; B commits; 1's
		// commit is refused; 2 re-reads, sets "2" and commits.
		{"setter", false, 1, []int{1, 2}},
		// 1 learns the result "1"; 2 offers it and is refused at commit
		// (B slipped in); 3 re-reads and computes "2"; 4 offers "2" and
		// commits.
		{"fallback", true, 2, []int{1, 2, 3, 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := newEnv(t, nil)
			st := v.store(tc.fallback)
			incr := func(x *once.Exec) (idemkv.Result, error) {
				if err := addTo(x.Effects, "counter", 1); err != nil {
					return idemkv.Result{}, err
				}
				b, err := x.Effects.Get([]byte("counter"))
				return idemkv.Result{Status: 200, Body: b}, err
			}
			var aRuns []int
			out, err := once.Do(ctx, st, call("a"), func(_ context.Context, x *once.Exec) (idemkv.Result, error) {
				aRuns = append(aRuns, x.Run)
				res, err := incr(x)
				if x.Run == tc.slipIn { // B slips in between A's read and its commit
					outB, errB := once.Do(ctx, st, call("b"), func(_ context.Context, x *once.Exec) (idemkv.Result, error) { return incr(x) })
					require.NoError(t, errB)
					assert.Equal(t, "1", string(outB.Result.Body))
				}
				return res, err
			})
			require.NoError(t, err)
			assert.Equal(t, "2", string(out.Result.Body), "A's stored result is that of the run that committed")
			assert.Equal(t, "2", v.data("counter"))
			assert.Equal(t, "2", string(v.record("a").Result.Body))
			assert.Equal(t, tc.runs, aRuns)
		})
	}
}

// TestConcurrentReadModifyWrite: concurrent Do calls on different keys
// increment one shared counter, each returning the value it wrote. Under
// contention a Do may fail with ErrConflict, having released its key and
// written nothing; the caller retries it, as a consumer would. In the end
// every operation applied exactly once, and the stored results are
// 1..N, each the value its own commit wrote. With a ResultSetter, every
// run of a function is a commit attempt: one that commits or one the
// engine counts as a conflict.
func TestConcurrentReadModifyWrite(t *testing.T) {
	for _, k := range storeKinds {
		t.Run(k.name, func(t *testing.T) { testConcurrentReadModifyWrite(t, k.fallback) })
	}
}

func testConcurrentReadModifyWrite(t *testing.T, fallback bool) {
	v := newEnv(t, nil)
	st := v.store(fallback)
	const workers, each = 8, 10
	var wg sync.WaitGroup
	var conflicts, calls, runs atomic.Int64
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				for {
					calls.Add(1)
					_, err := once.Do(ctx, st, call(fmt.Sprintf("w%d-%d", w, i)), func(_ context.Context, x *once.Exec) (idemkv.Result, error) {
						runs.Add(1)
						if err := addTo(x.Effects, "counter", 1); err != nil {
							return idemkv.Result{}, err
						}
						b, err := x.Effects.Get([]byte("counter"))
						return idemkv.Result{Status: 200, Body: b}, err
					})
					if errors.Is(err, idemkv.ErrConflict) {
						conflicts.Add(1)
						continue
					}
					if !assert.NoError(t, err) {
						return
					}
					break
				}
			}
		})
	}
	wg.Wait()
	storeConflicts := v.e.Counts().Conflicts
	t.Logf("%d Do calls, %d runs, %d store conflicts; %d calls failed with ErrConflict and were retried",
		calls.Load(), runs.Load(), storeConflicts, conflicts.Load())
	if !fallback {
		// A run either commits (a call that did not fail) or conflicts
		// (counted by the engine, the last of a failed call's too).
		assert.Equal(t, calls.Load()-conflicts.Load()+storeConflicts, runs.Load(), "one run per commit attempt")
	}
	seen := map[string]bool{}
	for w := range workers {
		for i := range each {
			rec := v.record(fmt.Sprintf("w%d-%d", w, i))
			r := string(rec.Result.Body)
			assert.False(t, seen[r], "two operations stored the same counter value %s", r)
			seen[r] = true
		}
	}
	for n := 1; n <= workers*each; n++ {
		assert.True(t, seen[strconv.Itoa(n)], "no operation stored %d", n)
	}
	assert.Equal(t, strconv.Itoa(workers*each), v.data("counter"))
}

// TestTwoConcurrentIncrements is the smallest case: two Do calls at once,
// the counter ends at 2.
func TestTwoConcurrentIncrements(t *testing.T) {
	v := newEnv(t, nil)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for _, key := range []string{"a", "b"} {
		wg.Go(func() {
			<-start
			_, err := once.Do(ctx, v.e, call(key), func(_ context.Context, x *once.Exec) (idemkv.Result, error) {
				return idemkv.Result{}, addTo(x.Effects, "counter", 1)
			})
			assert.NoError(t, err)
		})
	}
	close(start)
	wg.Wait()
	assert.Equal(t, "2", v.data("counter"))
}

// TestResultThatNeverSettles: a result that differs on every run (a clock
// reading, say) is stored at once where the commit takes it, and never
// matches the one offered in the fallback.
func TestResultThatNeverSettles(t *testing.T) {
	for _, k := range storeKinds {
		t.Run(k.name, func(t *testing.T) {
			v := newEnv(t, nil)
			fn := count(func(_ context.Context, x *once.Exec) (idemkv.Result, error) {
				return idemkv.Result{Status: 200, Body: []byte(strconv.Itoa(x.Run))}, x.Effects.Set([]byte("x"), []byte("y"))
			})
			out, err := once.Do(ctx, v.store(k.fallback), call("k"), fn.Func)
			if !k.fallback {
				require.NoError(t, err)
				assert.Equal(t, 1, fn.n())
				assert.Equal(t, "1", string(out.Result.Body))
				assert.Equal(t, "1", string(v.record("k").Result.Body))
				assert.Equal(t, "y", v.data("x"))
				return
			}
			require.ErrorIs(t, err, idemkv.ErrConflict)
			assert.Equal(t, 32, fn.n())
			assert.Zero(t, v.state("k"), "released")
			assert.Empty(t, v.data("x"))
		})
	}
}

// TestMain runs the suite on the engine, then on PostgreSQL (teststore).
func TestMain(m *testing.M) { teststore.Main(m) }

// ranOut is a store whose Complete, when the apply function fails,
// answers as pgstore does when a read of the function failed to
// serialize in every run it had: ErrConflict, not the function's error,
// which says only that its read failed.
type ranOut struct{ idemkv.Store }

func (s ranOut) Complete(ctx context.Context, l idemkv.Lease, r idemkv.Result, apply func(idemkv.Effects) error) error {
	if err := s.Store.Complete(ctx, l, r, apply); err != nil {
		return fmt.Errorf("%w: its transaction failed to serialize 16 times in a row", idemkv.ErrConflict)
	}
	return nil
}

// TestStoresConflictOutranksTheFunctionsError: when the store answers
// a failed run with its own error, Do returns the store's (ErrConflict:
// retry), not the function's, and gives the key back.
func TestStoresConflictOutranksTheFunctionsError(t *testing.T) {
	v := newEnv(t, nil)
	readFailed := errors.New("reading the counter: could not serialize access")
	_, err := once.Do(ctx, ranOut{v.e}, call("a"), func(context.Context, *once.Exec) (idemkv.Result, error) {
		return idemkv.Result{}, readFailed
	})
	require.ErrorIs(t, err, idemkv.ErrConflict)
	require.NotErrorIs(t, err, readFailed)
	assert.Zero(t, v.state("a"), "the key given back")
}
