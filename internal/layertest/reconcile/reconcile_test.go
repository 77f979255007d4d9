package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/internal/layertest/teststore"
	"github.com/idemkv/idemkv/reconcile"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var ctx = context.Background()

var t0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

const lease = 30 * time.Second

// env is a suite's store: the engine or PostgreSQL (teststore), with
// Record.Marked kept as the contract has it (markedStore).
type env struct {
	t     *testing.T
	dir   string
	clock *fakeclock.Clock
	e     *markedStore
	marks *marks
	old   bool // a store from before Marked existed
}

func newEnv(t *testing.T) *env {
	v := &env{t: t, dir: t.TempDir(), clock: fakeclock.New(t0)}
	v.open()
	t.Cleanup(func() { _ = v.e.Close() })
	return v
}

func (v *env) open() {
	if v.marks == nil {
		v.marks = newMarks()
	}
	v.e = &markedStore{Store: teststore.Open(v.t, v.dir, teststore.Options{Clock: v.clock, Lease: lease}),
		clock: v.clock, old: v.old, marks: v.marks}
}

func (v *env) reopen() {
	require.NoError(v.t, v.e.Close())
	v.open()
}

func id(key string) idemkv.ID {
	return idemkv.ID{Tenant: "acct_1", Endpoint: "POST /v1/payments", Key: key}
}

// remote claims key in remote mode.
func (v *env) remote(key string) idemkv.Lease {
	c, err := v.e.Claim(ctx, idemkv.ClaimRequest{ID: id(key), Fingerprint: []byte{1}, Mode: idemkv.ModeRemote})
	require.NoError(v.t, err)
	require.Equal(v.t, idemkv.Acquired, c.Outcome)
	return c.Lease
}

// uncertain claims key and marks it uncertain.
func (v *env) uncertain(key string) idemkv.Lease {
	l := v.remote(key)
	require.NoError(v.t, v.e.MarkUncertain(ctx, l, "timeout"))
	return l
}

// worker returns a worker on the store. A zero Grace means a second here,
// for the tests that are not about it, and the clock moves that second.
func (v *env) worker(r reconcile.Reconciler, o reconcile.Options) *reconcile.Worker {
	o.Clock = v.clock
	if o.Grace == 0 {
		o.Grace = time.Second
		v.clock.Advance(time.Second)
	}
	o.Rand = rand.New(rand.NewPCG(1, 2))
	w, err := reconcile.New(v.e, r, &o)
	require.NoError(v.t, err)
	return w
}

func (v *env) state(key string) (idemkv.Record, bool) {
	rec, err := v.e.Get(ctx, id(key))
	if errors.Is(err, idemkv.ErrNotFound) {
		return rec, false
	}
	require.NoError(v.t, err)
	return rec, true
}

func (v *env) requireSound() {
	teststore.RequireSound(v.t, v.e.Store)
}

// downstream is a scripted downstream: what became of each operation, by
// key, and how often it was asked.
type downstream struct {
	mu    sync.Mutex
	truth map[string]reconcile.Verdict
	asked map[string]int
}

func newDownstream() *downstream {
	return &downstream{truth: map[string]reconcile.Verdict{}, asked: map[string]int{}}
}

func (d *downstream) set(key string, v reconcile.Verdict) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.truth[key] = v
}

func (d *downstream) Reconcile(_ context.Context, rec idemkv.Record) (reconcile.Answer, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.asked[rec.ID.Key]++
	v := d.truth[rec.ID.Key]
	a := reconcile.Answer{Verdict: v, Reason: "processor has no answer"}
	if v == reconcile.Applied {
		a.Result = idemkv.Result{Status: 201, Pointer: "/v1/payments/" + rec.ID.Key}
		a.Apply = func(fx idemkv.Effects) error { return fx.Set([]byte("pay/"+rec.ID.Key), []byte("charged")) }
	}
	return a, nil
}

func (d *downstream) timesAsked(key string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.asked[key]
}

// TestSettlesUncertainAndAbandoned: an uncertain record the downstream
// applied completes with its result and effects; an abandoned one is left
// to its holder for its lease and the grace, then released as not
// applied, and a retry runs anew.
func TestSettlesUncertainAndAbandoned(t *testing.T) {
	v := newEnv(t)
	d := newDownstream()
	v.uncertain("charged")
	d.set("charged", reconcile.Applied)
	crashed := v.remote("crashed")
	d.set("crashed", reconcile.NotApplied)
	w := v.worker(d, reconcile.Options{Grace: 5 * time.Second})

	require.NoError(t, w.Pass(ctx))
	require.Zero(t, d.timesAsked("charged"), "the call that timed out may still be on its way")
	v.clock.Advance(5 * time.Second)
	require.NoError(t, w.Pass(ctx))
	rec, ok := v.state("charged")
	require.True(t, ok)
	require.Equal(t, idemkv.StateCompleted, rec.State)
	require.Equal(t, "/v1/payments/charged", rec.Result.Pointer)
	got, err := v.e.GetData(ctx, []byte("pay/charged"))
	require.NoError(t, err)
	require.Equal(t, "charged", string(got))
	require.Zero(t, d.timesAsked("crashed"), "its holder's lease is live")

	v.clock.Advance(lease - 5*time.Second)
	require.NoError(t, w.Pass(ctx))
	require.Zero(t, d.timesAsked("crashed"), "within the grace")
	v.clock.Advance(5 * time.Second)
	require.NoError(t, w.Pass(ctx))
	require.Equal(t, 1, d.timesAsked("crashed"))
	_, ok = v.state("crashed")
	require.False(t, ok, "not applied: released")
	require.ErrorIs(t, v.e.Complete(ctx, crashed, idemkv.Result{Status: 201}, nil), idemkv.ErrFenced,
		"the late holder is fenced off")
	retry := v.remote("crashed")
	require.Equal(t, uint32(1), retry.Attempt, "a retry runs anew")

	st := w.Stats()
	require.Equal(t, [3]int64{1, 1, 0}, [3]int64{st.Applied, st.NotApplied, st.Escalated})
	v.requireSound()
}

// TestUnknownBacksOffThenEscalates: Unknown answers are asked again only
// after the backoff, and the record is escalated after MaxAttempts: never
// asked again, listed apart, the hook called.
func TestUnknownBacksOffThenEscalates(t *testing.T) {
	v := newEnv(t)
	d := newDownstream()
	l := v.uncertain("k")
	var escalated []string
	w := v.worker(d, reconcile.Options{MinBackoff: time.Second, MaxBackoff: 4 * time.Second, MaxAttempts: 3,
		OnEscalate: func(rec idemkv.Record, note string) { escalated = append(escalated, rec.ID.Key+": "+note) }})

	require.NoError(t, w.Pass(ctx))
	require.NoError(t, w.Pass(ctx))
	require.Equal(t, 1, d.timesAsked("k"), "the second pass is within the backoff")
	v.clock.Advance(time.Second) // the first backoff is at most MinBackoff
	require.NoError(t, w.Pass(ctx))
	require.Equal(t, 2, d.timesAsked("k"))
	v.clock.Advance(2 * time.Second)
	require.NoError(t, w.Pass(ctx))
	require.Equal(t, 3, d.timesAsked("k"))
	require.Equal(t, []string{"k: reconciliation gave up after 3 attempts: processor has no answer"}, escalated)

	rec, ok := v.state("k")
	require.True(t, ok)
	require.True(t, rec.Escalated)
	require.Equal(t, l.Token, rec.Token)
	page, err := v.e.List(ctx, idemkv.ListRequest{Escalated: true})
	require.NoError(t, err)
	require.Len(t, page.Records, 1)
	v.clock.Advance(time.Hour)
	require.NoError(t, w.Pass(ctx))
	require.Equal(t, 3, d.timesAsked("k"), "an escalated record is never asked again")
	c, err := v.e.Claim(ctx, idemkv.ClaimRequest{ID: id("k"), Fingerprint: []byte{1}, Mode: idemkv.ModeRemote, Resumable: true})
	require.NoError(t, err)
	require.Equal(t, idemkv.Reconciling, c.Outcome, "nor re-run")
	esc, err := v.e.List(ctx, idemkv.ListRequest{Escalated: true})
	require.NoError(t, err)
	require.Len(t, esc.Records, 1)
	v.requireSound()
}

// TestApplyErrorIsNotALostRecord: an Answer whose Apply fails with an
// error that wraps ErrNotFound (a read of its own that found nothing) is
// an answer that could not be stored, backed off and in the end
// escalated, not a record another settled meanwhile.
func TestApplyErrorIsNotALostRecord(t *testing.T) {
	v := newEnv(t)
	v.uncertain("k")
	asked := 0
	w := v.worker(reconcile.ReconcilerFunc(func(context.Context, idemkv.Record) (reconcile.Answer, error) {
		asked++
		return reconcile.Answer{Verdict: reconcile.Applied, Result: idemkv.Result{Status: 200},
			Apply: func(fx idemkv.Effects) error {
				_, err := fx.Get([]byte("intent/k"))
				return fmt.Errorf("read intent: %w", err)
			}}, nil
	}), reconcile.Options{MinBackoff: time.Second, MaxBackoff: time.Second, MaxAttempts: 3})
	for range 6 {
		require.NoError(t, w.Pass(ctx))
		v.clock.Advance(time.Second)
	}
	require.Equal(t, 3, asked, "asked after each backoff, and no more once escalated")
	require.Zero(t, w.Stats().Lost)
	rec, ok := v.state("k")
	require.True(t, ok)
	require.True(t, rec.Escalated)
}

// TestAnswerOlderThanTheAttemptNeverSettles: a pass lists an abandoned
// record as due; while its question is out, the stalled holder wakes,
// renews its lease, sends its call, times out and marks the record
// uncertain. The downstream had not seen that call when it answered
// "not applied", and the store refuses to settle on that answer
// (ResolveRequest.Since): the record stays, for a later question.
func TestAnswerOlderThanTheAttemptNeverSettles(t *testing.T) {
	v := newEnv(t)
	l := v.remote("k")
	v.clock.Advance(lease + time.Second) // abandoned
	w := v.worker(reconcile.ReconcilerFunc(func(ctx context.Context, rec idemkv.Record) (reconcile.Answer, error) {
		l2, err := v.e.Renew(ctx, l, lease)
		if err == nil {
			err = v.e.MarkUncertain(ctx, l2, "the call timed out")
		}
		assert.NoError(t, err, "the holder wakes")
		return reconcile.Answer{Verdict: reconcile.NotApplied}, nil
	}), reconcile.Options{})
	require.NoError(t, w.Pass(ctx))
	rec, ok := v.state("k")
	require.True(t, ok, "not removed on an answer older than the holder's call")
	require.Equal(t, idemkv.StateUncertain, rec.State)
	require.Zero(t, w.Stats().NotApplied)
}

// TestGivingUpNeverFencesAnAttemptThatWoke: as above, but the answer is
// Unknown and it is the last attempt. The store refuses the escalation
// decided from the record as listed (EscalateRequest.Since): the holder's
// call is newer than every question asked, and its record is asked about
// afresh rather than left to an operator.
func TestGivingUpNeverFencesAnAttemptThatWoke(t *testing.T) {
	v := newEnv(t)
	d := newDownstream()
	l := v.remote("k")
	v.clock.Advance(lease + time.Second) // abandoned
	woke := false
	w := v.worker(reconcile.ReconcilerFunc(func(ctx context.Context, rec idemkv.Record) (reconcile.Answer, error) {
		if !woke {
			woke = true
			l2, err := v.e.Renew(ctx, l, lease)
			if err == nil {
				err = v.e.MarkUncertain(ctx, l2, "the call timed out")
			}
			assert.NoError(t, err, "the holder wakes")
		}
		return d.Reconcile(ctx, rec)
	}), reconcile.Options{MaxAttempts: 1})
	require.NoError(t, w.Pass(ctx))
	rec, ok := v.state("k")
	require.True(t, ok)
	require.Equal(t, idemkv.StateUncertain, rec.State)
	require.False(t, rec.Escalated, "escalated on a question older than the holder's call")
	require.Zero(t, w.Stats().Escalated)

	d.set("k", reconcile.Applied)
	v.clock.Advance(time.Minute)
	require.NoError(t, w.Pass(ctx))
	rec, ok = v.state("k")
	require.True(t, ok)
	require.Equal(t, idemkv.StateCompleted, rec.State, "asked again about the holder's call")
}

// TestDueTellsWhenTheNextQuestionIs: Due names the moment from which a
// pass asks about a record, after its grace and after each Unknown
// answer's backoff: a pass just before it does not ask, a pass at it does.
func TestDueTellsWhenTheNextQuestionIs(t *testing.T) {
	v := newEnv(t)
	d := newDownstream()
	v.uncertain("k")
	w := v.worker(d, reconcile.Options{Grace: 5 * time.Second, MinBackoff: 2 * time.Second, MaxBackoff: 8 * time.Second, MaxAttempts: 5})
	for asked := 1; asked <= 3; asked++ {
		rec, ok := v.state("k")
		require.True(t, ok)
		at, attempts, asks := w.Due(rec)
		require.True(t, asks)
		require.Equal(t, asked-1, attempts)
		require.True(t, at.After(v.clock.Now()), "due %v, now %v", at, v.clock.Now())
		v.clock.Advance(at.Sub(v.clock.Now()) - time.Millisecond)
		require.NoError(t, w.Pass(ctx))
		require.Equal(t, asked-1, d.timesAsked("k"), "a pass before the record is due")
		v.clock.Advance(time.Millisecond)
		require.NoError(t, w.Pass(ctx))
		require.Equal(t, asked, d.timesAsked("k"), "a pass when the record is due")
	}
}

// TestMaxAgeEscalates: a record older than MaxAge is escalated without
// asking.
func TestMaxAgeEscalates(t *testing.T) {
	v := newEnv(t)
	d := newDownstream()
	v.uncertain("old")
	v.clock.Advance(2 * time.Hour)
	w := v.worker(d, reconcile.Options{MaxAge: time.Hour})
	require.NoError(t, w.Pass(ctx))
	require.Zero(t, d.timesAsked("old"))
	rec, _ := v.state("old")
	require.True(t, rec.Escalated)
	require.Contains(t, rec.Note, "past the reconciler's limit of 1h0m0s")
}

// TestBadReconcilersNeverSettle: a reconciler that errs, panics, hangs,
// answers a verdict out of range, a result the store refuses or an Apply
// that fails settles nothing, and the worker goes on to the next record.
func TestBadReconcilersNeverSettle(t *testing.T) {
	v := newEnv(t)
	bad := map[string]reconcile.ReconcilerFunc{
		"errs": func(context.Context, idemkv.Record) (reconcile.Answer, error) {
			return reconcile.Answer{Verdict: reconcile.Applied}, errors.New("processor said 500")
		},
		"panics": func(context.Context, idemkv.Record) (reconcile.Answer, error) { panic("boom") },
		"hangs": func(ctx context.Context, _ idemkv.Record) (reconcile.Answer, error) {
			<-ctx.Done()
			return reconcile.Answer{Verdict: reconcile.Applied}, nil
		},
		"verdict": func(context.Context, idemkv.Record) (reconcile.Answer, error) {
			return reconcile.Answer{Verdict: 7}, nil
		},
		"result": func(context.Context, idemkv.Record) (reconcile.Answer, error) {
			return reconcile.Answer{Verdict: reconcile.Applied, Result: idemkv.Result{Status: 70000}}, nil
		},
		"apply": func(context.Context, idemkv.Record) (reconcile.Answer, error) {
			return reconcile.Answer{Verdict: reconcile.Applied, Result: idemkv.Result{Status: 201},
				Apply: func(idemkv.Effects) error { return errors.New("ledger refused") }}, nil
		},
	}
	for key := range bad {
		v.uncertain(key)
	}
	v.uncertain("good")
	var goodAsked atomic.Int32
	r := reconcile.ReconcilerFunc(func(ctx context.Context, rec idemkv.Record) (reconcile.Answer, error) {
		if f, ok := bad[rec.ID.Key]; ok {
			return f(ctx, rec)
		}
		goodAsked.Add(1)
		return reconcile.Answer{Verdict: reconcile.NotApplied}, nil
	})
	w := v.worker(r, reconcile.Options{Timeout: 20 * time.Millisecond, Concurrency: 2})
	require.NoError(t, w.Pass(ctx))
	for key := range bad {
		rec, ok := v.state(key)
		require.True(t, ok, key)
		require.Equal(t, idemkv.StateUncertain, rec.State, key)
		require.False(t, rec.Escalated, key)
	}
	_, ok := v.state("good")
	require.False(t, ok, "the worker went on to the good record")
	st := w.Stats()
	require.Equal(t, int64(len(bad)), st.Unknown)
	require.Equal(t, int64(len(bad)), st.Errors)
	require.Equal(t, int64(1), st.Panics, "the reconciler that panicked")
	require.Equal(t, int64(1), st.NotApplied)
	v.requireSound()
}

// TestWorkersNeverBothSettle: two workers make passes at once over the
// same records, with holders completing some of them late: each record
// is settled once, by one of them, and the losers count their losses.
func TestWorkersNeverBothSettle(t *testing.T) {
	v := newEnv(t)
	d := newDownstream()
	const n = 60
	var late []idemkv.Lease
	for i := range n {
		key := string(rune('a'+i%26)) + string(rune('a'+i/26))
		if i%3 == 0 {
			late = append(late, v.remote(key)) // abandoned, but its holder comes back
		} else {
			v.uncertain(key)
		}
		d.set(key, reconcile.Applied)
	}
	v.clock.Advance(time.Hour)
	w1 := v.worker(d, reconcile.Options{Concurrency: 3})
	w2 := v.worker(d, reconcile.Options{Concurrency: 3})
	var wg sync.WaitGroup
	var holderWins atomic.Int64
	for _, f := range []func(){
		func() { require.NoError(t, w1.Pass(ctx)) },
		func() { require.NoError(t, w2.Pass(ctx)) },
		func() {
			for _, l := range late {
				if v.e.Complete(ctx, l, idemkv.Result{Status: 201, Pointer: "holder"}, nil) == nil {
					holderWins.Add(1)
				}
			}
		},
	} {
		wg.Add(1)
		go func() { defer wg.Done(); f() }()
	}
	wg.Wait()
	s1, s2 := w1.Stats(), w2.Stats()
	require.Equal(t, int64(n), s1.Applied+s2.Applied+holderWins.Load(), "each record settled exactly once")
	for i := range n {
		key := string(rune('a'+i%26)) + string(rune('a'+i/26))
		rec, ok := v.state(key)
		require.True(t, ok)
		require.Equal(t, idemkv.StateCompleted, rec.State, key)
	}
	v.requireSound()
}

func TestBadOptions(t *testing.T) {
	v := newEnv(t)
	d := newDownstream()
	for _, o := range []reconcile.Options{{Interval: -1}, {MaxAge: -1}, {Timeout: -1}, {Grace: -1},
		{MinBackoff: 2 * time.Second, MaxBackoff: time.Second}} {
		_, err := reconcile.New(v.e, d, &o)
		require.ErrorIs(t, err, idemkv.ErrInvalidArgument, "%+v", o)
	}
	_, err := reconcile.New(nil, d, nil)
	require.Error(t, err)
}

// TestEveryRecordIsReached: with more records ahead of it than a pass
// reads, all of them skipped, a record is still reached by a later pass.
func TestEveryRecordIsReached(t *testing.T) {
	v := newEnv(t)
	d := newDownstream()
	for i := range 5 {
		v.uncertain(fmt.Sprintf("skipped-%d", i))
	}
	v.clock.Advance(time.Second)
	v.uncertain("wanted")
	d.set("wanted", reconcile.Applied)
	w := v.worker(d, reconcile.Options{PerPass: 2, Handles: func(rec idemkv.Record) bool { return rec.ID.Key == "wanted" }})
	for range 3 {
		require.NoError(t, w.Pass(ctx))
	}
	rec, ok := v.state("wanted")
	require.True(t, ok)
	assert.Equal(t, idemkv.StateCompleted, rec.State)
}

// TestMain runs the suite on the engine, then on PostgreSQL (teststore).
func TestMain(m *testing.M) { teststore.Main(m) }
