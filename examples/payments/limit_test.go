package payments

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
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
	w, err := reconcile.New(f.eng, f.svc, &reconcile.Options{Clock: f.eng, Grace: time.Nanosecond})
	require.NoError(t, err)
	require.NoError(t, w.Pass(context.Background()))
	require.Equal(t, int64(1), w.Stats().NotApplied)
	assert.Zero(t, f.spent("acct_1"), "the processor never saw it: the hold came back with the release")
	r, err := f.eng.Check(context.Background())
	require.NoError(t, err)
	assert.Empty(t, r.Problems)
}
