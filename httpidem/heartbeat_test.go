package httpidem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/httpidem"
	"github.com/idemkv/idemkv/internal/logtest"
)

// watchedStore is the fixture's engine with its renewals watched: it
// counts them by lease token, can fail them, can hold one until its
// context ends, and notes a settle (Complete, Release, MarkUncertain)
// that starts while a renewal runs.
type watchedStore struct {
	idemkv.Store

	fail atomic.Bool // Renew fails, without reaching the engine
	// hold, if set, makes Renew wait for its context's end, after
	// sending on held.
	hold atomic.Bool
	held chan struct{}

	mu       sync.Mutex
	renews   map[uint64]int // Renew calls by token
	inflight int
	overlap  bool // a settle started while a renewal ran
}

var errRenewDown = errors.New("injected: store unreachable")

// wrap installs w in front of the fixture's store.
func (w *watchedStore) wrap(o *httpidem.Options) {
	w.Store = o.Store
	w.renews = make(map[uint64]int)
	w.held = make(chan struct{}, 1)
	o.Store = w
}

func (w *watchedStore) Renew(ctx context.Context, l idemkv.Lease, d time.Duration) (idemkv.Lease, error) {
	w.mu.Lock()
	w.renews[l.Token]++
	w.inflight++
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		w.inflight--
		w.mu.Unlock()
	}()
	if w.hold.Load() {
		w.held <- struct{}{}
		<-ctx.Done()
		return idemkv.Lease{}, ctx.Err()
	}
	if w.fail.Load() {
		return idemkv.Lease{}, errRenewDown
	}
	return w.Store.Renew(ctx, l, d)
}

func (w *watchedStore) settling() {
	w.mu.Lock()
	if w.inflight > 0 {
		w.overlap = true
	}
	w.mu.Unlock()
}

func (w *watchedStore) Complete(ctx context.Context, l idemkv.Lease, r idemkv.Result, apply func(idemkv.Effects) error) error {
	w.settling()
	return w.Store.Complete(ctx, l, r, apply)
}

func (w *watchedStore) Release(ctx context.Context, l idemkv.Lease, apply func(idemkv.Effects) error) error {
	w.settling()
	return w.Store.Release(ctx, l, apply)
}

func (w *watchedStore) MarkUncertain(ctx context.Context, l idemkv.Lease, note string) error {
	w.settling()
	return w.Store.MarkUncertain(ctx, l, note)
}

func (w *watchedStore) renewsOf(token uint64) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.renews[token]
}

// slowFirst is a handler whose first call blocks until release is
// closed; later calls answer at once. Every call answers 201 "call N".
type slowFirst struct {
	entered chan struct{}
	release chan struct{}
	once    sync.Once
	calls   atomic.Int64
	token   atomic.Uint64 // the first call's lease token
}

func newSlowFirst() *slowFirst {
	return &slowFirst{entered: make(chan struct{}, 1), release: make(chan struct{})}
}

// unblock lets the first call return. A test registers it as a cleanup
// after its fixture's, so that a test that fails early releases the
// handler before the server closes (which waits for it).
func (s *slowFirst) unblock() { s.once.Do(func() { close(s.release) }) }

func (s *slowFirst) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := s.calls.Add(1)
	if n == 1 {
		s.token.Store(httpidem.FromContext(r.Context()).Lease().Token)
		s.entered <- struct{}{}
		<-s.release
	}
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, "call %d", n)
}

// A handler that runs for more than three leases keeps its key: every
// retry meanwhile is told it is in progress, its outcome is stored, and
// once it has returned its lease is renewed no more.
func TestHeartbeatKeepsASlowHandlersLease(t *testing.T) {
	h := newSlowFirst()
	ws := &watchedStore{}
	f := buildFixture(t, httpidem.Route{Lease: 3 * time.Second}, h.ServeHTTP, nil, ws.wrap)
	t.Cleanup(h.unblock)
	id := idemkv.ID{Tenant: "acct_1", Endpoint: "POST " + route, Key: "k"}

	first := make(chan response)
	go func() { first <- f.do("POST", route, `{}`, "k") }()
	<-h.entered
	for range 5 {
		f.clock.Advance(2 * time.Second) // 10 s in all, past three leases
		problem(t, f.do("POST", route, `{}`, "k"), http.StatusConflict, httpidem.ProblemInProgress)
		assert.Equal(t, httpidem.Conflict, f.report().Disposition)
		rec, err := f.eng.Get(t.Context(), id)
		require.NoError(t, err)
		assert.True(t, rec.LeaseExpires.After(f.clock.Now()), "the lease is live at %v", f.clock.Now())
	}
	h.unblock()
	r := <-first
	require.Equal(t, http.StatusCreated, r.status)
	assert.Equal(t, "call 1", string(r.body))
	rep := f.report()
	assert.Equal(t, httpidem.Stored, rep.Disposition)
	assert.Equal(t, 10, rep.Renewals, "one beat a second (a third of the lease) for 10 s")
	assert.Equal(t, 10, ws.renewsOf(h.token.Load()))

	// Renewed no more: no beat is armed, and time passing renews nothing.
	assert.Zero(t, f.clock.pending())
	f.clock.Advance(time.Minute)
	assert.Equal(t, 10, ws.renewsOf(h.token.Load()))

	again := f.do("POST", route, `{}`, "k")
	assert.Equal(t, "call 1", string(again.body))
	assert.Equal(t, "true", again.header.Get(httpidem.HeaderReplayed))
	assert.EqualValues(t, 1, h.calls.Load())
	rec, err := f.eng.Get(t.Context(), id)
	require.NoError(t, err)
	assert.Equal(t, idemkv.StateCompleted, rec.State)
	assert.EqualValues(t, 1, rec.Attempt, "never taken over")
}

// Renewals that fail are tried again at the next beat; once the holder
// has stalled past its lease and a retry took the key over, the next
// renewal is fenced, and the heartbeat stops: nothing renews the lost
// lease again, and the late handler's outcome is not stored.
func TestHeartbeatStopsWhenFenced(t *testing.T) {
	h := newSlowFirst()
	ws := &watchedStore{}
	sink, logger := logtest.New(slog.LevelInfo)
	f := buildFixture(t, httpidem.Route{Lease: 3 * time.Second}, h.ServeHTTP, nil, func(o *httpidem.Options) {
		ws.wrap(o)
		o.Logger = logger
	})
	t.Cleanup(h.unblock)
	id := idemkv.ID{Tenant: "acct_1", Endpoint: "POST " + route, Key: "k"}

	first := make(chan response)
	go func() { first <- f.send(`{}`, "k", map[string]string{httpidem.HeaderRequestID: "req-first"}) }()
	<-h.entered
	ws.fail.Store(true)
	f.clock.Advance(4 * time.Second) // beats at 1, 2, 3 and 4 s fail; the lease ran out at 3 s
	tok := h.token.Load()
	require.Equal(t, 4, ws.renewsOf(tok), "a failed renewal is tried again at the next beat")
	ws.fail.Store(false)

	// A retry takes the key over and finishes.
	r2, rep := f.doWith(`{}`, "k", map[string]string{httpidem.HeaderRequestID: "req-second"})
	require.Equal(t, http.StatusCreated, r2.status)
	assert.Equal(t, "call 2", string(r2.body))
	assert.Equal(t, httpidem.Stored, rep.Disposition)

	f.clock.Advance(time.Second) // the beat at 5 s is fenced...
	assert.Equal(t, 5, ws.renewsOf(tok))
	assert.Zero(t, f.clock.pending(), "...and arms no other")
	f.clock.Advance(time.Minute)
	assert.Equal(t, 5, ws.renewsOf(tok))

	h.unblock()
	problem(t, <-first, http.StatusConflict, httpidem.ProblemLeaseLost)
	rep = f.report()
	assert.Equal(t, httpidem.LeaseLost, rep.Disposition)
	assert.Zero(t, rep.Renewals)
	assert.Equal(t, "call 2", string(f.do("POST", route, `{}`, "k").body))

	var mine []map[string]any
	for _, r := range sink.Records(t) {
		if r["request_id"] == "req-first" {
			mine = append(mine, r)
		}
	}
	failed := want{"httpidem: lease renewal failed", "WARN", map[string]any{"fenced": false, "err": errRenewDown.Error()}}
	checkRecords(t, mine, id, "req-first",
		want{"httpidem: key claimed", "INFO", map[string]any{"attempt": 1}},
		failed, failed, failed, failed,
		want{"httpidem: lease renewal failed", "WARN", map[string]any{"fenced": true}},
		want{"httpidem: lease lost", "WARN", map[string]any{"disposition": "lease_lost"}},
	)
}

// A beat that is renewing when the handler returns is waited for: the
// outcome is committed only once no renewal runs (its context is
// cancelled, so the wait is short), and no beat follows.
func TestHeartbeatEndsBeforeTheSettle(t *testing.T) {
	h := newSlowFirst()
	ws := &watchedStore{}
	f := buildFixture(t, httpidem.Route{Lease: 3 * time.Second}, h.ServeHTTP, nil, ws.wrap)
	t.Cleanup(h.unblock)

	first := make(chan response)
	go func() { first <- f.do("POST", route, `{}`, "k") }()
	<-h.entered
	ws.hold.Store(true)
	advanced := make(chan struct{})
	go func() {
		defer close(advanced)
		f.clock.Advance(time.Second) // returns once the beat has
	}()
	select {
	case <-ws.held: // the beat is renewing
	case <-time.After(10 * time.Second):
		t.Fatal("no renewal started")
	}
	h.unblock()
	r := <-first
	<-advanced
	require.Equal(t, http.StatusCreated, r.status)
	rep := f.report()
	assert.Equal(t, httpidem.Stored, rep.Disposition)
	assert.Zero(t, rep.Renewals, "the renewal cut short is not counted")
	ws.mu.Lock()
	assert.False(t, ws.overlap, "the outcome was committed while a renewal ran")
	ws.mu.Unlock()
	assert.Zero(t, f.clock.pending())
	ws.hold.Store(false)
	f.clock.Advance(time.Minute)
	assert.Equal(t, 1, ws.renewsOf(h.token.Load()))
}

// With the heartbeat off (Route.Heartbeat < 0), a handler slower than
// its lease is taken over by a retry while it still runs, as before
// heartbeats: the retry runs the handler again, under attempt 2, and the
// slow one's outcome is refused.
func TestNoHeartbeatSlowHandlerIsTakenOver(t *testing.T) {
	h := newSlowFirst()
	ws := &watchedStore{}
	f := buildFixture(t, httpidem.Route{Lease: 3 * time.Second, Heartbeat: -1}, h.ServeHTTP, nil, ws.wrap)
	t.Cleanup(h.unblock)
	id := idemkv.ID{Tenant: "acct_1", Endpoint: "POST " + route, Key: "k"}

	first := make(chan response)
	go func() { first <- f.do("POST", route, `{}`, "k") }()
	<-h.entered
	assert.Zero(t, f.clock.pending(), "no beat is armed")
	f.clock.Advance(4 * time.Second)
	r2 := f.do("POST", route, `{}`, "k")
	require.Equal(t, http.StatusCreated, r2.status, "taken over: %s", r2.body)
	assert.Equal(t, "call 2", string(r2.body))
	assert.Equal(t, httpidem.Stored, f.report().Disposition)
	rec, err := f.eng.Get(t.Context(), id)
	require.NoError(t, err)
	assert.EqualValues(t, 2, rec.Attempt, "the retry took the key over")

	h.unblock()
	problem(t, <-first, http.StatusConflict, httpidem.ProblemLeaseLost)
	assert.Equal(t, httpidem.LeaseLost, f.report().Disposition)
	assert.Zero(t, ws.renewsOf(h.token.Load()))
}

// A handler quicker than a beat is never renewed, and leaves no beat
// armed; the default beat is a third of the store's default lease.
func TestHeartbeatDefaultsToAThirdOfTheStoresLease(t *testing.T) {
	h := newSlowFirst()
	ws := &watchedStore{}
	f := buildFixture(t, httpidem.Route{}, h.ServeHTTP, nil, ws.wrap) // the engine's lease: 30 s
	t.Cleanup(h.unblock)

	first := make(chan response)
	go func() { first <- f.do("POST", route, `{}`, "k") }()
	<-h.entered
	f.clock.Advance(10*time.Second - time.Millisecond)
	assert.Zero(t, ws.renewsOf(h.token.Load()))
	f.clock.Advance(time.Millisecond)
	assert.Equal(t, 1, ws.renewsOf(h.token.Load()))
	h.unblock()
	require.Equal(t, http.StatusCreated, (<-first).status)
	assert.Equal(t, 1, f.report().Renewals)

	assert.Equal(t, http.StatusCreated, f.do("POST", route, `{}`, "k2").status)
	assert.Zero(t, f.report().Renewals)
	assert.Zero(t, f.clock.pending())
}

// A response that outgrows the stored-body cap commits its outcome while
// the handler still runs: the heartbeat stops then, before the commit.
func TestHeartbeatStopsWhenTheResponseStreams(t *testing.T) {
	h := newSlowFirst()
	ws := &watchedStore{}
	f := buildFixture(t, httpidem.Route{Lease: 3 * time.Second, MaxStoredBody: 4}, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "more than four bytes") // commits the outcome, then streams
		h.ServeHTTP(w, r)                         // and blocks, writing "call 1"
	}, nil, ws.wrap)
	t.Cleanup(h.unblock)
	done := make(chan response)
	go func() { done <- f.do("POST", route, `{}`, "k") }()
	<-h.entered
	assert.Zero(t, f.clock.pending(), "the heartbeat stopped at the commit")
	f.clock.Advance(time.Minute)
	h.unblock()
	assert.Equal(t, "more than four bytescall 1", string((<-done).body))
	assert.Zero(t, f.report().Renewals)
	assert.Zero(t, ws.renewsOf(h.token.Load()))
}

func TestHeartbeatMustBeShorterThanTheLease(t *testing.T) {
	f := newFixture(t, httpidem.Route{}, http.NotFound)
	m, err := httpidem.New(&httpidem.Options{Store: f.eng, Tenant: bearer})
	require.NoError(t, err)
	_, err = m.Wrap(http.NotFoundHandler(), httpidem.Route{Lease: time.Second, Heartbeat: time.Second})
	assert.ErrorContains(t, err, "shorter than Lease")
	_, err = m.Wrap(http.NotFoundHandler(), httpidem.Route{Lease: time.Second, Heartbeat: -1})
	assert.NoError(t, err)
}
