package payments_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/examples/payments"
)

// These tests run client.Transport against the payments service on a real
// engine over loopback HTTP, with the processor's answers scripted.

const order = `{"amount":5000,"currency":"USD","card":"tok_123"}`

type rig struct {
	url  string
	p    *payments.Provider
	sent *recorder
	c    *http.Client
	// waits are the backoff waits the Transport asked for.
	waits []time.Duration
}

// newRig starts the service with a processor whose calls fault answers,
// in order (nil: let it charge).
func newRig(t *testing.T, opts *client.Options, faults ...error) *rig {
	t.Helper()
	eng, err := engine.Open(t.TempDir(), &engine.Options{NoBackgroundSweep: true})
	require.NoError(t, err)
	var mu sync.Mutex
	calls := 0
	p := payments.NewProvider(payments.ProviderOptions{Fault: func(context.Context, string) error {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls <= len(faults) {
			return faults[calls-1]
		}
		return nil
	}})
	svc, err := payments.New(payments.Config{Store: eng, Processor: p})
	require.NoError(t, err)
	srv := httptest.NewServer(svc.Handler())
	t.Cleanup(func() {
		srv.Close()
		eng.Close()
	})
	r := &rig{url: srv.URL, p: p, sent: &recorder{base: http.DefaultTransport}}
	o := client.Options{}
	if opts != nil {
		o = *opts
	}
	o.After = func(d time.Duration) <-chan time.Time {
		r.waits = append(r.waits, d)
		c := make(chan time.Time, 1)
		c <- time.Time{}
		return c
	}
	r.c = client.New(r.sent, &o)
	return r
}

func (r *rig) pay(t *testing.T, key, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("POST", r.url+"/v1/payments", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer acct_1")
	if key != "" {
		req.Header.Set(client.HeaderKey, key)
	}
	resp, err := r.c.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// recorder is a base transport that records each attempt's key, and can
// lose the answer to the next attempt after the server has sent it.
type recorder struct {
	base     http.RoundTripper
	mu       sync.Mutex
	keys     []string
	loseNext atomic.Bool
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	r.mu.Lock()
	r.keys = append(r.keys, req.Header.Get(client.HeaderKey))
	r.mu.Unlock()
	resp, err := r.base.RoundTrip(req)
	if err == nil && r.loseNext.Swap(false) {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return nil, errors.New("connection reset by peer (the answer was lost)")
	}
	return resp, err
}

func (r *recorder) attempts() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.keys...)
}

// A POST without a key gets one, and keeps it on the retry after a 503:
// the processor refused before charging, the retry charges, once.
func TestKeyIsAddedAndKeptAcrossRetries(t *testing.T) {
	r := newRig(t, nil, payments.ErrProviderUnavailable)
	resp := r.pay(t, "", order)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	keys := r.sent.attempts()
	require.Len(t, keys, 2)
	require.Len(t, keys[0], 32, "a fresh key")
	require.Equal(t, keys[0], keys[1], "the same key on the retry")
	require.Equal(t, []time.Duration{time.Second}, r.waits, "the 503's Retry-After")
	require.Equal(t, 1, r.p.Stats().Charges)
	require.False(t, client.Replayed(resp))
}

// An answer lost on its way back: the retry gets the stored answer, marked
// as a replay, and nothing is charged twice.
func TestLostAnswerComesBackAsAReplay(t *testing.T) {
	r := newRig(t, nil)
	r.sent.loseNext.Store(true)
	resp := r.pay(t, "", order)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.True(t, client.Replayed(resp))
	require.Len(t, r.sent.attempts(), 2)
	require.Equal(t, 1, r.p.Stats().Charges)
}

// A 422 (the key was used for a different request) is final: no retry.
func TestNeverRetriesA422(t *testing.T) {
	r := newRig(t, nil)
	require.Equal(t, http.StatusCreated, r.pay(t, "order-1", order).StatusCode)
	resp := r.pay(t, "order-1", strings.Replace(order, "5000", "6000", 1))
	require.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode)
	require.Len(t, r.sent.attempts(), 2, "one attempt each")
	require.Empty(t, r.waits)
}

// A charge whose outcome is unknown: the retries get 409 until the
// attempts run out, the last answer is returned as it is, and the
// processor was called once.
func TestGivesUpAfterMaxAttempts(t *testing.T) {
	r := newRig(t, &client.Options{MaxAttempts: 3}, payments.ErrProviderTimeout)
	resp := r.pay(t, "", order)
	require.Equal(t, http.StatusConflict, resp.StatusCode)
	require.Len(t, r.sent.attempts(), 3)
	require.Len(t, r.waits, 2)
	st := r.p.Stats()
	require.Equal(t, 1, st.Calls)
	require.Equal(t, 1, st.Charges)
}

// A body that cannot be had again (no GetBody) is copied and sent again
// whole: the service sees the same request, not a mismatch.
func TestBodyWithoutGetBodyIsSentAgain(t *testing.T) {
	r := newRig(t, nil, payments.ErrProviderUnavailable)
	req, err := http.NewRequest("POST", r.url+"/v1/payments", io.NopCloser(strings.NewReader(order)))
	require.NoError(t, err)
	require.Nil(t, req.GetBody)
	req.Header.Set("Authorization", "Bearer acct_1")
	resp, err := r.c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Len(t, r.sent.attempts(), 2)
	require.Empty(t, req.Header.Get(client.HeaderKey), "the caller's request is not changed")
}

// Safe methods get no key.
func TestSafeMethodsGetNoKey(t *testing.T) {
	r := newRig(t, nil)
	req, err := http.NewRequest("GET", r.url+"/v1/payments", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer acct_1")
	resp, err := r.c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, []string{""}, r.sent.attempts())
}

// A caller that gives up while the Transport waits gets its context's
// error at once.
func TestCancelledWhileWaiting(t *testing.T) {
	r := newRig(t, nil, payments.ErrProviderUnavailable)
	ctx, cancel := context.WithCancel(context.Background())
	c := client.New(http.DefaultTransport, &client.Options{After: func(time.Duration) <-chan time.Time {
		cancel()
		return nil // never fires
	}})
	req, err := http.NewRequestWithContext(ctx, "POST", r.url+"/v1/payments", strings.NewReader(order))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer acct_1")
	_, err = c.Do(req)
	require.ErrorIs(t, err, context.Canceled)
}
