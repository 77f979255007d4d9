package client_test

import (
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/httpidem"
)

// lossy sends each request to the server, and loses the answer of the
// first lose of them: the operation ran, and the caller never heard.
type lossy struct {
	lose atomic.Int32
}

func (l *lossy) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err == nil && l.lose.Add(-1) >= 0 {
		resp.Body.Close()
		return nil, errors.New("connection reset")
	}
	return resp, err
}

// TestSetKeyCarriesTheOperationPastGivingUp: the Transport gives up on
// a request whose answer was lost; the caller sends the same request
// again later. With a key set by SetKey before the first send, the
// second send is the same operation, answered by replay, and Key tells
// it; without one, it would run again.
func TestSetKeyCarriesTheOperationPastGivingUp(t *testing.T) {
	e, err := engine.Open(t.TempDir(), &engine.Options{NoBackgroundSweep: true})
	require.NoError(t, err)
	defer e.Close()
	m, err := httpidem.New(&httpidem.Options{Store: e, Logger: slog.New(slog.DiscardHandler),
		Tenant: func(*http.Request) (string, error) { return "acct_1", nil }})
	require.NoError(t, err)
	var ran atomic.Int32
	h, err := m.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran.Add(1)
		w.WriteHeader(http.StatusCreated)
	}), httpidem.Route{Pattern: "/v1/charges", Require: true})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()

	base := &lossy{}
	c := client.New(base, &client.Options{MaxAttempts: 1, After: func(time.Duration) <-chan time.Time { return nil }})
	req, err := http.NewRequest("POST", srv.URL+"/v1/charges", strings.NewReader(`{"amount":5000}`))
	require.NoError(t, err)
	key := client.SetKey(req)
	require.Equal(t, key, client.SetKey(req), "a key set stays")

	base.lose.Store(1)
	_, err = c.Do(req)
	require.Error(t, err, "the answer was lost, and the Transport gave up")
	require.EqualValues(t, 1, ran.Load())
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.True(t, client.Replayed(resp), "the same operation, answered by replay")
	require.Equal(t, key, client.Key(resp))
	require.EqualValues(t, 1, ran.Load())

	// Without SetKey, the Transport's key is its own and the caller's
	// request is left as it was: a second send is a second operation.
	bare, err := http.NewRequest("POST", srv.URL+"/v1/charges", strings.NewReader(`{"amount":5000}`))
	require.NoError(t, err)
	resp, err = c.Do(bare)
	require.NoError(t, err)
	resp.Body.Close()
	require.NotEmpty(t, client.Key(resp))
	require.Empty(t, bare.Header.Get(client.HeaderKey))
	require.EqualValues(t, 2, ran.Load())
}

// TestARequestWithoutHeadersGetsAKey: a request made by hand, with no
// Header map, sent through the Transport directly (as another
// RoundTripper does), gets its key as any other.
func TestARequestWithoutHeadersGetsAKey(t *testing.T) {
	var got atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Store(r.Header.Get(client.HeaderKey))
	}))
	defer srv.Close()
	req, err := http.NewRequest("POST", srv.URL, strings.NewReader("x"))
	require.NoError(t, err)
	req.Header = nil
	resp, err := (&client.Transport{}).RoundTrip(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.NotEmpty(t, got.Load())
}
