package saga_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/internal/layertest/teststore"
	"github.com/idemkv/idemkv/reconcile"
	"github.com/idemkv/idemkv/saga"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var ctx = context.Background()

var t0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

const lease = 30 * time.Second

// shop is the guide's order saga against a real engine: reserve stock
// (local), authorize a card (remote), confirm the order (local), capture
// (remote). Its processor deduplicates on the key it is sent, and its
// faults are scripted per action.
type shop struct {
	t     *testing.T
	dir   string
	clock *fakeclock.Clock
	e     teststore.Store

	mu     sync.Mutex
	faults map[string][]error     // per action ("authorize", "void", ...), consumed in order
	calls  map[string]int         // Do/Undo calls per action
	ledger map[string]string      // processor: key -> what was done
	block  map[string]chan func() // per action: the Do waits for a function to run, then runs it
}

func newShop(t *testing.T) *shop {
	s := &shop{t: t, dir: t.TempDir(), clock: fakeclock.New(t0), faults: map[string][]error{},
		calls: map[string]int{}, ledger: map[string]string{}, block: map[string]chan func(){}}
	s.open()
	t.Cleanup(func() { _ = s.e.Close() })
	return s
}

func (s *shop) open() {
	s.e = teststore.Open(s.t, s.dir, teststore.Options{Clock: s.clock, Lease: lease})
}

func (s *shop) reopen() {
	require.NoError(s.t, s.e.Close())
	s.open()
}

// Faults that are not errors: a bug in the step's code.
var (
	// errPanicNow: the action panics before it does anything.
	errPanicNow = errors.New("panic now")
	// errPanicAfterCall: a remote action's call lands, then the code that
	// reads its answer panics.
	errPanicAfterCall = errors.New("panic after the call")
	// errCallLost: a remote action times out, and its call never landed.
	errCallLost = fmt.Errorf("%w: the request was lost", saga.ErrUnknown)
)

// act counts a call of action and returns its scripted fault, or panics
// for errPanicNow.
func (s *shop) act(action string) error {
	s.mu.Lock()
	s.calls[action]++
	var err error
	if f := s.faults[action]; len(f) > 0 {
		err, s.faults[action] = f[0], f[1:]
	}
	ch := s.block[action]
	s.mu.Unlock()
	if ch != nil {
		(<-ch)()
	}
	if err == errPanicNow {
		panic(action + ": nil map")
	}
	return err
}

func (s *shop) charge(key, what string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.ledger[key]; !dup {
		s.ledger[key] = what
	}
}

func (s *shop) count(action string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[action]
}

func (s *shop) definition() saga.Definition {
	local := func(name, stockDelta string) func(ctx context.Context, x *saga.Exec) ([]byte, error) {
		return func(_ context.Context, x *saga.Exec) ([]byte, error) {
			if err := s.act(name); err != nil {
				return nil, err
			}
			return []byte(name + " ok"), x.Effects.Set([]byte("order/"+x.ID+"/"+name), []byte(stockDelta))
		}
	}
	remote := func(name string) func(ctx context.Context, x *saga.Exec) ([]byte, error) {
		return func(_ context.Context, x *saga.Exec) ([]byte, error) {
			err := s.act(name)
			if err == nil || (errors.Is(err, saga.ErrUnknown) && err != errCallLost) || err == errPanicAfterCall { // a timeout: the call landed
				s.charge(x.Key, name)
			}
			if err == errPanicAfterCall {
				panic(name + ": unreadable answer")
			}
			if err != nil {
				return nil, err
			}
			return []byte("auth_" + x.Key[:8]), nil
		}
	}
	return saga.Definition{Name: "order", Steps: []saga.Step{
		{Name: "reserve", Do: local("reserve", "-1"), Undo: func(_ context.Context, x *saga.Exec) error {
			if err := s.act("unreserve"); err != nil {
				return err
			}
			return x.Effects.Set([]byte("order/"+x.ID+"/reserve"), []byte("released"))
		}},
		{Name: "authorize", Remote: true, Do: remote("authorize"), Undo: func(_ context.Context, x *saga.Exec) error {
			if err := s.act("void"); err != nil {
				return err
			}
			s.charge(x.Key, "void")
			return nil
		}},
		{Name: "confirm", Do: local("confirm", "confirmed")},
		{Name: "capture", Remote: true, Do: remote("capture")},
	}}
}

func (s *shop) runner() *saga.Runner {
	r, err := saga.New(s.e, s.definition(), &saga.Options{Lease: lease, MaxAttempts: 3,
		After: func(time.Duration) <-chan time.Time { return closedTime }})
	require.NoError(s.t, err)
	return r
}

// closedTime never makes a test wait for a backoff.
var closedTime = func() <-chan time.Time {
	ch := make(chan time.Time)
	close(ch)
	return ch
}()

func (s *shop) data(key string) string {
	v, err := s.e.GetData(ctx, []byte(key))
	if errors.Is(err, idemkv.ErrNotFound) {
		return ""
	}
	require.NoError(s.t, err)
	return string(v)
}

func (s *shop) requireSound() {
	teststore.RequireSound(s.t, s.e)
}

func TestSagaCompletes(t *testing.T) {
	s := newShop(t)
	r := s.runner()
	st, err := r.Start(ctx, "acct_1", "o1", []byte(`{"sku":"pen"}`))
	require.NoError(t, err)
	assert.Equal(t, saga.Completed, st.Phase)
	assert.Equal(t, "reserve ok", string(st.Outputs["reserve"]))
	assert.Equal(t, "-1", s.data("order/o1/reserve"))
	assert.Equal(t, "confirmed", s.data("order/o1/confirm"))
	assert.Len(t, s.ledger, 2, "authorize and capture, each under its own key")

	again, err := r.Start(ctx, "acct_1", "o1", []byte(`{"sku":"pen"}`))
	require.NoError(t, err)
	assert.Equal(t, saga.Completed, again.Phase)
	assert.Equal(t, 1, s.count("authorize"), "a finished saga runs nothing again")
	_, err = r.Start(ctx, "acct_1", "o1", []byte(`{"sku":"ink"}`))
	assert.ErrorIs(t, err, saga.ErrMismatch)
	s.requireSound()
}

// TestDeclinedAuthorizationReleasesTheReservation: a permanent failure
// undoes the steps before it, in reverse, and the saga ends compensated.
func TestDeclinedAuthorizationReleasesTheReservation(t *testing.T) {
	s := newShop(t)
	s.faults["authorize"] = []error{errors.Join(saga.ErrPermanent, errors.New("card declined"))}
	r := s.runner()
	st, err := r.Start(ctx, "acct_1", "o2", nil)
	require.NoError(t, err)
	assert.Equal(t, saga.Compensated, st.Phase)
	assert.Contains(t, st.Failure, "card declined")
	assert.Equal(t, "released", s.data("order/o2/reserve"))
	assert.Zero(t, s.count("void"), "the failed step itself is not undone")
	assert.Zero(t, s.count("confirm"))
	got, err := r.Status(ctx, "acct_1", "o2")
	require.NoError(t, err)
	assert.Equal(t, saga.Compensated, got.Phase)
	s.requireSound()
}

// TestTransientFailuresAreRetriedThenFailTheSaga: a step that keeps
// failing transiently is tried MaxAttempts times, then fails the saga.
func TestTransientFailuresAreRetriedThenFailTheSaga(t *testing.T) {
	s := newShop(t)
	busy := errors.New("processor busy")
	s.faults["capture"] = []error{busy, busy}
	st, err := s.runner().Start(ctx, "acct_1", "o3", nil)
	require.NoError(t, err)
	assert.Equal(t, saga.Completed, st.Phase, "the third try succeeds")
	assert.Equal(t, 3, s.count("capture"))
	assert.Len(t, s.ledger, 2, "one capture, under one key")

	s.faults["capture"] = []error{busy, busy, busy}
	st, err = s.runner().Start(ctx, "acct_1", "o4", nil)
	require.NoError(t, err)
	assert.Equal(t, saga.Compensated, st.Phase)
	assert.Contains(t, st.Failure, "gave up after 3 attempts")
	assert.Equal(t, 1, s.count("void"), "the authorization is voided")
	assert.Equal(t, "released", s.data("order/o4/reserve"))
}

// TestUnknownAuthorizationIsReconciledToSuccess: an authorization whose
// answer is lost leaves the saga waiting at "authorize"; a reconciler
// asks the processor under the step's key, settles the step, and the
// resumed saga completes, authorized once.
func TestUnknownAuthorizationIsReconciledToSuccess(t *testing.T) {
	s := newShop(t)
	s.faults["authorize"] = []error{saga.ErrUnknown}
	r := s.runner()
	st, err := r.Start(ctx, "acct_1", "o5", nil)
	require.NoError(t, err)
	assert.Equal(t, saga.Waiting, st.Phase)
	assert.Equal(t, "authorize", st.Step)
	got, err := r.Status(ctx, "acct_1", "o5")
	require.NoError(t, err)
	assert.Equal(t, saga.Status{Phase: saga.Waiting, Step: "authorize", Outputs: map[string][]byte{"reserve": []byte("reserve ok")}}, got)

	w, err := reconcile.New(s.e, reconcile.ReconcilerFunc(func(ctx context.Context, rec idemkv.Record) (reconcile.Answer, error) {
		a, ok, err := r.ActionOf(ctx, rec)
		if err != nil || !ok {
			return reconcile.Answer{}, err
		}
		s.mu.Lock()
		_, found := s.ledger[a.Key]
		s.mu.Unlock()
		if !found {
			return reconcile.Answer{Verdict: reconcile.NotApplied}, nil
		}
		return reconcile.Answer{Verdict: reconcile.Applied, Result: saga.Done([]byte("auth_" + a.Key[:8]))}, nil
	}), &reconcile.Options{Clock: s.clock, Grace: time.Second, Handles: func(rec idemkv.Record) bool { return !r.Owns(rec) }})
	require.NoError(t, err)
	require.NoError(t, w.Pass(ctx))
	require.Zero(t, w.Stats().Asked, "within the grace: the call that timed out may still land")
	s.clock.Advance(time.Second) // the grace: the call that timed out has ended
	require.NoError(t, w.Pass(ctx))
	require.Equal(t, int64(1), w.Stats().Applied, "the step, not the saga record")

	s.clock.Advance(lease - time.Second) // the runner that stopped to wait let its lease run out
	n, err := r.Resume(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	got, err = r.Status(ctx, "acct_1", "o5")
	require.NoError(t, err)
	assert.Equal(t, saga.Completed, got.Phase)
	assert.Equal(t, 1, s.count("authorize"))
	assert.Len(t, s.ledger, 2)
	s.requireSound()
}

// TestCrashedRunnerIsResumedWhereItStopped: a runner stops in the middle of
// "confirm" (its context ends) and the process restarts; after the lease,
// Resume on the new process goes on from the last recovery point, running
// nothing twice.
func TestCrashedRunnerIsResumedWhereItStopped(t *testing.T) {
	s := newShop(t)
	stop, cancel := context.WithCancel(ctx)
	s.block["confirm"] = make(chan func(), 1)
	s.block["confirm"] <- cancel // the process goes down in the middle of it
	s.faults["confirm"] = []error{context.Canceled}
	_, err := s.runner().Start(stop, "acct_1", "o6", []byte("input"))
	require.ErrorIs(t, err, context.Canceled)
	delete(s.block, "confirm")

	s.reopen()
	r := s.runner()
	n, err := r.Resume(ctx)
	require.NoError(t, err)
	assert.Zero(t, n, "its lease is live")
	st, err := r.Status(ctx, "acct_1", "o6")
	require.NoError(t, err)
	assert.Equal(t, saga.Running, st.Phase)
	assert.Equal(t, "confirm", st.Step)

	s.clock.Advance(lease)
	n, err = r.Resume(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	st, err = r.Status(ctx, "acct_1", "o6")
	require.NoError(t, err)
	assert.Equal(t, saga.Completed, st.Phase)
	for action, want := range map[string]int{"reserve": 1, "authorize": 1, "confirm": 2, "capture": 1} {
		assert.Equal(t, want, s.count(action), action)
	}
	assert.Equal(t, "confirmed", s.data("order/o6/confirm"))
	s.requireSound()
}

// TestOneRunnerAtATime: while a runner holds a saga, another's Start
// answers Running and its Resume leaves it; once the first runner's lease
// has run out and the second has taken the saga over, the first is fenced
// at its next action.
func TestOneRunnerAtATime(t *testing.T) {
	s := newShop(t)
	a, b := s.runner(), s.runner()
	release := make(chan func())
	s.block["authorize"] = release
	done := make(chan error, 1)
	go func() {
		_, err := a.Start(ctx, "acct_1", "o7", nil)
		done <- err
	}()
	// a is inside authorize. b may not run the saga.
	release <- func() {
		st, err := b.Start(ctx, "acct_1", "o7", nil)
		require.NoError(t, err)
		assert.Equal(t, saga.Running, st.Phase)
		n, err := b.Resume(ctx)
		require.NoError(t, err)
		assert.Zero(t, n)
		// a stalls past its lease; b takes the saga over.
		s.mu.Lock()
		delete(s.block, "authorize")
		s.mu.Unlock()
		s.clock.Advance(lease)
		st, err = b.Start(ctx, "acct_1", "o7", nil)
		require.NoError(t, err)
		assert.Equal(t, saga.Completed, st.Phase)
	}
	err := <-done
	require.ErrorIs(t, err, idemkv.ErrFenced, "a lost the saga")
	assert.Equal(t, 2, s.count("authorize"), "a's stalled call and b's retry of it")
	assert.Len(t, s.ledger, 2, "under one key: authorized once")
	assert.Equal(t, 1, s.count("confirm"))
	s.requireSound()
}

// TestFailingUndoIsEscalated: an undo that keeps failing escalates; the
// saga stops there until an operator settles the undo's record, and then
// ends compensated.
func TestFailingUndoIsEscalated(t *testing.T) {
	s := newShop(t)
	s.faults["capture"] = []error{saga.ErrPermanent}
	down := errors.New("processor down")
	s.faults["void"] = []error{down, down, down}
	r := s.runner()
	st, err := r.Start(ctx, "acct_1", "o8", nil)
	require.NoError(t, err)
	assert.Equal(t, saga.Escalated, st.Phase)
	assert.Equal(t, "authorize", st.Step)
	assert.True(t, st.Compensating)
	page, err := s.e.List(ctx, idemkv.ListRequest{Escalated: true})
	require.NoError(t, err)
	require.Len(t, page.Records, 1)
	undo := page.Records[0]
	assert.Equal(t, "saga/order/undo/authorize", undo.ID.Endpoint)
	assert.Contains(t, undo.Note, "processor down")

	require.NoError(t, s.e.Resolve(ctx, idemkv.ResolveRequest{ID: undo.ID, Token: undo.Token, Result: idemkv.Result{Status: 422}, // any status settles an undo
		Note: "ops: voided by hand at the processor"}))
	s.clock.Advance(lease)
	n, err := r.Resume(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	st, err = r.Status(ctx, "acct_1", "o8")
	require.NoError(t, err)
	assert.Equal(t, saga.Compensated, st.Phase)
	assert.Equal(t, "released", s.data("order/o8/reserve"))
	s.requireSound()
}

func TestBadDefinitions(t *testing.T) {
	s := newShop(t)
	do := func(context.Context, *saga.Exec) ([]byte, error) { return nil, nil }
	for i, def := range []saga.Definition{
		{Name: "", Steps: []saga.Step{{Name: "a", Do: do}}},
		{Name: "x/y", Steps: []saga.Step{{Name: "a", Do: do}}},
		{Name: "x"},
		{Name: "x", Steps: []saga.Step{{Name: "a", Do: do}, {Name: "a", Do: do}}},
		{Name: "x", Steps: []saga.Step{{Name: "a"}}},
	} {
		_, err := saga.New(s.e, def, nil)
		assert.ErrorIs(t, err, idemkv.ErrInvalidArgument, strconv.Itoa(i))
	}
	def := saga.Definition{Name: "x", Steps: []saga.Step{{Name: "a", Do: do}}}
	for _, o := range []saga.Options{{MinBackoff: time.Second, MaxBackoff: time.Millisecond}, {MaxAttempts: -1},
		{Lease: -time.Second}, {MinBackoff: -1}, {MaxBackoff: -1}} {
		_, err := saga.New(s.e, def, &o)
		assert.ErrorIs(t, err, idemkv.ErrInvalidArgument, "%+v", o)
	}
	_, err := s.runner().Status(ctx, "acct_1", "never")
	assert.ErrorIs(t, err, saga.ErrNotFound)
}

// TestTakenOverRemoteStepIsNeverFailedBlind: a runner that took a remote
// step over from a crashed one, and then fails it transiently every time,
// does not fail the step (the first runner's call may have landed): the
// step waits for the reconciler.
func TestTakenOverRemoteStepIsNeverFailedBlind(t *testing.T) {
	s := newShop(t)
	a, b := s.runner(), s.runner()
	stuck := make(chan func())
	s.block["authorize"] = stuck
	done := make(chan error, 1)
	go func() {
		_, err := a.Start(ctx, "acct_1", "o9", nil)
		done <- err
	}()
	busy := errors.New("processor busy")
	stuck <- func() { // a is inside authorize, and stalls past its lease
		s.mu.Lock()
		delete(s.block, "authorize")
		s.faults["authorize"] = []error{busy, busy, busy}
		s.mu.Unlock()
		s.clock.Advance(lease)
		n, err := b.Resume(ctx)
		require.NoError(t, err)
		assert.Equal(t, 1, n)
		st, err := b.Status(ctx, "acct_1", "o9")
		require.NoError(t, err)
		assert.Equal(t, saga.Waiting, st.Phase, "out of tries after a takeover: unknown, not failed")
		assert.Equal(t, "authorize", st.Step)
		assert.Zero(t, s.count("unreserve"), "nothing is compensated on a guess")
	}
	<-done
}

// TestTakenOverRemoteStepIsNotGivenUpOnCancel: a runner that took a
// remote step over and is stopped during a backoff does not give the
// step up (its record would then be claimed afresh, and the next runner,
// no longer taking over, could fail it blind while the first runner's
// call had landed): it marks the step uncertain, and the runners after
// it wait for the reconciler.
func TestTakenOverRemoteStepIsNotGivenUpOnCancel(t *testing.T) {
	s := newShop(t)
	a := s.runner()
	stuck := make(chan func())
	s.block["authorize"] = stuck
	done := make(chan struct{})
	go func() { // the checks below run in it, inside a's step
		defer close(done) // also when a check stops it
		_, _ = a.Start(ctx, "acct_1", "o10", nil)
	}()
	busy := errors.New("processor busy")
	stuck <- func() { // a's call has landed; a stalls past its lease
		s.mu.Lock()
		delete(s.block, "authorize")
		s.faults["authorize"] = []error{busy}
		s.mu.Unlock()
		s.clock.Advance(lease)
		bctx, cancel := context.WithCancel(ctx)
		b, err := saga.New(s.e, s.definition(), &saga.Options{Lease: lease, MaxAttempts: 3,
			After: func(time.Duration) <-chan time.Time { cancel(); return make(chan time.Time) }})
		require.NoError(t, err)
		_, err = b.Start(bctx, "acct_1", "o10", nil) // the client hangs up during b's backoff
		require.ErrorIs(t, err, context.Canceled)
		rec, err := s.e.Get(ctx, idemkv.ID{Tenant: "acct_1", Endpoint: "saga/order/do/authorize", Key: "o10"})
		require.NoError(t, err, "the step's record is kept")
		assert.Equal(t, idemkv.StateUncertain, rec.State)

		s.clock.Advance(lease)
		s.mu.Lock()
		s.faults["authorize"] = []error{busy, busy, busy}
		s.mu.Unlock()
		c := s.runner()
		_, err = c.Resume(ctx)
		require.NoError(t, err)
		st, err := c.Status(ctx, "acct_1", "o10")
		require.NoError(t, err)
		assert.Equal(t, saga.Waiting, st.Phase, "the step's outcome is the reconciler's to find")
		assert.Zero(t, s.count("unreserve"), "nothing is compensated on a guess")
	}
	<-done
}

// listThen is a store whose List calls then after it has read its page:
// what happens between a Resume's listing and its claims.
type listThen struct {
	teststore.Store
	then func()
}

func (l listThen) List(ctx context.Context, req idemkv.ListRequest) (idemkv.ListPage, error) {
	p, err := l.Store.List(ctx, req)
	if l.then != nil {
		l.then()
	}
	return p, err
}

// TestResumeCountsOnlyWhatItTookOver: a saga that another runner takes
// over between a Resume's listing and its claim is left to it, and not
// counted as resumed.
func TestResumeCountsOnlyWhatItTookOver(t *testing.T) {
	s := newShop(t)
	a, b := s.runner(), s.runner()
	stuck := make(chan func())
	s.block["authorize"] = stuck
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = a.Start(ctx, "acct_1", "o11", nil)
	}()
	stuck <- func() { // a stalls inside authorize past its lease
		s.mu.Lock()
		delete(s.block, "authorize")
		s.mu.Unlock()
		s.clock.Advance(lease)
		c, err := saga.New(listThen{Store: s.e, then: func() {
			n, err := b.Resume(ctx) // b takes the saga over, and ends it
			assert.NoError(t, err)
			assert.Equal(t, 1, n)
		}}, s.definition(), &saga.Options{Lease: lease, MaxAttempts: 3,
			After: func(time.Duration) <-chan time.Time { return closedTime }})
		if !assert.NoError(t, err) {
			return
		}
		n, err := c.Resume(ctx)
		assert.NoError(t, err)
		assert.Zero(t, n, "the saga was b's")
	}
	<-done
}

// TestSendingKeepsARemoteStepsLease: a remote step that stalled past
// its lease renews it right before its call (Exec.Sending), so that a
// reconciler that judged its record abandoned before settles nothing;
// one whose record a reconciler settled meanwhile sends nothing.
func TestSendingKeepsARemoteStepsLease(t *testing.T) {
	s := newShop(t)
	var sent int
	var resolveErr error
	stalled := func(settleFirst bool) func(context.Context, *saga.Exec) ([]byte, error) {
		return func(ctx context.Context, x *saga.Exec) ([]byte, error) {
			s.clock.Advance(2 * lease) // the process paused past the step's lease
			page, err := s.e.List(ctx, idemkv.ListRequest{})
			require.NoError(t, err)
			require.Len(t, page.Records, 2, "the saga and its step, abandoned")
			var judged idemkv.Record
			for _, rec := range page.Records {
				if strings.HasSuffix(rec.ID.Endpoint, "/do/call") {
					judged = rec
				}
			}
			settle := func() error {
				return s.e.Resolve(ctx, idemkv.ResolveRequest{ID: judged.ID, Token: judged.Token, NoEffect: true, Since: judged.LeaseExpires})
			}
			if settleFirst {
				require.NoError(t, settle())
			}
			if err := x.Sending(ctx); err != nil {
				return nil, err
			}
			sent++
			if !settleFirst {
				s.clock.Advance(2 * lease)
				resolveErr = settle() // the reconciler's answer, older than the call
			}
			return []byte("ok"), nil
		}
	}
	run := func(id string, settleFirst bool) error {
		r, err := saga.New(s.e, saga.Definition{Name: "one", Steps: []saga.Step{{Name: "call", Remote: true, Do: stalled(settleFirst)}}},
			&saga.Options{Lease: lease, MaxAttempts: 1, After: func(time.Duration) <-chan time.Time { return closedTime }})
		require.NoError(t, err)
		_, err = r.Start(ctx, "acct_1", id, nil)
		return err
	}
	require.NoError(t, run("renews", false))
	assert.Equal(t, 1, sent)
	assert.ErrorIs(t, resolveErr, idemkv.ErrFenced, "an answer older than the call settles nothing")

	sent = 0
	assert.ErrorIs(t, run("lost", true), idemkv.ErrFenced, "the runner lost the step")
	assert.Zero(t, sent, "nothing sent")
}

// TestSagaOutlivingItsRecordsIsEscalated: a saga still waiting when its
// input has expired is escalated by Resume, not re-run from nothing.
func TestSagaOutlivingItsRecordsIsEscalated(t *testing.T) {
	s := newShop(t)
	s.faults["authorize"] = []error{saga.ErrUnknown}
	r := s.runner()
	st, err := r.Start(ctx, "acct_1", "o10", []byte("input"))
	require.NoError(t, err)
	require.Equal(t, saga.Waiting, st.Phase)
	s.clock.Advance(25 * time.Hour)
	_, err = r.Start(ctx, "acct_1", "o10", []byte("input")) // the client's retry, before Resume comes by
	require.ErrorIs(t, err, saga.ErrInputExpired)
	assert.Equal(t, 1, s.count("reserve"), "not run again from what is left")
	n, err := r.Resume(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "escalated")
	assert.Zero(t, n)
	st, err = r.Status(ctx, "acct_1", "o10")
	require.NoError(t, err)
	assert.Equal(t, saga.Escalated, st.Phase, "the saga's own record is escalated")
	_, err = r.Start(ctx, "acct_1", "o10", []byte("input"))
	require.ErrorIs(t, err, saga.ErrInputExpired)
	page, err := s.e.List(ctx, idemkv.ListRequest{Escalated: true})
	require.NoError(t, err)
	require.Len(t, page.Records, 1)
	assert.Equal(t, "saga/order", page.Records[0].ID.Endpoint)
	assert.Equal(t, 1, s.count("reserve"), "nothing ran again")
	n, err = r.Resume(ctx)
	require.NoError(t, err, "an escalated saga is left alone")
	assert.Zero(t, n)
}

// TestMain runs the suite on the engine, then on PostgreSQL (teststore).
func TestMain(m *testing.M) { teststore.Main(m) }
