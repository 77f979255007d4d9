package payments

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/httpidem"
	"github.com/idemkv/idemkv/reconcile"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReconcilerSettlesATimedOutPayment is the issue as a user met it: a
// payment whose processor call timed out answers 409 to its retries until
// a reconciler pass asks the processor, finds the charge, and writes the
// payment; from then on retries replay it, one charge in all.
func TestReconcilerSettlesATimedOutPayment(t *testing.T) {
	f := newService(t, ProviderOptions{TimeoutRate: 1})
	problemOf(t, f.pay("acct_1", "order-1", order), http.StatusGatewayTimeout, "payment-outcome-unknown")
	problemOf(t, f.pay("acct_1", "order-1", order), http.StatusConflict, httpidem.ProblemReconciling)
	rec := f.record("order-1")
	v, err := f.eng.GetData(t.Context(), intentKey("acct_1", rec.OperationID))
	require.NoError(t, err, "the intent is kept without an account limit too")
	assert.JSONEq(t, `{"amount":5000,"currency":"USD"}`, string(v))

	w, err := reconcile.New(f.eng, f.svc, &reconcile.Options{Clock: ahead{f.eng}, Grace: time.Nanosecond}) // the processor answers in process: nothing is in flight
	require.NoError(t, err)
	require.NoError(t, w.Pass(context.Background()))
	require.Equal(t, int64(1), w.Stats().Applied)
	f.requireNoData(intentKey("acct_1", rec.OperationID), "the payment's row took the intent's place")

	r := f.pay("acct_1", "order-1", order)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	p := decode[Payment](t, r)
	assert.Equal(t, int64(5000), p.Amount)
	again := f.pay("acct_1", "order-1", order)
	assert.Equal(t, r.body, again.body)
	got := f.send("GET", "/v1/payments/"+p.ID, "acct_1", "", "")
	assert.Equal(t, http.StatusOK, got.status)
	assert.Equal(t, ProviderStats{Calls: 1, Charges: 1}, f.p.Stats())
}

// TestReconcilerReleasesAPaymentNeverCharged: a payment whose processor
// call never left (the handler crashed, say) is found uncharged, released,
// and the retry charges it.
func TestReconcilerReleasesAPaymentNeverCharged(t *testing.T) {
	f := newService(t, ProviderOptions{})
	id := idemkv.ID{Tenant: "acct_1", Endpoint: paymentsEndpoint, Key: "order-1"}
	c, err := f.eng.Claim(context.Background(), idemkv.ClaimRequest{ID: id, Fingerprint: []byte{1}, Mode: idemkv.ModeRemote})
	require.NoError(t, err)
	require.NoError(t, f.eng.MarkUncertain(context.Background(), c.Lease, "handler crashed"))
	w, err := reconcile.New(f.eng, f.svc, &reconcile.Options{Clock: ahead{f.eng}, Grace: time.Nanosecond}) // the processor answers in process: nothing is in flight
	require.NoError(t, err)
	require.NoError(t, w.Pass(context.Background()))
	require.Equal(t, int64(1), w.Stats().NotApplied)
	r := f.pay("acct_1", "order-1", order)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	assert.Equal(t, 1, f.p.Stats().Charges)
}

// badProcessor answers lookups with what it is given.
type badProcessor struct {
	Processor
	charge Charge
	err    error
}

func (b badProcessor) Lookup(context.Context, string) (Charge, bool, error) {
	return b.charge, true, b.err
}

// TestMalformedProcessorAnswersAreUnknown: a lookup that fails, or finds
// a charge under another key, with no id, or with a bad amount or
// currency, never settles the payment.
func TestMalformedProcessorAnswersAreUnknown(t *testing.T) {
	rec := idemkv.Record{ID: idemkv.ID{Tenant: "acct_1", Endpoint: paymentsEndpoint, Key: "k"}, OperationID: idemkv.OperationID{7}}
	key := rec.OperationID.StepKey("charge")
	good := Charge{ID: "ch_1", Key: key, Amount: 100, Currency: "USD"}
	for name, b := range map[string]badProcessor{
		"error":        {err: errors.New("502 from the processor")},
		"other key":    {charge: Charge{ID: "ch_1", Key: "other", Amount: 100, Currency: "USD"}},
		"no id":        {charge: Charge{Key: key, Amount: 100, Currency: "USD"}},
		"zero amount":  {charge: Charge{ID: "ch_1", Key: key, Currency: "USD"}},
		"bad currency": {charge: Charge{ID: "ch_1", Key: key, Amount: 100, Currency: "usd"}},
	} {
		t.Run(name, func(t *testing.T) {
			svc := &Service{cfg: Config{Processor: b, Clock: newTicking()}}
			a, err := svc.Reconcile(context.Background(), rec)
			if err == nil {
				assert.Equal(t, reconcile.Unknown, a.Verdict)
			}
		})
	}
	svc := &Service{cfg: Config{Processor: badProcessor{charge: good}, Clock: newTicking()}}
	a, err := svc.Reconcile(context.Background(), rec)
	require.NoError(t, err)
	assert.Equal(t, reconcile.Applied, a.Verdict)
}

// ahead is a clock a millisecond ahead of the store's: the store keeps a
// record's uncertain mark rounded up to the millisecond, so a worker on
// the store's own clock with a grace of a nanosecond could find a record
// marked a moment ago not yet due.
type ahead struct{ idemkv.Clock }

func (a ahead) Now() time.Time { return a.Clock.Now().Add(time.Millisecond) }
