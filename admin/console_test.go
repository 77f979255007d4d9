package admin_test

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/fakeclock"
)

// browser is a console client: a cookie jar, redirects not followed.
type browser struct {
	t    *testing.T
	srv  *httptest.Server
	c    *http.Client
	csrf string
}

func newBrowser(t *testing.T, srv *httptest.Server) *browser {
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &browser{t: t, srv: srv, c: &http.Client{Jar: jar,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// do sends a request and returns the answer's status, headers and body;
// a page's CSRF token is kept for the next POST.
func (b *browser) do(method, path string, form url.Values, header http.Header) (int, http.Header, string) {
	b.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, b.srv.URL+path, body)
	require.NoError(b.t, err)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := b.c.Do(req)
	require.NoError(b.t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(b.t, err)
	if m := csrfField.FindSubmatch(out); m != nil {
		b.csrf = string(m[1])
	}
	return resp.StatusCode, resp.Header, string(out)
}

func (b *browser) signIn() {
	b.t.Helper()
	status, h, _ := b.do("POST", "/console/login", url.Values{"token": {token}}, nil)
	require.Equal(b.t, http.StatusSeeOther, status)
	require.Equal(b.t, "/console/", h.Get("Location"))
	status, _, _ = b.do("GET", "/console/", nil, nil)
	require.Equal(b.t, http.StatusOK, status)
}

// TestConsoleSignIn: every page but the sign-in sends a browser without a
// session there; a wrong token is refused; the right one gives a session
// cookie that scripts cannot read, that no other site's request carries,
// and that ends; every answer forbids framing and foreign scripts.
func TestConsoleSignIn(t *testing.T) {
	e, srv, _ := serveAudited(t)
	_, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id("running"), Fingerprint: []byte{1}}) // a live lease on its page
	require.NoError(t, err)
	b := newBrowser(t, srv)
	status, h, _ := b.do("GET", "/console/records", nil, nil)
	require.Equal(t, http.StatusSeeOther, status)
	require.Equal(t, "/console/login", h.Get("Location"))
	require.Contains(t, h.Get("Content-Security-Policy"), "frame-ancestors 'none'")
	require.Contains(t, h.Get("Content-Security-Policy"), "script-src 'self'")
	require.Equal(t, "DENY", h.Get("X-Frame-Options"))

	status, _, page := b.do("POST", "/console/login", url.Values{"token": {"not-the-token-at-all"}}, nil)
	require.Equal(t, http.StatusUnauthorized, status)
	require.Contains(t, page, "not the admin token")

	status, h, _ = b.do("POST", "/console/login", url.Values{"token": {token}}, nil)
	require.Equal(t, http.StatusSeeOther, status)
	cookie := h.Get("Set-Cookie")
	for _, attr := range []string{"idemkv_console=", "Path=/console/", "HttpOnly", "SameSite=Strict", "Max-Age=28800"} {
		require.Contains(t, cookie, attr)
	}
	require.NotContains(t, cookie, "Secure", "plain HTTP: a Secure cookie would never come back")
	for _, page := range []string{"/console/", "/console/records", "/console/records?list=1&state=uncertain",
		"/console/unsettled", "/console/unsettled?escalated=true", "/console/outbox", "/console/sagas", "/console/overview.json",
		"/console/record?" + url.Values{"tenant": {"acct_1"}, "endpoint": {"POST /v1/payments"}, "key": {"running"}}.Encode()} {
		status, _, body := b.do("GET", page, nil, nil)
		require.Equal(t, http.StatusOK, status, "%s: %s", page, body)
	}

	status, _, _ = b.do("POST", "/console/logout", url.Values{"csrf": {b.csrf}}, nil)
	require.Equal(t, http.StatusSeeOther, status)
	status, _, _ = b.do("GET", "/console/", nil, nil)
	require.Equal(t, http.StatusSeeOther, status, "signed out")
}

// TestConsoleRefusesForgedPosts: a state-changing request without the
// session's CSRF token, or from another origin, is refused and changes
// nothing; the same request from the console's own form goes through.
func TestConsoleRefusesForgedPosts(t *testing.T) {
	e, srv, _ := serveAudited(t)
	l := uncertain(t, e, "forged")
	b := newBrowser(t, srv)
	b.signIn()
	form := func(csrf string) url.Values {
		return url.Values{"action": {"no-effect"}, "tenant": {"acct_1"}, "endpoint": {"POST /v1/payments"},
			"key": {"forged"}, "token": {"1"}, "note": {"forged"}, "csrf": {csrf}}
	}
	for name, tc := range map[string]struct {
		csrf   string
		header http.Header
	}{
		"no token":          {"", nil},
		"a wrong token":     {"AAAA" + b.csrf[4:], nil},
		"another origin":    {b.csrf, http.Header{"Origin": {"https://evil.example"}}},
		"a cross-site page": {b.csrf, http.Header{"Sec-Fetch-Site": {"cross-site"}}},
	} {
		status, _, page := b.do("POST", "/console/act", form(tc.csrf), tc.header)
		require.Equal(t, http.StatusForbidden, status, name)
		require.Contains(t, page, "Nothing was changed", name)
		rec, err := e.Get(ctx, l.ID)
		require.NoError(t, err)
		require.Equal(t, idemkv.StateUncertain, rec.State, name)
	}
	f := form(b.csrf)
	f.Set("token", "999999") // not the record's: refused as the API refuses it
	status, _, _ := b.do("POST", "/console/act", f, http.Header{"Origin": {srv.URL}, "Sec-Fetch-Site": {"same-origin"}})
	require.Equal(t, http.StatusConflict, status)
	f.Set("token", "")
	status, _, _ = b.do("POST", "/console/act", f, nil)
	require.Equal(t, http.StatusBadRequest, status)
	rec, err := e.Get(ctx, l.ID)
	require.NoError(t, err)
	require.Equal(t, idemkv.StateUncertain, rec.State)
}

// TestConsoleResolvesWithConfirmation: a record's page offers the
// actions; the confirmation page names the attempt; the POST from it
// settles the record, and its page then shows the audit entry.
func TestConsoleResolvesWithConfirmation(t *testing.T) {
	e, srv, _ := serveAudited(t)
	l := uncertain(t, e, "stuck")
	b := newBrowser(t, srv)
	b.signIn()
	q := url.Values{"tenant": {"acct_1"}, "endpoint": {"POST /v1/payments"}, "key": {"stuck"}}
	status, _, page := b.do("GET", "/console/record?"+q.Encode(), nil, nil)
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, page, "Resolve as applied")
	require.Contains(t, page, "No operator has acted")

	q.Set("action", "applied")
	status, _, page = b.do("GET", "/console/confirm?"+q.Encode(), nil, nil)
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, page, `name="token" value="`+itoa(l.Token)+`"`)
	form := url.Values{"action": {"applied"}, "tenant": {"acct_1"}, "endpoint": {"POST /v1/payments"}, "key": {"stuck"},
		"token": {itoa(l.Token)}, "note": {"ops: the processor shows the charge"}, "csrf": {b.csrf}}
	status, h, _ := b.do("POST", "/console/act", form, http.Header{"Sec-Fetch-Site": {"same-origin"}})
	require.Equal(t, http.StatusSeeOther, status)
	status, _, page = b.do("GET", h.Get("Location"), nil, nil)
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, page, "Resolved as applied")
	require.Contains(t, page, "ops: the processor shows the charge")
	rec, err := e.Get(ctx, l.ID)
	require.NoError(t, err)
	require.Equal(t, idemkv.StateCompleted, rec.State)

	status, _, _ = b.do("POST", "/console/act", form, nil) // the same form again: that attempt is settled
	require.Equal(t, http.StatusConflict, status)
}

// TestConsoleShowsHostileDataAsText: a key, a note and a result pointer
// holding markup are escaped on every page that shows them.
func TestConsoleShowsHostileDataAsText(t *testing.T) {
	e, srv, _ := serveAudited(t)
	key := `<script>alert("key")</script>`
	c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id(key), Fingerprint: []byte{1}, Mode: idemkv.ModeRemote})
	require.NoError(t, err)
	require.NoError(t, e.MarkUncertain(ctx, c.Lease, `<img src=x onerror="alert('note')">`))
	complete(t, e, `"><svg onload=alert(1)>`)
	b := newBrowser(t, srv)
	b.signIn()
	pages := []string{
		"/console/record?" + url.Values{"tenant": {"acct_1"}, "endpoint": {"POST /v1/payments"}, "key": {key}}.Encode(),
		"/console/unsettled",
		"/console/records?list=1",
		"/console/confirm?" + url.Values{"action": {"evict"}, "tenant": {"acct_1"}, "endpoint": {"POST /v1/payments"}, "key": {key}}.Encode(),
	}
	for _, p := range pages {
		status, _, page := b.do("GET", p, nil, nil)
		require.Equal(t, http.StatusOK, status, p)
		for _, raw := range []string{"<script>alert", "<img src=x", "<svg onload"} {
			require.NotContains(t, page, raw, p)
		}
	}
	_, _, page := b.do("GET", pages[0], nil, nil)
	require.Contains(t, page, "&lt;script&gt;alert(&#34;key&#34;)&lt;/script&gt;")
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }

// TestConsoleOffersEvictOnlyWhereTheStoreAllows: a record in progress is
// evicted only once abandoned, a remote one whose lease ran out (as both
// stores rule); a local one whose lease ran out is taken over by its next
// claim, never evicted, so its page offers no evict.
func TestConsoleOffersEvictOnlyWhereTheStoreAllows(t *testing.T) {
	clock := fakeclock.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	e, srv, _ := serveAuditedOn(t, clock)
	for _, k := range []struct {
		key  string
		mode idemkv.Mode
	}{{"local", idemkv.ModeLocal}, {"remote", idemkv.ModeRemote}} {
		_, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id(k.key), Fingerprint: []byte{1}, Mode: k.mode})
		require.NoError(t, err)
	}
	clock.Advance(time.Hour) // both leases ran out
	b := newBrowser(t, srv)
	b.signIn()
	evict := `action=evict`
	for key, offered := range map[string]bool{"local": false, "remote": true} {
		q := url.Values{"tenant": {"acct_1"}, "endpoint": {"POST /v1/payments"}, "key": {key}}
		status, _, page := b.do("GET", "/console/record?"+q.Encode(), nil, nil)
		require.Equal(t, http.StatusOK, status)
		require.Equal(t, offered, strings.Contains(page, evict), "%s: evict offered", key)
	}
}
