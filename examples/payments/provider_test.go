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

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/httpidem"
	"github.com/idemkv/idemkv/internal/fakeclock"
)

// TestFaultScriptsEachCall: ProviderOptions.Fault decides single calls,
// overriding the rates (here every call is refused): a timeout charges
// and loses the answer, an unavailable processor charges nothing, another
// error ends the call uncounted, and nil leaves the call to the rates.
// The service cannot tell a call that ended some other way from one that
// may still land, so it leaves that payment uncertain, like a timeout.
func TestFaultScriptsEachCall(t *testing.T) {
	errGaveUp := errors.New("gave up")
	var (
		mu    sync.Mutex
		fates = []error{ErrProviderTimeout, ErrProviderUnavailable, errGaveUp}
	)
	f := newService(t, ProviderOptions{FailRate: 1, Fault: func(context.Context, string) error {
		mu.Lock()
		defer mu.Unlock()
		if len(fates) == 0 {
			return nil
		}
		fate := fates[0]
		fates = fates[1:]
		return fate
	}})
	problemOf(t, f.pay("acct_1", "order-1", order), http.StatusGatewayTimeout, "payment-outcome-unknown")
	problemOf(t, f.pay("acct_1", "order-2", order), http.StatusServiceUnavailable, "provider-unavailable")
	problemOf(t, f.pay("acct_1", "order-3", order), http.StatusGatewayTimeout, "payment-outcome-unknown")
	rec, err := f.eng.Get(context.Background(), idemkv.ID{Tenant: "acct_1", Endpoint: paymentsEndpoint, Key: "order-3"})
	require.NoError(t, err)
	assert.Equal(t, idemkv.StateUncertain, rec.State)
	assert.Contains(t, rec.Note, errGaveUp.Error())
	problemOf(t, f.pay("acct_1", "order-4", order), http.StatusServiceUnavailable, "provider-unavailable")
	assert.Equal(t, ProviderStats{Calls: 3, Charges: 1}, f.p.Stats(), "only order-1 charged; order-3 never counted")
}

// TestStalledChargeIsFencedAfterTakeover: a request that stalls on its
// way to the processor past its lease loses the key to its retry, which
// resumes the same operation under the same downstream key. When the
// stalled request wakes, the processor answers it with the retry's
// charge, and its payment row is refused together with its outcome: one
// charge, one payment, and the client's next retry replays it.
func TestStalledChargeIsFencedAfterTakeover(t *testing.T) {
	const lease = 10 * time.Second
	clock := fakeclock.New(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	eng, err := engine.Open(t.TempDir(), &engine.Options{Clock: clock, Lease: lease, NoBackgroundSweep: true})
	require.NoError(t, err)
	defer eng.Close()
	reached, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	p := NewProvider(ProviderOptions{Clock: clock, Fault: func(ctx context.Context, _ string) error {
		stall := false
		once.Do(func() { stall = true })
		if !stall {
			return nil
		}
		close(reached)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}})
	svc, err := New(Config{Store: eng, Processor: p, Heartbeat: -1, Clock: clock}) // it stalls, as a paused process does
	require.NoError(t, err)
	srv := httptest.NewServer(svc.Handler())
	defer srv.Close()
	f := &svcFixture{t: t, eng: eng, srv: srv, p: p}

	stalled := make(chan reply, 1)
	go func() { stalled <- f.pay("acct_1", "order-1", order) }()
	<-reached
	clock.Advance(lease + time.Second)
	retry := f.pay("acct_1", "order-1", order)
	require.Equal(t, http.StatusCreated, retry.status, "body: %s", retry.body)
	assert.Empty(t, retry.header.Get("Idempotent-Replayed"), "the retry ran: a takeover")
	close(release)
	problemOf(t, <-stalled, http.StatusConflict, httpidem.ProblemLeaseLost)

	assert.Equal(t, ProviderStats{Calls: 2, Charges: 1, Dedups: 1}, p.Stats(), "both attempts sent one downstream key")
	list := decode[struct {
		Data []Payment `json:"data"`
	}](t, f.send("GET", "/v1/payments", "acct_1", "", ""))
	require.Len(t, list.Data, 1, "the stalled attempt's payment row was refused with its outcome")
	assert.Equal(t, decode[Payment](t, retry), list.Data[0])
	again := f.pay("acct_1", "order-1", order)
	assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	assert.Equal(t, retry.body, again.body)

	rec, err := eng.Get(context.Background(), idemkv.ID{Tenant: "acct_1", Endpoint: "POST /v1/payments", Key: "order-1"})
	require.NoError(t, err)
	assert.Equal(t, uint32(2), rec.Attempt)
	st, err := eng.Stats()
	require.NoError(t, err)
	assert.Equal(t, int64(1), st.Takeovers)
	assert.Equal(t, int64(1), st.Fenced)
}

// The ledger keeps the last Remember charges: an older key is forgotten
// and charges again, as with a processor whose keys have expired.
func TestProviderLedgerIsBounded(t *testing.T) {
	p := NewProvider(ProviderOptions{Remember: 2})
	first, err := p.Charge(context.Background(), ChargeRequest{Key: "a", Amount: 100, Currency: "USD"})
	require.NoError(t, err)
	for _, k := range []string{"b", "c"} {
		_, err := p.Charge(context.Background(), ChargeRequest{Key: k, Amount: 100, Currency: "USD"})
		require.NoError(t, err)
	}
	_, ok, _ := p.Lookup(context.Background(), "a")
	require.False(t, ok, "the oldest charge is forgotten")
	_, ok, _ = p.Lookup(context.Background(), "c")
	require.True(t, ok)
	again, err := p.Charge(context.Background(), ChargeRequest{Key: "a", Amount: 100, Currency: "USD"})
	require.NoError(t, err)
	require.NotEqual(t, first.ID, again.ID)
	require.Equal(t, ProviderStats{Calls: 4, Charges: 4}, p.Stats())
}

// TestDeclinedCardIsAFinalAnswer: a declined card is answered 402, stored
// and replayed, and nothing is charged.
func TestDeclinedCardIsAFinalAnswer(t *testing.T) {
	f := newService(t, ProviderOptions{Fault: func(context.Context, string) error { return ErrDeclined }})
	r := f.pay("acct_1", "order-1", order)
	problemOf(t, r, http.StatusPaymentRequired, "card-declined")
	again := f.pay("acct_1", "order-1", order)
	assert.Equal(t, http.StatusPaymentRequired, again.status)
	assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	assert.Zero(t, f.p.Stats().Charges)
}

// TestLookupOfAChargeInFlight: while a call under a key is on its way to
// the simulated processor, a lookup is an error (unknown), never "never
// charged": the reconciler must not release a payment that is about to
// be charged.
func TestLookupOfAChargeInFlight(t *testing.T) {
	inside, release := make(chan struct{}), make(chan struct{})
	p := NewProvider(ProviderOptions{Fault: func(context.Context, string) error {
		close(inside)
		<-release
		return nil
	}})
	done := make(chan error, 1)
	go func() {
		_, err := p.Charge(context.Background(), ChargeRequest{Key: "k", Amount: 100, Currency: "USD"})
		done <- err
	}()
	<-inside
	_, found, err := p.Lookup(context.Background(), "k")
	assert.ErrorIs(t, err, ErrChargeInFlight)
	assert.False(t, found)
	close(release)
	require.NoError(t, <-done)
	_, found, err = p.Lookup(context.Background(), "k")
	require.NoError(t, err)
	assert.True(t, found)
}

// With a Ledger, the provider's charges outlive the process: a charge
// whose answer was lost, then a restart (the ledger's store closed and
// opened again, a new provider on it), and a lookup still finds it, and
// a retry under its key is answered with it instead of charging again.
// Concurrent calls under one key make one charge.
func TestProviderLedgerOutlivesTheProcess(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	open := func() *engine.Engine {
		e, err := engine.Open(dir, &engine.Options{NoBackgroundSweep: true})
		require.NoError(t, err)
		return e
	}
	e := open()
	p := NewProvider(ProviderOptions{Ledger: e, TimeoutRate: 1})
	req := ChargeRequest{Key: "k", Amount: 700, Currency: "EUR", Description: "order 7"}
	_, err := p.Charge(ctx, req)
	require.ErrorIs(t, err, ErrProviderTimeout, "charged, and the answer lost")
	require.NoError(t, e.Close())

	e = open()
	defer e.Close()
	p = NewProvider(ProviderOptions{Ledger: e})
	c, found, err := p.Lookup(ctx, "k")
	require.NoError(t, err)
	require.True(t, found, "the charge made before the restart")
	assert.Equal(t, Charge{ID: c.ID, Key: "k", Amount: 700, Currency: "EUR", Description: "order 7"}, c)
	again, err := p.Charge(ctx, req)
	require.NoError(t, err)
	assert.Equal(t, c, again)

	var wg sync.WaitGroup
	ids := make(chan string, 8)
	for range 8 {
		wg.Go(func() {
			c, err := p.Charge(ctx, ChargeRequest{Key: "race", Amount: 100, Currency: "USD"})
			assert.NoError(t, err)
			ids <- c.ID
		})
	}
	wg.Wait()
	close(ids)
	seen := map[string]bool{}
	for id := range ids {
		seen[id] = true
	}
	assert.Len(t, seen, 1, "one charge under one key")
	assert.Equal(t, ProviderStats{Calls: 9, Charges: 1, Dedups: 8}, p.Stats())
	assert.Len(t, p.Charges(t.Context()), 2)
}

// A call that arrives after its deadline charges nothing (ErrCallExpired,
// which reads as "nothing charged") and leaves its key free; one in time
// charges; a late call under a key already charged gets the charge back.
func TestProviderRefusesLateCalls(t *testing.T) {
	ctx := context.Background()
	clock := fakeclock.New(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	p := NewProvider(ProviderOptions{Clock: clock})
	req := ChargeRequest{Key: "k", Amount: 700, Currency: "EUR", Deadline: clock.Now().Add(-time.Nanosecond)}
	_, err := p.Charge(ctx, req)
	require.ErrorIs(t, err, ErrCallExpired)
	assert.ErrorIs(t, err, ErrProviderUnavailable, "nothing charged")
	_, found, err := p.Lookup(ctx, "k")
	require.NoError(t, err)
	assert.False(t, found)

	req.Deadline = clock.Now()
	c, err := p.Charge(ctx, req)
	require.NoError(t, err, "a call that arrives at its deadline is in time")
	clock.Advance(time.Hour)
	again, err := p.Charge(ctx, req)
	require.NoError(t, err)
	assert.Equal(t, c, again, "a late call under a charged key gets the charge back")
	assert.Equal(t, ProviderStats{Calls: 1, Charges: 1, Dedups: 1}, p.Stats())
}
