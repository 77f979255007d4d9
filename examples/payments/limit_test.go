package payments

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/httpidem"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/reconcile"
)

// newLimited runs the service with an account limit of 1,000 on a real
// engine behind loopback HTTP, charging proc (nil: a simulated processor
// with po).
func newLimited(t *testing.T, po ProviderOptions, proc Processor) *svcFixture {
	t.Helper()
	eng, err := engine.Open(t.TempDir(), &engine.Options{NoBackgroundSweep: true})
	require.NoError(t, err)
	po.Rand = rand.New(rand.NewPCG(1, 2))
	p := NewProvider(po)
	if proc == nil {
		proc = p
	}
	svc, err := New(Config{Store: eng, Processor: proc, AccountLimit: 1000})
	require.NoError(t, err)
	srv := httptest.NewServer(svc.Handler())
	t.Cleanup(func() {
		srv.Close()
		eng.Close()
	})
	return &svcFixture{t: t, eng: eng, srv: srv, p: p, svc: svc}
}

func (f *svcFixture) spent(account string) int64 {
	return decode[Account](f.t, f.send("GET", "/v1/account", account, "", "")).Spent
}

// Ten concurrent payments of 300 against a limit of 1,000: exactly three
// are charged, whatever the interleaving, and the total never overruns.
func TestConcurrentPaymentsNeverOverrunTheLimit(t *testing.T) {
	f := newLimited(t, ProviderOptions{Latency: time.Millisecond}, nil)
	var wg sync.WaitGroup
	statuses := make(chan int, 10)
	for i := range 10 {
		wg.Go(func() {
			statuses <- f.pay("acct_1", fmt.Sprint("order-", i), `{"amount":300,"currency":"USD","card":"tok_1"}`).status
		})
	}
	wg.Wait()
	close(statuses)
	count := map[int]int{}
	for s := range statuses {
		count[s]++
	}
	assert.Equal(t, map[int]int{http.StatusCreated: 3, http.StatusPaymentRequired: 7}, count)
	assert.Equal(t, int64(900), f.spent("acct_1"))
	assert.Equal(t, 3, int(f.p.Stats().Charges), "refused payments were never sent to the processor")
	assert.Zero(t, f.spent("acct_2"), "limits are per account")

	problemOf(t, f.pay("acct_1", "order-x", `{"amount":101,"currency":"USD","card":"tok_1"}`), http.StatusPaymentRequired, "limit-exceeded")
	r := f.pay("acct_1", "order-y", `{"amount":100,"currency":"USD","card":"tok_1"}`)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	assert.Equal(t, int64(1000), f.spent("acct_1"))
	// The refused key was released: with room made, a retry may charge.
	_, err := f.eng.Get(context.Background(), idemkv.ID{Tenant: "acct_1", Endpoint: "POST /v1/payments", Key: "order-x"})
	assert.ErrorIs(t, err, idemkv.ErrNotFound)
}

// A charge that provably did not happen gives its hold back: declined,
// refused, or reconciled as not applied.
func TestHoldsComeBackWhenNothingWasCharged(t *testing.T) {
	var fault error
	f := newLimited(t, ProviderOptions{Fault: func(context.Context, string) error { return fault }}, nil)
	fault = ErrDeclined
	problemOf(t, f.pay("acct_1", "k1", order1000), http.StatusPaymentRequired, "card-declined")
	assert.Zero(t, f.spent("acct_1"), "declined")
	fault = ErrProviderUnavailable
	problemOf(t, f.pay("acct_1", "k2", order1000), http.StatusServiceUnavailable, "provider-unavailable")
	assert.Zero(t, f.spent("acct_1"), "refused before charging")
	fault = nil
	require.Equal(t, http.StatusCreated, f.pay("acct_1", "k2", order1000).status, "the retry fits the whole limit")
	assert.Equal(t, int64(1000), f.spent("acct_1"))
}

const order1000 = `{"amount":1000,"currency":"USD","card":"tok_1"}`

// lostCall is a processor whose calls time out without ever reaching it.
type lostCall struct{ *Provider }

func (lostCall) Charge(context.Context, ChargeRequest) (Charge, error) {
	return Charge{}, ErrProviderTimeout
}

func TestReconciledNotAppliedGivesTheHoldBack(t *testing.T) {
	f := newLimited(t, ProviderOptions{}, lostCall{NewProvider(ProviderOptions{})})
	problemOf(t, f.pay("acct_1", "k1", order1000), http.StatusGatewayTimeout, "payment-outcome-unknown")
	assert.Equal(t, int64(1000), f.spent("acct_1"), "held while the outcome is unknown")
	w, err := reconcile.New(f.eng, f.svc, &reconcile.Options{Clock: ahead{f.eng}, Grace: time.Nanosecond})
	require.NoError(t, err)
	require.NoError(t, w.Pass(context.Background()))
	require.Equal(t, int64(1), w.Stats().NotApplied)
	assert.Zero(t, f.spent("acct_1"), "the processor never saw it: the hold came back with the release")
	n := 0
	require.NoError(t, f.eng.ScanData(t.Context(), []byte("intent/"), func(_, _ []byte) bool { n++; return true }))
	assert.Zero(t, n, "the intent went with it")
	r, err := f.eng.Check(context.Background())
	require.NoError(t, err)
	assert.Empty(t, r.Problems)
}

// gatedCalls is a processor's network that the test drives: the first
// n calls are held on their way until the test lets them land (or their
// caller gives up, and the call ends uncharged); later calls land at once.
type gatedCalls struct {
	n       int32
	calls   atomic.Int32
	arrived chan gatedCall
}

type gatedCall struct{ land chan struct{} }

func newGatedCalls(n int32) *gatedCalls {
	return &gatedCalls{n: n, arrived: make(chan gatedCall, n)}
}

func (g *gatedCalls) fault(ctx context.Context, _ string) error {
	if g.calls.Add(1) > g.n {
		return nil
	}
	c := gatedCall{land: make(chan struct{})}
	g.arrived <- c
	select {
	case <-c.land:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestStaleAttemptCannotFreeALiveHold is the overrun of issue 36 (item
// 4), on serve's wiring with the time driven by the test: a lease of 1 s,
// a processor that takes 2 s, a limit of 10,000 and payments of 10,000.
// A is sent at 0 s by a client that gives up at 1.5 s, and again at
// 1.1 s, when the retry takes the key over; B follows at 1.8 s. When A's
// first client gives up, its attempt must give back nothing, since the
// retry still uses A's hold: B is refused, A is charged once, and the
// account never shows more than its limit. (Before holds were given back
// in the fenced release, A's stale attempt freed the hold, B was charged
// too, and the account showed 20,000.)
func TestStaleAttemptCannotFreeALiveHold(t *testing.T) {
	const limit, lease = 10000, time.Second
	eng, clock := engineAt(t, lease)
	net := newGatedCalls(2) // A's two attempts spend their 2 s in flight
	p := NewProvider(ProviderOptions{Fault: net.fault, Clock: clock})
	// No heartbeat: the attempts stall, as a paused process does.
	svc, err := New(Config{Store: eng, Processor: p, Lease: lease, Heartbeat: -1, AccountLimit: limit, Clock: clock})
	require.NoError(t, err)

	send := func(ctx context.Context, key string) *httptest.ResponseRecorder {
		return postAs(ctx, svc, key, `{"amount":10000,"currency":"USD","card":"tok_1"}`)
	}
	async := func(ctx context.Context, key string) <-chan *httptest.ResponseRecorder {
		done := make(chan *httptest.ResponseRecorder, 1)
		go func() { done <- send(ctx, key) }()
		return done
	}
	spent := func() int64 {
		v, err := eng.GetData(t.Context(), spentKey("acct_1"))
		if errors.Is(err, idemkv.ErrNotFound) {
			return 0
		}
		require.NoError(t, err)
		return int64(binary.BigEndian.Uint64(v))
	}

	gaveUp, giveUp := context.WithCancel(context.Background())
	a1 := async(gaveUp, "A") // 0 s
	<-net.arrived
	clock.Advance(1100 * time.Millisecond) // 1.1 s: A's lease ran out at 1 s
	a2 := async(context.Background(), "A")
	a2call := <-net.arrived
	clock.Advance(400 * time.Millisecond) // 1.5 s: A's first client gives up
	giveUp()
	assert.Equal(t, http.StatusConflict, (<-a1).Code, "the stale attempt's answer: lease lost")
	assert.EqualValues(t, limit, spent(), "A's hold stays: the retry still uses it")
	clock.Advance(300 * time.Millisecond) // 1.8 s
	b := send(context.Background(), "B")
	assert.Equal(t, http.StatusPaymentRequired, b.Code, "B does not fit: %s", b.Body)
	assert.LessOrEqual(t, spent(), int64(limit))
	clock.Advance(1300 * time.Millisecond) // 3.1 s: A's retry's call lands
	close(a2call.land)
	a := <-a2
	require.Equal(t, http.StatusCreated, a.Code, "%s", a.Body)

	assert.Equal(t, 1, p.Stats().Charges, "one of A and B charged")
	assert.EqualValues(t, limit, spent())
	rec, err := eng.Get(context.Background(), idemkv.ID{Tenant: "acct_1", Endpoint: paymentsEndpoint, Key: "A"})
	require.NoError(t, err)
	assert.Equal(t, idemkv.StateCompleted, rec.State)
	assert.Equal(t, uint32(2), rec.Attempt)
}

// afterUpdate is a store that calls hook after every Update.
type afterUpdate struct {
	*engine.Engine
	hook func()
}

func (s afterUpdate) Update(ctx context.Context, fn func(idemkv.Effects) error) error {
	err := s.Engine.Update(ctx, fn)
	s.hook()
	return err
}

// A client gone before the processor is called: nothing was sent, so the
// key is released and the hold given back; a gone client whose call was
// already sent leaves the payment uncertain instead (see
// TestStaleAttemptCannotFreeALiveHold and TestFaultScriptsEachCall).
func TestClientGoneBeforeTheCallReleases(t *testing.T) {
	eng, err := engine.Open(t.TempDir(), &engine.Options{NoBackgroundSweep: true})
	require.NoError(t, err)
	defer eng.Close()
	ctx, cancel := context.WithCancel(context.Background())
	p := NewProvider(ProviderOptions{})
	svc, err := New(Config{Store: afterUpdate{eng, cancel}, Processor: p, AccountLimit: 1000})
	require.NoError(t, err)
	req := httptest.NewRequestWithContext(ctx, "POST", "/v1/payments", strings.NewReader(order1000))
	req.Header.Set("Authorization", "Bearer acct_1")
	req.Header.Set("Idempotency-Key", "k1")
	w := httptest.NewRecorder()
	svc.Handler().ServeHTTP(w, req) // the client goes away as the hold commits
	assert.Equal(t, http.StatusServiceUnavailable, w.Code, "%s", w.Body)
	assert.Zero(t, p.Stats().Calls, "never sent")
	_, err = eng.Get(context.Background(), idemkv.ID{Tenant: "acct_1", Endpoint: paymentsEndpoint, Key: "k1"})
	assert.ErrorIs(t, err, idemkv.ErrNotFound, "released")
	v, err := eng.GetData(t.Context(), spentKey("acct_1"))
	require.NoError(t, err)
	assert.Zero(t, binary.BigEndian.Uint64(v), "the hold came back with the release")
}

// beforeUpdate is a store whose Update waits for gate, once, when the
// hook says so.
type beforeUpdate struct {
	*engine.Engine
	wait func() bool
	gate chan struct{}
}

func (s beforeUpdate) Update(ctx context.Context, fn func(idemkv.Effects) error) error {
	if s.wait() {
		<-s.gate
	}
	return s.Engine.Update(ctx, fn)
}

// stallFirstUpdate is eng, whose first Update (an attempt's hold) waits
// until the store's gate is closed; reached is closed once it waits.
func stallFirstUpdate(eng *engine.Engine) (store beforeUpdate, reached chan struct{}) {
	var updates atomic.Int32
	reached = make(chan struct{})
	return beforeUpdate{Engine: eng, gate: make(chan struct{}), wait: func() bool {
		if updates.Add(1) != 1 {
			return false
		}
		close(reached)
		return true
	}}, reached
}

// postAs sends svc body as a payment of acct_1 under key, with ctx.
func postAs(ctx context.Context, svc *Service, key, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequestWithContext(ctx, "POST", "/v1/payments", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer acct_1")
	req.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	svc.Handler().ServeHTTP(w, req)
	return w
}

// An attempt that stalls between its claim and its hold, past its lease,
// while its retry takes the key over and stores the payment, holds
// nothing when it wakes: its hold's transaction finds the payment's row.
// The account counts the payment once, and nothing is left held.
func TestStaleAttemptHoldsNothingOnceThePaymentIsStored(t *testing.T) {
	clock := fakeclock.New(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	eng, err := engine.Open(t.TempDir(), &engine.Options{Clock: clock, Lease: time.Second, NoBackgroundSweep: true})
	require.NoError(t, err)
	defer eng.Close()
	store, reached := stallFirstUpdate(eng)
	p := NewProvider(ProviderOptions{Clock: clock})
	svc, err := New(Config{Store: store, Processor: p, Heartbeat: -1, AccountLimit: 10000, Clock: clock}) // it stalls, as a paused process does
	require.NoError(t, err)
	srv := httptest.NewServer(svc.Handler())
	defer srv.Close()
	f := &svcFixture{t: t, eng: eng, srv: srv, p: p, svc: svc}

	stale := make(chan reply, 1)
	go func() { stale <- f.pay("acct_1", "k1", order1000) }()
	<-reached
	clock.Advance(2 * time.Second)
	retry := f.pay("acct_1", "k1", order1000)
	require.Equal(t, http.StatusCreated, retry.status, "%s", retry.body)
	close(store.gate)
	problemOf(t, <-stale, http.StatusConflict, httpidem.ProblemLeaseLost)

	assert.Equal(t, int64(1000), f.spent("acct_1"), "counted once")
	rec, err := eng.Get(context.Background(), idemkv.ID{Tenant: "acct_1", Endpoint: paymentsEndpoint, Key: "k1"})
	require.NoError(t, err)
	for _, k := range [][]byte{holdKey("acct_1", rec.OperationID), intentKey("acct_1", rec.OperationID)} {
		_, err := eng.GetData(t.Context(), k)
		assert.ErrorIs(t, err, idemkv.ErrNotFound, "%q left behind", k)
	}
	assert.Equal(t, 1, p.Stats().Calls, "the stale attempt charged nothing")
}

// A takeover whose own call is refused (503) does not release the key:
// the attempt it took over may have sent its call under the same key
// before it stalled, and that call may have charged. The payment stays
// unsettled for the reconciler, which finds the charge: one charge, and
// its payment row. (Released, the key would run anew under the same
// downstream key, and its client, had it given up, would have left a
// charge with no payment.)
func TestRefusedTakeoverLeavesItToTheReconciler(t *testing.T) {
	const lease = time.Second
	eng, clock := engineAt(t, lease)
	net := newGatedCalls(1) // the first attempt's call is in flight until the test lets it land
	var calls atomic.Int32
	p := NewProvider(ProviderOptions{Clock: clock, Fault: func(ctx context.Context, key string) error {
		if calls.Add(1) == 2 {
			return ErrProviderUnavailable // the takeover's own call is refused
		}
		return net.fault(ctx, key)
	}})
	svc, err := New(Config{Store: eng, Processor: p, Lease: lease, Heartbeat: -1, AccountLimit: 10000, Clock: clock})
	require.NoError(t, err)
	send := func(key string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/v1/payments", strings.NewReader(`{"amount":1000,"currency":"USD","card":"tok_1"}`))
		req.Header.Set("Authorization", "Bearer acct_1")
		req.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		svc.Handler().ServeHTTP(w, req)
		return w
	}
	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- send("A") }()
	call := <-net.arrived
	clock.Advance(2 * lease) // the first attempt stalls past its lease
	retry := send("A")
	require.Equal(t, http.StatusGatewayTimeout, retry.Code, "the takeover's refusal proves nothing: %s", retry.Body)
	close(call.land) // the first attempt's call charges after all
	assert.Equal(t, http.StatusConflict, (<-first).Code, "the stalled attempt lost its key")
	rec, err := eng.Get(context.Background(), idemkv.ID{Tenant: "acct_1", Endpoint: paymentsEndpoint, Key: "A"})
	require.NoError(t, err)
	require.Equal(t, idemkv.StateUncertain, rec.State)

	w, err := reconcile.New(eng, svc, &reconcile.Options{Clock: ahead{eng}, Grace: time.Nanosecond})
	require.NoError(t, err)
	require.NoError(t, w.Pass(context.Background()))
	again := send("A")
	require.Equal(t, http.StatusCreated, again.Code, "%s", again.Body)
	assert.Equal(t, 1, p.Stats().Charges)
	var list struct{ Data []Payment }
	r := httptest.NewRequest("GET", "/v1/payments", nil)
	r.Header.Set("Authorization", "Bearer acct_1")
	lw := httptest.NewRecorder()
	svc.Handler().ServeHTTP(lw, r)
	require.NoError(t, json.Unmarshal(lw.Body.Bytes(), &list))
	require.Len(t, list.Data, 1, "the charge has its payment")
}

// hookUpdate calls hook, if set, after every Update.
type hookUpdate struct {
	*engine.Engine
	hook atomic.Pointer[func()]
}

func (s *hookUpdate) Update(ctx context.Context, fn func(idemkv.Effects) error) error {
	err := s.Engine.Update(ctx, fn)
	if h := s.hook.Load(); h != nil {
		(*h)()
	}
	return err
}

// TestTakeoverThatGivesUpLeavesTheHold: A's first attempt sends its call
// and stalls past its lease; a retry takes the key over, and its own
// client leaves before the retry calls. The takeover must not release
// the key and give the hold back, as an attempt that never called may:
// the first call may still charge, under the same downstream key. The
// key is left uncertain with its hold, the first call lands, and the
// account never shows less than the processor charged; B, which would
// pass the limit, is refused.
func TestTakeoverThatGivesUpLeavesTheHold(t *testing.T) {
	const lease, limit = time.Second, 1000
	eng, clock := engineAt(t, lease)
	store := &hookUpdate{Engine: eng}
	net := newGatedCalls(1)
	p := NewProvider(ProviderOptions{Fault: net.fault, Clock: clock})
	svc, err := New(Config{Store: store, Processor: p, Lease: lease, Heartbeat: -1, AccountLimit: limit, Clock: clock})
	require.NoError(t, err)
	send := func(ctx context.Context, key string) *httptest.ResponseRecorder {
		return postAs(ctx, svc, key, order1000)
	}
	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- send(context.Background(), "A") }()
	call := <-net.arrived    // attempt 1's call is on its way
	clock.Advance(2 * lease) // and it stalls past its lease
	ctx, cancel := context.WithCancel(context.Background())
	leave := func() { cancel() } // the retry's client leaves as its hold commits
	store.hook.Store(&leave)
	retry := send(ctx, "A")
	store.hook.Store(nil)
	require.Equal(t, http.StatusGatewayTimeout, retry.Code, "%s", retry.Body)
	rec, err := eng.Get(context.Background(), idemkv.ID{Tenant: "acct_1", Endpoint: paymentsEndpoint, Key: "A"})
	require.NoError(t, err)
	require.Equal(t, idemkv.StateUncertain, rec.State)

	close(call.land) // attempt 1's call charges
	<-first
	require.Equal(t, 1, p.Stats().Charges)
	spent, err := eng.GetData(context.Background(), spentKey("acct_1"))
	require.NoError(t, err)
	require.Equal(t, uint64(limit), binary.BigEndian.Uint64(spent), "A's hold stands for its charge")
	require.Equal(t, http.StatusPaymentRequired, send(context.Background(), "B").Code, "B would pass the limit")
	require.Equal(t, 1, p.Stats().Charges)
}

// TestStaleAttemptHoldsNothingOnceItsPaymentIsGivenBack: an attempt
// stalls between its claim and its hold, past its lease, and its payment
// is settled as not charged meanwhile: the reconciler finds the record
// abandoned, or a retry takes it over, is refused by the processor and
// leaves it uncertain, and the reconciler settles that. When the stale
// attempt wakes, its hold must not commit: no attempt is left to give it
// back, and the account would refuse payments its limit allows. Payment
// B, the whole limit, passes.
func TestStaleAttemptHoldsNothingOnceItsPaymentIsGivenBack(t *testing.T) {
	for _, takeover := range []bool{false, true} {
		t.Run(fmt.Sprint("takeover=", takeover), func(t *testing.T) {
			const lease, limit = time.Second, 1000
			eng, clock := engineAt(t, lease)
			store, reached := stallFirstUpdate(eng)
			var unavailable atomic.Bool
			unavailable.Store(true)
			p := NewProvider(ProviderOptions{Clock: clock, Fault: func(context.Context, string) error {
				if unavailable.Load() {
					return ErrProviderUnavailable
				}
				return nil
			}})
			svc, err := New(Config{Store: store, Processor: p, Lease: lease, Heartbeat: -1, AccountLimit: limit, Clock: clock})
			require.NoError(t, err)
			send := func(key string) *httptest.ResponseRecorder { return postAs(context.Background(), svc, key, order1000) }
			stale := make(chan *httptest.ResponseRecorder, 1)
			go func() { stale <- send("A") }()
			<-reached                // attempt 1 claimed, stalls before its hold
			clock.Advance(2 * lease) // past its lease
			if takeover {
				require.Equal(t, http.StatusGatewayTimeout, send("A").Code, "refused after a takeover: uncertain")
			}
			w, err := reconcile.New(eng, svc, &reconcile.Options{Clock: ahead{eng}, Grace: time.Nanosecond})
			require.NoError(t, err)
			require.NoError(t, w.Pass(context.Background()))
			require.Equal(t, int64(1), w.Stats().NotApplied)
			close(store.gate) // attempt 1 wakes
			require.Equal(t, http.StatusConflict, (<-stale).Code)
			if v, err := eng.GetData(context.Background(), spentKey("acct_1")); !errors.Is(err, idemkv.ErrNotFound) {
				require.NoError(t, err)
				require.Zero(t, binary.BigEndian.Uint64(v), "nothing is held")
			}

			unavailable.Store(false)
			require.Equal(t, http.StatusCreated, send("B").Code, "the whole limit is B's")
			require.Equal(t, 1, p.Stats().Charges)
		})
	}
}

// firstCallLost is a processor whose first call times out without ever
// reaching it.
type firstCallLost struct {
	*Provider
	calls atomic.Int32
}

func (f *firstCallLost) Charge(ctx context.Context, req ChargeRequest) (Charge, error) {
	if f.calls.Add(1) == 1 {
		return Charge{}, ErrProviderTimeout
	}
	return f.Provider.Charge(ctx, req)
}

// TestTakeoverRefusedByTheLimitFencesTheStaleAttempt: A's first attempt
// stalls before its hold, past its lease; B's call times out, holding
// the room A needs; A's retry takes the key over and is refused by the
// limit (402), releasing the key. Once the reconciler gives B's hold
// back, A's stale attempt wakes: it must hold nothing (no attempt would
// give it back, and A's client, told 402, does not retry), so C, which
// B's give-back made room for, passes.
func TestTakeoverRefusedByTheLimitFencesTheStaleAttempt(t *testing.T) {
	const lease, limit = time.Second, 1000
	eng, clock := engineAt(t, lease)
	store, reached := stallFirstUpdate(eng)
	p := &firstCallLost{Provider: NewProvider(ProviderOptions{Clock: clock})} // B's
	svc, err := New(Config{Store: store, Processor: p, Lease: lease, Heartbeat: -1, AccountLimit: limit, Clock: clock})
	require.NoError(t, err)
	const order600 = `{"amount":600,"currency":"USD","card":"tok_1"}`
	send := func(key string) *httptest.ResponseRecorder { return postAs(context.Background(), svc, key, order600) }
	stale := make(chan *httptest.ResponseRecorder, 1)
	go func() { stale <- send("A") }()
	<-reached // A's first attempt stalls before its hold
	require.Equal(t, http.StatusGatewayTimeout, send("B").Code)
	clock.Advance(2 * lease)
	require.Equal(t, http.StatusPaymentRequired, send("A").Code, "the takeover does not fit beside B's hold")
	w, err := reconcile.New(eng, svc, &reconcile.Options{Clock: ahead{eng}, Grace: time.Nanosecond})
	require.NoError(t, err)
	require.NoError(t, w.Pass(context.Background()))
	require.Equal(t, int64(1), w.Stats().NotApplied, "B was never charged: %+v", w.Stats())
	close(store.gate)
	require.Equal(t, http.StatusConflict, (<-stale).Code)
	require.Equal(t, http.StatusCreated, send("C").Code, "nothing is held")
}

// engineAt opens an engine whose clock the test drives, with lease,
// closed with the test.
func engineAt(t *testing.T, lease time.Duration) (*engine.Engine, *fakeclock.Clock) {
	t.Helper()
	clock := fakeclock.New(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	eng, err := engine.Open(t.TempDir(), &engine.Options{Clock: clock, Lease: lease, NoBackgroundSweep: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = eng.Close() })
	return eng, clock
}
