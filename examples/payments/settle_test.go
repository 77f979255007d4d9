package payments

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/httpidem"
	"github.com/idemkv/idemkv/reconcile"
)

// settleByHand settles rec as an operator does (admin.Resolve's part,
// which runs the service's Settler and commits its answer).
func (f *svcFixture) settleByHand(rec idemkv.Record, verdict reconcile.Verdict, result idemkv.Result) reconcile.Answer {
	f.t.Helper()
	ctx := context.Background()
	a, err := f.svc.Settle(ctx, rec, verdict, result)
	require.NoError(f.t, err)
	require.Equal(f.t, verdict, a.Verdict)
	require.NoError(f.t, f.eng.Resolve(ctx, idemkv.ResolveRequest{ID: rec.ID, Token: rec.Token,
		NoEffect: a.Verdict == reconcile.NotApplied, Result: a.Result, Apply: a.Apply, Note: "settled by hand"}))
	return a
}

func (f *svcFixture) record(key string) idemkv.Record {
	f.t.Helper()
	rec, err := f.eng.Get(context.Background(), idemkv.ID{Tenant: "acct_1", Endpoint: paymentsEndpoint, Key: key})
	require.NoError(f.t, err)
	return rec
}

func (f *svcFixture) requireNoData(key []byte, why string) {
	f.t.Helper()
	_, err := f.eng.GetData(f.t.Context(), key)
	require.ErrorIs(f.t, err, idemkv.ErrNotFound, why)
}

// unsure is a processor whose charges time out after charging and whose
// lookups fail while down is set.
type unsure struct {
	*Provider
	down bool
}

func (u *unsure) Lookup(ctx context.Context, key string) (Charge, bool, error) {
	if u.down {
		return Charge{}, false, errors.New("the processor is down")
	}
	return u.Provider.Lookup(ctx, key)
}

// An operator who settles a charged payment as applied writes what the
// handler writes: the payment row (GET 200), naming the processor's
// charge, and the outcome that replays it (201, byte for byte the row);
// the hold is converted, the intent deleted. If the processor cannot say,
// the row is written from the intent, without a charge id.
func TestOperatorSettlesAChargedPayment(t *testing.T) {
	for _, down := range []bool{false, true} {
		name := map[bool]string{false: "processor answers", true: "processor down"}[down]
		t.Run(name, func(t *testing.T) {
			proc := &unsure{Provider: NewProvider(ProviderOptions{TimeoutRate: 1})}
			f := newLimited(t, ProviderOptions{}, proc)
			problemOf(t, f.pay("acct_1", "k1", order1000), http.StatusGatewayTimeout, "payment-outcome-unknown")
			rec := f.record("k1")
			require.Equal(t, idemkv.StateUncertain, rec.State)
			_, err := f.eng.GetData(t.Context(), intentKey("acct_1", rec.OperationID))
			require.NoError(t, err, "the intent is recorded before the charge")

			proc.down = down
			a := f.settleByHand(rec, reconcile.Applied, idemkv.Result{Status: http.StatusCreated})
			assert.Equal(t, createdOutcome(paymentID(rec.OperationID)), a.Result, "the outcome a replay rebuilds from the row")

			replay := f.pay("acct_1", "k1", order1000)
			require.Equal(t, http.StatusCreated, replay.status, "%s", replay.body)
			assert.Equal(t, "true", replay.header.Get(httpidem.HeaderReplayed))
			p := decode[Payment](t, replay)
			assert.Equal(t, "/v1/payments/"+p.ID, replay.header.Get("Location"))
			got := f.send("GET", "/v1/payments/"+p.ID, "acct_1", "", "")
			require.Equal(t, http.StatusOK, got.status)
			assert.Equal(t, got.body, replay.body, "the replay is the row, byte for byte")
			assert.Equal(t, replay.body, f.pay("acct_1", "k1", order1000).body)
			assert.Equal(t, int64(1000), p.Amount)
			charges := proc.Charges(t.Context())
			require.Len(t, charges, 1)
			if down {
				assert.Empty(t, p.Charge, "the processor could not say which charge")
			} else {
				assert.Equal(t, charges[0].ID, p.Charge)
			}
			assert.Equal(t, int64(1000), f.spent("acct_1"), "the hold converted, counted once")
			f.requireNoData(holdKey("acct_1", rec.OperationID), "the hold is converted")
			f.requireNoData(intentKey("acct_1", rec.OperationID), "the intent is deleted")
		})
	}
}

// An operator who settles a payment as having had no effect gives its
// hold back and deletes its intent, with the record; the retry charges.
func TestOperatorSettlesAPaymentWithNoEffect(t *testing.T) {
	f := newLimited(t, ProviderOptions{}, lostCall{NewProvider(ProviderOptions{})})
	problemOf(t, f.pay("acct_1", "k1", order1000), http.StatusGatewayTimeout, "payment-outcome-unknown")
	assert.Equal(t, int64(1000), f.spent("acct_1"))
	rec := f.record("k1")
	f.settleByHand(rec, reconcile.NotApplied, idemkv.Result{})
	assert.Zero(t, f.spent("acct_1"), "the hold came back")
	f.requireNoData(holdKey("acct_1", rec.OperationID), "the hold is given back")
	f.requireNoData(intentKey("acct_1", rec.OperationID), "the intent is deleted")
	_, err := f.eng.Get(context.Background(), rec.ID)
	require.ErrorIs(t, err, idemkv.ErrNotFound)
}

// A payment begun before intents were kept, settled as applied: the
// operator's result is stored, no row written, the hold converted.
func TestOperatorSettlesAPaymentWithNoIntent(t *testing.T) {
	f := newLimited(t, ProviderOptions{}, nil)
	ctx := context.Background()
	id := idemkv.ID{Tenant: "acct_1", Endpoint: paymentsEndpoint, Key: "old"}
	c, err := f.eng.Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: []byte{1}, Mode: idemkv.ModeRemote})
	require.NoError(t, err)
	require.NoError(t, f.eng.Update(ctx, func(fx idemkv.Effects) error { return f.svc.hold(fx, "acct_1", c.Lease.OperationID, 700) }))
	require.NoError(t, f.eng.MarkUncertain(ctx, c.Lease, "timed out"))
	rec := f.record("old")
	result := httpidem.Outcome(http.StatusCreated, "", nil, []byte(`{"note":"charged, per the processor's support"}`))
	a := f.settleByHand(rec, reconcile.Applied, result)
	assert.Equal(t, result, a.Result)
	rec = f.record("old")
	assert.Equal(t, result, rec.Result)
	f.requireNoData(paymentKey("acct_1", paymentID(rec.OperationID)), "no row")
	f.requireNoData(holdKey("acct_1", rec.OperationID), "the hold is converted")
	assert.Equal(t, int64(700), f.spent("acct_1"))
}

// Records that are not payments (an order's saga step) are settled as
// the operator says, with no writes; a verdict that settles nothing is
// refused.
func TestSettleOfOtherRecords(t *testing.T) {
	svc := &Service{cfg: Config{Processor: NewProvider(ProviderOptions{}), Clock: newTicking()}}
	rec := idemkv.Record{ID: idemkv.ID{Tenant: "acct_1", Endpoint: "saga/order/authorize", Key: "ord_1"}, OperationID: idemkv.OperationID{7}}
	result := idemkv.Result{Status: 200, Body: []byte("ch_1")}
	a, err := svc.Settle(context.Background(), rec, reconcile.Applied, result)
	require.NoError(t, err)
	assert.Equal(t, reconcile.Answer{Verdict: reconcile.Applied, Result: result}, a)
	a, err = svc.Settle(context.Background(), rec, reconcile.NotApplied, idemkv.Result{})
	require.NoError(t, err)
	assert.Equal(t, reconcile.Answer{Verdict: reconcile.NotApplied}, a)
	_, err = svc.Settle(context.Background(), rec, reconcile.Unknown, result)
	require.Error(t, err)
}

// A payment whose record was evicted, or expired, runs anew when its
// request comes again: under the same operation id, derived from the
// request, it finds its payment row and answers it, charging nothing.
func TestEvictedPaymentRunsAnewAndFindsItsPayment(t *testing.T) {
	proc := &unsure{Provider: NewProvider(ProviderOptions{})}
	f := newLimited(t, ProviderOptions{}, proc)
	first := f.pay("acct_1", "k1", order1000)
	require.Equal(t, http.StatusCreated, first.status, "%s", first.body)
	rec := f.record("k1")
	_, err := f.eng.Evict(context.Background(), idemkv.EvictRequest{ID: rec.ID, Token: rec.Token})
	require.NoError(t, err)
	again := f.pay("acct_1", "k1", order1000)
	require.Equal(t, http.StatusCreated, again.status, "%s", again.body)
	assert.Empty(t, again.header.Get(httpidem.HeaderReplayed), "it ran anew")
	assert.Equal(t, first.body, again.body, "the same payment")
	assert.Equal(t, 1, proc.Stats().Calls, "charged once")
}

func TestSettledThenEvictedPaymentFindsItsPayment(t *testing.T) {
	proc := &unsure{Provider: NewProvider(ProviderOptions{TimeoutRate: 1})}
	f := newLimited(t, ProviderOptions{}, proc)
	problemOf(t, f.pay("acct_1", "k1", order1000), http.StatusGatewayTimeout, "payment-outcome-unknown")
	rec := f.record("k1")
	f.settleByHand(rec, reconcile.Applied, idemkv.Result{Status: http.StatusCreated})
	rec = f.record("k1")
	_, err := f.eng.Evict(context.Background(), idemkv.EvictRequest{ID: rec.ID, Token: rec.Token})
	require.NoError(t, err)
	again := f.pay("acct_1", "k1", order1000)
	require.Equal(t, http.StatusCreated, again.status, "%s", again.body)
}
