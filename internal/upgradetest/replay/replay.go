// Package replay sends an upgradetest fixture's requests again through
// the current HTTP middleware, over loopback, on a store opened from the
// fixture: the fingerprints the middleware computes today must equal the
// ones the earlier code stored.
package replay

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fingerprint"
	"github.com/idemkv/idemkv/httpidem"
	"github.com/idemkv/idemkv/internal/upgradetest"
)

// Serve serves f's routes over loopback HTTP, protected by the
// current middleware on store, each handled by h, as the earlier code's
// routes were protected: same patterns, modes, retention classes and
// fingerprint options, the tenant from "Authorization: Bearer TENANT".
func Serve(t testing.TB, f *upgradetest.Fixture, store idemkv.Store, h http.Handler) *httptest.Server {
	t.Helper()
	mw, err := httpidem.New(&httpidem.Options{Store: store, Tenant: func(r *http.Request) (string, error) {
		return strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "), nil
	}})
	require.NoError(t, err)
	mux := http.NewServeMux()
	for _, rt := range f.Routes {
		fp := &fingerprint.Options{Fields: rt.Fields, Headers: rt.Headers}
		switch rt.BodyMode {
		case "raw":
			fp.Mode = fingerprint.ModeRaw
		case "fields":
			fp.Mode = fingerprint.ModeFields
		}
		r := httpidem.Route{Pattern: rt.Pattern, Methods: []string{rt.Method}, Require: true, Retention: rt.Retention,
			Fingerprint: fp, Resumable: rt.Resumable, Lease: time.Duration(rt.LeaseSeconds) * time.Second}
		if rt.Remote {
			r.Mode = idemkv.ModeRemote
		}
		ph, err := mw.Wrap(h, r)
		require.NoError(t, err)
		mux.Handle(rt.Method+" "+rt.Pattern, ph)
	}
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// Response is an answer to Send.
type Response struct {
	Status      int
	ContentType string
	Location    string
	Replayed    bool
	Body        string
}

// Send sends q to the server at base, with its key, tenant and headers.
func Send(t testing.TB, base string, q upgradetest.Request) Response {
	t.Helper()
	req, err := http.NewRequest(q.Method, base+q.Path, strings.NewReader(q.Body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+q.Tenant)
	req.Header.Set(httpidem.HeaderKey, `"`+q.Key+`"`)
	for k, v := range q.Headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return Response{Status: resp.StatusCode, ContentType: resp.Header.Get("Content-Type"),
		Location: resp.Header.Get("Location"), Replayed: resp.Header.Get(httpidem.HeaderReplayed) == "true", Body: string(b)}
}

// RequireReplays sends every completed request of f again and requires its
// stored answer, replayed: the fingerprint the middleware computes now
// matches the one the earlier code stored.
func RequireReplays(t testing.TB, f *upgradetest.Fixture, base string) {
	t.Helper()
	qs := f.Keys(upgradetest.Completed)
	require.NotEmpty(t, qs)
	for _, q := range qs {
		got := Send(t, base, q)
		want := Response{Status: q.Status, ContentType: q.ContentType, Location: q.Location, Replayed: true, Body: q.ResponseBody}
		require.Equal(t, want, got, "%s %s key %s of %s", q.Method, q.Path, q.Key, q.Tenant)
	}
}
