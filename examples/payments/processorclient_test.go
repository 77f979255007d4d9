package payments

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/examples/processor"
	"github.com/idemkv/idemkv/httpidem"
	"github.com/idemkv/idemkv/reconcile"
)

// scriptedFault is the fault the next charge requests meet; set it from
// the test while the server's handlers read it.
type scriptedFault struct {
	mu  sync.Mutex
	err error
}

func (f *scriptedFault) set(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

func (f *scriptedFault) get(context.Context, string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// newProcessor runs an idemkv processor on loopback, with its own store,
// faults chosen by fault.
func newProcessor(t *testing.T, fault *scriptedFault) (*processor.Server, string) {
	t.Helper()
	e, err := engine.Open(t.TempDir(), &engine.Options{NoBackgroundSweep: true})
	require.NoError(t, err)
	s, err := processor.New(processor.Options{Store: e, Hold: time.Hour, Fault: fault.get})
	require.NoError(t, err)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
		e.Close()
	})
	return s, srv.URL
}

// TestProcessorClientReadsAnswersConservatively: a charge, a refusal and
// a lost answer map to the Processor contract's outcomes; only a 503 says
// nothing was charged.
func TestProcessorClientReadsAnswersConservatively(t *testing.T) {
	var fault scriptedFault
	_, url := newProcessor(t, &fault)
	pc, err := NewProcessorClient(url, 200*time.Millisecond, nil)
	require.NoError(t, err)
	ctx := context.Background()
	req := ChargeRequest{Key: "k1", Amount: 5000, Currency: "USD", Description: "order 7"}

	c, err := pc.Charge(ctx, req)
	require.NoError(t, err)
	assert.Equal(t, "order 7", c.Description)
	again, err := pc.Charge(ctx, req)
	require.NoError(t, err)
	assert.Equal(t, c.ID, again.ID, "deduplicated on the key")

	fault.set(processor.ErrRefuse)
	_, err = pc.Charge(ctx, ChargeRequest{Key: "k2", Amount: 1, Currency: "USD"})
	assert.ErrorIs(t, err, ErrProviderUnavailable)
	fault.set(processor.ErrTimeout)
	_, err = pc.Charge(ctx, ChargeRequest{Key: "k3", Amount: 1, Currency: "USD"})
	assert.ErrorIs(t, err, ErrProviderTimeout)
	fault.set(nil)

	found, ok, err := pc.Lookup(ctx, "k3")
	require.NoError(t, err)
	assert.True(t, ok, "the timed-out charge was made")
	assert.Equal(t, "k3", found.Key)
	_, ok, err = pc.Lookup(ctx, "k2")
	require.NoError(t, err)
	assert.False(t, ok, "the refused one was not")

	_, err = pc.Charge(ctx, ChargeRequest{Key: "k5", Amount: 1, Currency: "USD", Deadline: time.Now().Add(-time.Second)})
	assert.ErrorIs(t, err, ErrCallExpired, "it arrived after its deadline")
	_, ok, err = pc.Lookup(ctx, "k5")
	require.NoError(t, err)
	assert.False(t, ok, "nothing charged")
	_, err = pc.Charge(ctx, ChargeRequest{Key: "k5", Amount: 1, Currency: "USD", Deadline: time.Now().Add(time.Minute)})
	assert.NoError(t, err)

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = pc.Charge(cancelled, ChargeRequest{Key: "k4", Amount: 1, Currency: "USD"})
	assert.ErrorIs(t, err, context.Canceled, "not sent")
	assert.False(t, errors.Is(err, ErrProviderTimeout))
}

// TestProcessorClientRefusesMalformedAnswers: a processor that answers
// garbage, or a charge under another key, never reads as a charge: the
// call is unknown and the lookup an error.
func TestProcessorClientRefusesMalformedAnswers(t *testing.T) {
	for name, body := range map[string]string{
		"not json":  `<html>`,
		"other key": `{"id":"ch_1","key":"other","amount":1,"currency":"USD"}`,
		"no id":     `{"key":"k","amount":1,"currency":"USD"}`,
	} {
		t.Run(name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusOK)
				w.Write([]byte(body))
			}))
			defer srv.Close()
			pc, err := NewProcessorClient(srv.URL, time.Second, nil)
			require.NoError(t, err)
			_, err = pc.Charge(context.Background(), ChargeRequest{Key: "k", Amount: 1, Currency: "USD"})
			assert.ErrorIs(t, err, ErrProviderTimeout)
			_, ok, err := pc.Lookup(context.Background(), "k")
			assert.Error(t, err)
			assert.False(t, ok)
		})
	}
	_, err := NewProcessorClient("localhost:1", 0, nil)
	assert.Error(t, err)
}

// TestPaymentsOverAnHTTPProcessor: the payments service charging an idemkv
// processor over loopback; a charge whose answer is lost is reconciled by
// asking the processor, and the payment is charged once.
func TestPaymentsOverAnHTTPProcessor(t *testing.T) {
	var fault scriptedFault
	fault.set(processor.ErrTimeout)
	ps, url := newProcessor(t, &fault)
	pc, err := NewProcessorClient(url, 200*time.Millisecond, nil)
	require.NoError(t, err)
	eng, err := engine.Open(t.TempDir(), &engine.Options{NoBackgroundSweep: true})
	require.NoError(t, err)
	defer eng.Close()
	svc, err := New(Config{Store: eng, Processor: pc})
	require.NoError(t, err)
	srv := httptest.NewServer(svc.Handler())
	defer srv.Close()
	f := &svcFixture{t: t, eng: eng, srv: srv, svc: svc}

	problemOf(t, f.pay("acct_1", "order-1", order), http.StatusGatewayTimeout, "payment-outcome-unknown")
	fault.set(nil)
	problemOf(t, f.pay("acct_1", "order-1", order), http.StatusConflict, httpidem.ProblemReconciling)
	w, err := reconcile.New(eng, svc, &reconcile.Options{Clock: ahead{eng}, Grace: time.Nanosecond}) // the call that timed out has ended: the processor held it until the client left
	require.NoError(t, err)
	require.NoError(t, w.Pass(context.Background()))
	require.Equal(t, int64(1), w.Stats().Applied)
	r := f.pay("acct_1", "order-1", order)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	p := decode[Payment](t, r)
	assert.Equal(t, int64(5000), p.Amount)
	assert.Equal(t, processor.Stats{Calls: 1, Charges: 1, TimedOut: 1}, ps.Stats())
}

// heldPosts is a network that holds each charge request on its way to the
// processor until the test lets it through: a slow network, or a process
// paused after it decided to send.
type heldPosts struct {
	held chan chan struct{}
}

func (h heldPosts) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPost {
		through := make(chan struct{})
		h.held <- through
		<-through
	}
	return http.DefaultTransport.RoundTrip(r)
}

// TestACallHeldBackPastItsDeadlineChargesNothing: a payment's call is held
// on its way to the processor past its attempt's lease and the
// reconciler's grace. The reconciler asks, hears "no charge" (nothing
// has arrived) and releases the payment with its hold. When the call
// arrives at last, the processor refuses it for its deadline: nothing is
// charged without its payment, and the account's hold is not spent
// twice. The retry charges once.
func TestACallHeldBackPastItsDeadlineChargesNothing(t *testing.T) {
	const lease = 2 * time.Second
	eng, clock := engineAt(t, lease)
	pe, err := engine.Open(t.TempDir(), &engine.Options{Clock: clock, NoBackgroundSweep: true}) // the processor's, on the same time
	require.NoError(t, err)
	defer pe.Close()
	ps, err := processor.New(processor.Options{Store: pe})
	require.NoError(t, err)
	psrv := httptest.NewServer(ps.Handler())
	defer psrv.Close()
	net := heldPosts{held: make(chan chan struct{}, 1)}
	pc, err := NewProcessorClient(psrv.URL, time.Minute, &http.Client{Transport: net})
	require.NoError(t, err)
	svc, err := New(Config{Store: eng, Processor: pc, Lease: lease, Heartbeat: -1, AccountLimit: 10000, Clock: clock})
	require.NoError(t, err)
	srv := httptest.NewServer(svc.Handler())
	defer srv.Close()
	f := &svcFixture{t: t, eng: eng, srv: srv, svc: svc}

	first := make(chan reply, 1)
	go func() { first <- f.pay("acct_1", "k1", order1000) }()
	call := <-net.held
	clock.Advance(lease + 2*time.Second)
	w, err := reconcile.New(eng, svc, &reconcile.Options{Grace: time.Second})
	require.NoError(t, err)
	require.NoError(t, w.Pass(context.Background()))
	require.Equal(t, int64(1), w.Stats().NotApplied, "nothing had reached the processor")
	assert.Zero(t, f.spent("acct_1"), "the hold was given back")

	close(call)                                                           // the call arrives, late
	problemOf(t, <-first, http.StatusConflict, httpidem.ProblemLeaseLost) // refused, and its lease is gone
	assert.Equal(t, processor.Stats{Calls: 1, Expired: 1}, ps.Stats(), "refused for its deadline: no charge without its payment")
	assert.Contains(t, string(f.send("GET", "/metrics", "", "", "").body), `idemkv_provider_calls_total{result="expired"} 1`)

	go func() { close(<-net.held) }()
	r := f.pay("acct_1", "k1", order1000)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	assert.Equal(t, int64(1), ps.Stats().Charges)
	assert.Equal(t, int64(1000), f.spent("acct_1"))
}
