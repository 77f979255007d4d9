package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv/examples/payments"
	"github.com/idemkv/idemkv/pgstore/pgtest"
	"github.com/idemkv/idemkv/reconcile"
)

// envScreenshots names a directory the console test saves its pages'
// screenshots in (docs/console, for docs/operations.md).
const envScreenshots = "IDEMKV_CONSOLE_SCREENSHOTS"

// envRequireChromium makes the console test fail, not skip, without
// Chromium (.ci/run sets it).
const envRequireChromium = "IDEMKV_REQUIRE_CHROMIUM"

// chromium finds the browser, or skips t.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv(envRequireChromium) != "" {
		t.Fatalf("no Chromium on PATH, and %s is set", envRequireChromium)
	}
	t.Skip("the console's browser tests need Chromium: apt-get install chromium (Debian), then run them again")
	return ""
}

// newBrowser starts a headless Chromium for t.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)), chromedp.NoSandbox, chromedp.WindowSize(1280, 900))
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	bctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	ctx, cancel := context.WithTimeout(bctx, 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// into runs a, keeping its value in dst, as one step of chromedp.Do.
func into[T any](a chromedp.Action[T], dst *T) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		v, err := a(ctx, t)
		*dst = v
		return chromedp.Void{}, err
	}
}

// shoot saves a screenshot of the page as name.png, when asked to.
func shoot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv(envScreenshots)
	if dir == "" {
		return
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644))
}

// TestConsoleInABrowser drives the console in a real headless Chromium
// against "idemkv serve" whose card processor times out on every charge:
// sign in, find a stuck payment by its key, resolve it as applied, see
// the retry get its payment and the audit entry on the record's page; a
// record whose key holds a script is shown as text; a forged cross-site
// POST is refused. It runs on both stores; the screenshots are the
// engine's.
func TestConsoleInABrowser(t *testing.T) {
	chromium(t)
	t.Run("pebble", func(t *testing.T) { consoleInABrowser(t, serveConfig{dir: t.TempDir()}, true) })
	t.Run("postgres", func(t *testing.T) {
		consoleInABrowser(t, serveConfig{dir: t.TempDir(), store: pgtest.Shared(t).CreateDatabase(t),
			adminAuditLog: filepath.Join(t.TempDir(), "audit.log")}, false)
	})
}

func consoleInABrowser(t *testing.T, cfg serveConfig, screenshots bool) {
	ctx := newBrowser(t)
	if !screenshots {
		t.Setenv(envScreenshots, "")
	}
	tokFile := filepath.Join(t.TempDir(), "admin-token")
	const tok = "console-test-admin-token"
	require.NoError(t, os.WriteFile(tokFile, []byte(tok+"\n"), 0o600))
	aln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cfg.adminLn, cfg.adminTokenFile = aln, tokFile
	cfg.provider = payments.ProviderOptions{TimeoutRate: 1}
	cfg.reconcile = reconcile.Options{Grace: time.Hour} // the operator settles it, not the reconciler
	url0, _ := startServeOn(t, cfg)
	admin := "http://" + aln.Addr().String() + "/console/"

	const key = "order-stuck-1"
	const hostile = `<script>window.pwned=1</script>`
	for _, k := range []string{key, hostile} {
		status, _, body := payOnce(t, url0, k)
		require.Equal(t, http.StatusGatewayTimeout, status, body)
	}

	var text string
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(admin),
		chromedp.WaitVisible(chromedp.ID("token"))))
	shoot(t, ctx, "login")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.ID("token"), tok),
		chromedp.Submit(chromedp.ID("token")),
		chromedp.WaitVisible(chromedp.ID("health")),
		chromedp.WaitReady(chromedp.CSS(`svg#s-claims polyline[points*=" "]`)), // the script drew a chart of two polls
		into(chromedp.Text(chromedp.ID("p-uncertain")), &text)))
	require.Equal(t, "2", text)
	// Keys reused with another amount: the page counts and charts them
	// on its own.
	for range 3 {
		req, err := http.NewRequest("POST", url0+"/v1/payments", strings.NewReader(`{"amount":7500,"currency":"USD","card":"tok_123"}`))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer acct_1")
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode)
	}
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](`document.getElementById("c-mismatches").textContent === "3"`))
	require.NoError(t, err)
	shoot(t, ctx, "overview")

	// The unsettled queue shows both, the hostile key as text.
	var pwned string
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(admin+"unsettled"),
		chromedp.WaitVisible(chromedp.CSS("table.list")),
		into(chromedp.Text(chromedp.CSS("table.list")), &text),
		into(chromedp.Evaluate[string](`typeof window.pwned`), &pwned)))
	require.Contains(t, text, key)
	require.Contains(t, text, hostile)
	require.Contains(t, text, "Next question") // serve's reconciler says when it asks
	require.Regexp(t, `\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC`, text)
	require.Equal(t, "undefined", pwned, "a key's script ran")
	shoot(t, ctx, "unsettled")

	// Find the payment by its key, from the records page.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(admin+"records?list=1&state=uncertain"),
		chromedp.WaitVisible(chromedp.ID("f-key"))))
	shoot(t, ctx, "records")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.ID("f-tenant"), "acct_1"),
		chromedp.SendKeys(chromedp.ID("f-endpoint"), "POST /v1/payments"),
		chromedp.SendKeys(chromedp.ID("f-key"), key),
		chromedp.Submit(chromedp.ID("f-key")),
		chromedp.WaitVisible(chromedp.CSS("ul.actions")),
		into(chromedp.Text(chromedp.CSS("main")), &text)))
	require.Contains(t, text, "uncertain")
	require.Contains(t, text, "No operator has acted")
	shoot(t, ctx, "record")

	// Resolve it as applied, confirmed with a note.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`ul.actions a[href*="action=applied"]`)),
		chromedp.WaitVisible(chromedp.ID("note")),
		chromedp.SendKeys(chromedp.ID("note"), "ops: the processor shows the charge")))
	shoot(t, ctx, "confirm")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS("button.danger")),
		chromedp.WaitVisible(chromedp.CSS("table.history")),
		into(chromedp.Text(chromedp.CSS("main")), &text)))
	require.Contains(t, text, "Resolved as applied")
	require.Contains(t, text, "ops: the processor shows the charge")
	require.Contains(t, text, "completed")
	shoot(t, ctx, "resolved")

	// The retry gets the payment the processor made.
	status, replayed, body := payOnce(t, url0, key)
	require.Equal(t, http.StatusCreated, status, body)
	require.Equal(t, "true", replayed)
	var pay struct{ ID, Status string }
	require.NoError(t, json.Unmarshal([]byte(body), &pay))
	require.NotEmpty(t, pay.ID)

	// A page of another site posts to the console: refused, nothing changes.
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `<!doctype html><form id="f" method="post" action="%sact">
			<input name="action" value="no-effect"><input name="tenant" value="acct_1">
			<input name="endpoint" value="POST /v1/payments"><input name="key" value=%q>
			<input name="token" value="0"><input name="note" value="forged"><input name="csrf" value="guess">
			</form><script>document.getElementById("f").submit()</script>`, admin, hostile)
	}))
	defer evil.Close()
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(evil.URL),
		chromedp.WaitVisible(chromedp.CSS("p.message")),
		into(chromedp.Text(chromedp.CSS("main")), &text)))
	require.True(t, strings.Contains(text, "Nothing was changed") || strings.Contains(text, "Sign in again"), text)
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(admin+"record?"+url.Values{"tenant": {"acct_1"}, "endpoint": {"POST /v1/payments"}, "key": {hostile}}.Encode()),
		chromedp.WaitVisible(chromedp.CSS("table.kv")),
		into(chromedp.Text(chromedp.CSS("main")), &text),
		into(chromedp.Evaluate[string](`typeof window.pwned`), &pwned)))
	require.Contains(t, text, "uncertain", "the forged resolve changed the record")
	require.Contains(t, text, hostile)
	require.Equal(t, "undefined", pwned)

	// An order whose authorization timed out: its saga waits on the
	// reconciler, and the timeline says so.
	req, err := http.NewRequest("POST", url0+"/v1/orders", strings.NewReader(`{"amount": 1200, "currency": "USD", "sku": "pen"}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer acct_1")
	req.Header.Set("Idempotency-Key", "order-saga-1")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	var order struct{ ID string }
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&order))
	resp.Body.Close()
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(admin+"sagas?"+url.Values{"saga": {"order"}, "tenant": {"acct_1"}, "id": {order.ID}}.Encode()),
		chromedp.WaitVisible(chromedp.CSS("ol.timeline")),
		into(chromedp.Text(chromedp.CSS("main")), &text)))
	require.Contains(t, text, "authorize")
	shoot(t, ctx, "sagas")

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(admin+"outbox"), chromedp.WaitVisible(chromedp.CSS("h1"))))
	shoot(t, ctx, "outbox")
}
