package admin_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv/admin"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/internal/fakeclock"
)

// TestWrongTokensAreThrottledByAddress: an address that sent 100
// different wrong tokens has its next token refused with 429 and
// Retry-After before it is compared, the right one too, until the store's
// clock has given it another try; on the console's sign-in as on the API.
// Another address, and a request without a token, are not held back; an
// IPv6 client counts by its /64. A wrong token sent again costs nothing.
func TestWrongTokensAreThrottledByAddress(t *testing.T) {
	clock := fakeclock.New(time.Date(2031, 5, 6, 10, 0, 0, 0, time.UTC))
	e, err := engine.Open(t.TempDir(), &engine.Options{NoBackgroundSweep: true, Clock: clock})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	h, err := admin.New(e, &admin.Options{Token: token, Now: e.Now})
	require.NoError(t, err)
	api := func(from, tok string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", "/admin/v1/records", nil)
		r.RemoteAddr = from
		if tok != "" {
			r.Header.Set("Authorization", "Bearer "+tok)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	signIn := func(from, tok string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", "/console/login", strings.NewReader(url.Values{"token": {tok}}.Encode()))
		r.RemoteAddr = from
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.Header.Set("Origin", "http://example.com")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	const wrong = "not-the-admin-token-at-all"

	for _, c := range []struct {
		name        string
		try         func(from, tok string) *httptest.ResponseRecorder
		ok          int
		guesser     string
		elsewhere   string
		sameNetwork string
	}{
		{"api", api, http.StatusOK, "192.0.2.7:40000", "192.0.2.8:40000", "192.0.2.7:40001"},
		{"console", signIn, http.StatusSeeOther, "[2001:db8:1:2::7]:40000", "[2001:db8:1:3::7]:40000", "[2001:db8:1:2::8]:40000"},
	} {
		t.Run(c.name, func(t *testing.T) {
			for range 300 {
				require.Equal(t, http.StatusUnauthorized, c.try(c.guesser, wrong).Code, "a stale token, again and again")
			}
			for i := range 99 {
				require.Equal(t, http.StatusUnauthorized, c.try(c.guesser, wrong+strconv.Itoa(i)).Code, "wrong token %d", i+2)
			}
			w := c.try(c.guesser, token)
			require.Equal(t, http.StatusTooManyRequests, w.Code, "the right token is not compared either")
			require.Equal(t, "1", w.Header().Get("Retry-After"))
			require.Equal(t, http.StatusTooManyRequests, c.try(c.sameNetwork, token).Code, "the same host (or /64)")
			require.Equal(t, c.ok, c.try(c.elsewhere, token).Code, "another address is not held back")
			if c.name == "api" {
				require.Equal(t, http.StatusUnauthorized, api(c.guesser, "").Code, "no token: nothing to hold back")
			}

			clock.Advance(time.Second)
			require.Equal(t, c.ok, c.try(c.guesser, token).Code, "one try back")
			require.Equal(t, http.StatusUnauthorized, c.try(c.guesser, wrong+"-next").Code)
			require.Equal(t, http.StatusTooManyRequests, c.try(c.guesser, token).Code, "and spent on a wrong token")
			clock.Advance(time.Hour)
		})
	}
}
