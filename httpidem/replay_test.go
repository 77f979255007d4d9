package httpidem_test

import (
	"compress/gzip"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv/httpidem"
)

// TestReplayReplacesHeadersSetBeforeIt: an outer handler sets a default
// Content-Type before the middleware runs, and the protected handler sets
// its own. The first answer carries the handler's value alone, and so
// does the replay: a stored header replaces what was set before, as the
// handler's own write did, rather than being added beside it.
func TestReplayReplacesHeadersSetBeforeIt(t *testing.T) {
	f := newFixture(t, httpidem.Route{}, func(http.ResponseWriter, *http.Request) {})
	m, err := httpidem.New(&httpidem.Options{Store: f.eng, Tenant: bearer, Clock: f.clock, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	wrapped, err := m.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/csv")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, "a,b\n")
	}), httpidem.Route{Pattern: route})
	require.NoError(t, err)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json") // the API's default
		wrapped.ServeHTTP(w, r)
	}))
	defer srv.Close()

	send := func() *http.Response {
		req, err := http.NewRequest("POST", srv.URL+route, strings.NewReader(`{}`))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer acct_1")
		req.Header.Set("Idempotency-Key", `"k1"`)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, err = io.Copy(io.Discard, resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		return resp
	}
	first, again := send(), send()
	require.Equal(t, http.StatusCreated, first.StatusCode)
	require.Equal(t, []string{"text/csv"}, first.Header.Values("Content-Type"))
	require.Equal(t, "true", again.Header.Get(httpidem.HeaderReplayed))
	require.Equal(t, []string{"text/csv"}, again.Header.Values("Content-Type"))
}

// TestReplayOfACompressedBody: a handler that compresses its own body
// sets Content-Encoding; the replay, which carries the same bytes, carries
// it too, so that the client reads the same body both times.
func TestReplayOfACompressedBody(t *testing.T) {
	f := newFixture(t, httpidem.Route{}, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Encoding", "gzip")
		w.WriteHeader(http.StatusCreated)
		zw := gzip.NewWriter(w)
		_, err := zw.Write([]byte(`{"id":"t_1"}`))
		require.NoError(t, err)
		require.NoError(t, zw.Close())
	})
	first := f.do("POST", route, `{}`, "k") // the client asks for gzip and inflates it
	require.Equal(t, `{"id":"t_1"}`, string(first.body))
	again := f.do("POST", route, `{}`, "k")
	require.Equal(t, "true", again.header.Get(httpidem.HeaderReplayed))
	require.Equal(t, string(first.body), string(again.body))
}
