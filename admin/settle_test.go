package admin_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/admin"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/inbox"
	"github.com/stretchr/testify/require"
)

// serveAudited runs the admin API with an audit log.
func serveAudited(t *testing.T) (*engine.Engine, *httptest.Server, string) {
	t.Helper()
	return serveAuditedOn(t, nil)
}

// serveAuditedOn is serveAudited on an engine whose clock is clock (nil:
// the system's).
func serveAuditedOn(t *testing.T, clock idemkv.Clock) (*engine.Engine, *httptest.Server, string) {
	t.Helper()
	e, err := engine.Open(t.TempDir(), &engine.Options{NoBackgroundSweep: true, Clock: clock})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	path := filepath.Join(t.TempDir(), "audit.log")
	audit, err := admin.OpenAuditLog(path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = audit.Close() })
	h, err := admin.New(e, &admin.Options{Token: token, Audit: audit})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return e, srv, path
}

func uncertain(t *testing.T, e *engine.Engine, key string) idemkv.Lease {
	t.Helper()
	c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id(key), Fingerprint: []byte{1}, Mode: idemkv.ModeRemote})
	require.NoError(t, err)
	require.NoError(t, e.MarkUncertain(ctx, c.Lease, "timed out"))
	return c.Lease
}

// TestResolveAndEvict: resolve and evict are compare-and-sets on the
// token, each audited with the operator's note; evict refuses a record
// in progress under a live lease; a removed record's key keeps its
// history.
func TestResolveAndEvict(t *testing.T) {
	e, srv, path := serveAudited(t)
	l := uncertain(t, e, "p1")
	live, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id("p3"), Fingerprint: []byte{1}, Mode: idemkv.ModeRemote})
	require.NoError(t, err)

	body := func(key string, extra string) string {
		return fmt.Sprintf(`{"tenant":"acct_1","endpoint":"POST /v1/payments","key":%q%s}`, key, extra)
	}
	status, out, _ := call(t, srv, "POST", "/admin/v1/resolve", body("p1", fmt.Sprintf(`,"token":%d,"status":201,"body":"e30=","raw":true,"note":"ops: seen"`, l.Token+1)), token)
	require.Equal(t, http.StatusConflict, status, out)
	status, out, _ = call(t, srv, "POST", "/admin/v1/resolve", body("p1", `,"status":201,"body":"e30=","raw":true`), token)
	require.Equal(t, http.StatusBadRequest, status, "a note is required: %v", out)
	big := strings.Repeat("A", 200<<10) // base64 of 150 KiB: past the API's small-body limit, within a resolve's
	status, out, _ = call(t, srv, "POST", "/admin/v1/resolve", body("p1", `,"status":201,"body":"`+big+`","raw":true,"note":"n"`), token)
	require.Equal(t, http.StatusBadRequest, status, "the store's own body limit answers: %v", out)
	require.Contains(t, out["detail"], "body")
	status, out, _ = call(t, srv, "POST", "/admin/v1/resolve", body("p1", fmt.Sprintf(`,"token":%d,"status":201,"body":"e30=","raw":true,"note":"ops: seen"`, l.Token)), token)
	require.Equal(t, http.StatusOK, status, out)
	require.Equal(t, "uncertain", out["was"])
	rec, err := e.Get(ctx, id("p1"))
	require.NoError(t, err)
	require.Equal(t, idemkv.StateCompleted, rec.State)
	require.Equal(t, "{}", string(rec.Result.Body))
	require.Equal(t, "ops: seen", rec.Note)

	status, out, _ = call(t, srv, "POST", "/admin/v1/evict", body("p3", `,"reason":"ops: stuck"`), token)
	require.Equal(t, http.StatusConflict, status, out)
	require.Contains(t, out["detail"], "live lease")
	status, out, _ = call(t, srv, "POST", "/admin/v1/evict", body("p1", `,"token":12345,"reason":"ops: wrong"`), token)
	require.Equal(t, http.StatusConflict, status, out)
	status, out, _ = call(t, srv, "POST", "/admin/v1/evict", body("p1", `,"reason":"ops: wrong"`), token)
	require.Equal(t, http.StatusOK, status, out)
	_, err = e.Get(ctx, id("p1"))
	require.ErrorIs(t, err, idemkv.ErrNotFound)
	c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id("p1"), Fingerprint: []byte{2}})
	require.NoError(t, err)
	require.Equal(t, idemkv.Acquired, c.Outcome, "an evicted key runs anew")
	require.NoError(t, e.Release(ctx, c.Lease, nil))
	require.NoError(t, e.Release(ctx, live.Lease, nil))

	status, out, _ = call(t, srv, "GET", recordPath("p1"), "", token)
	require.Equal(t, http.StatusNotFound, status)
	require.Contains(t, out["detail"], "evict")
	require.Contains(t, out["detail"], "ops: wrong")

	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var actions []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var entry admin.AuditEntry
		require.NoError(t, json.Unmarshal(sc.Bytes(), &entry))
		actions = append(actions, entry.Action+" "+entry.Phase+" "+entry.Key+" "+entry.Note)
	}
	require.Equal(t, []string{
		"resolve begun p1 n", "resolve failed p1 n", // the store refused the body
		"resolve begun p1 ops: seen", "resolve done p1 ops: seen",
		"evict begun p3 ops: stuck", "evict failed p3 ops: stuck", // a live lease
		"evict begun p1 ops: wrong", "evict done p1 ops: wrong",
	}, actions, "every attempt the store was asked, begun before and ended after; a stale token or bad input never reaches it")
	rep, err := e.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount)
}

// TestListAndExport: the listing filters by state, tenant and age and
// pages; the export holds every record whole and ends with its counts.
func TestListAndExport(t *testing.T) {
	e, srv, _ := serveAudited(t)
	for i := range 5 {
		complete(t, e, fmt.Sprintf("c%d", i))
	}
	uncertain(t, e, "u1")
	list := func(q string) ([]any, string) {
		status, out, _ := call(t, srv, "GET", "/admin/v1/records?"+q, "", token)
		require.Equal(t, http.StatusOK, status, out)
		next, _ := out["next"].(string)
		return out["records"].([]any), next
	}
	recs, _ := list("state=uncertain")
	require.Len(t, recs, 1)
	recs, _ = list("state=in_progress")
	require.Empty(t, recs)
	recs, _ = list("state=escalated")
	require.Empty(t, recs)
	recs, _ = list("older_than=1h")
	require.Empty(t, recs)
	recs, _ = list("tenant=acct_2")
	require.Empty(t, recs)
	seen := map[string]bool{}
	for q := "limit=2"; ; {
		recs, next := list(q)
		require.LessOrEqual(t, len(recs), 2)
		for _, r := range recs {
			k := r.(map[string]any)["key"].(string)
			require.False(t, seen[k], "listed twice: %s", k)
			seen[k] = true
		}
		if next == "" {
			break
		}
		q = "limit=2&after=" + next
	}
	require.Len(t, seen, 6)

	req, err := http.NewRequestWithContext(context.Background(), "GET", srv.URL+"/admin/v1/export?outbox=true", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, "application/x-ndjson", resp.Header.Get("Content-Type"))
	kinds := map[string]int{}
	var last map[string]any
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		last = nil
		require.NoError(t, json.Unmarshal(sc.Bytes(), &last))
		kinds[last["kind"].(string)]++
		if last["kind"] == "record" && last["state"] == "completed" {
			require.Equal(t, "e30=", last["body"], "the stored body, whole")
			require.Equal(t, "01", last["fingerprint"])
		}
	}
	require.Equal(t, map[string]int{"record": 6, "outbox": 1, "end": 1}, kinds)
	require.Equal(t, "end", last["kind"])
	require.EqualValues(t, 6, last["records"])
	require.True(t, strings.HasPrefix(resp.Header.Get("Cache-Control"), "no-store"))
}

// TestNoChangeWithoutAnAuditEntry: when the audit log cannot be
// written, resolve and evict change nothing and answer 503.
func TestNoChangeWithoutAnAuditEntry(t *testing.T) {
	e, err := engine.Open(t.TempDir(), &engine.Options{NoBackgroundSweep: true})
	require.NoError(t, err)
	defer e.Close()
	audit, err := admin.OpenAuditLog(filepath.Join(t.TempDir(), "audit.log"))
	require.NoError(t, err)
	h, err := admin.New(e, &admin.Options{Token: token, Audit: audit})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	uncertain(t, e, "p1")
	require.NoError(t, audit.Close()) // every write to it fails from now on

	for path, body := range map[string]string{
		"/admin/v1/resolve": `{"tenant":"acct_1","endpoint":"POST /v1/payments","key":"p1","no_effect":true,"note":"ops"}`,
		"/admin/v1/evict":   `{"tenant":"acct_1","endpoint":"POST /v1/payments","key":"p1","reason":"ops"}`,
	} {
		status, out, _ := call(t, srv, "POST", path, body, token)
		require.Equal(t, http.StatusServiceUnavailable, status, "%s: %v", path, out)
		require.Contains(t, out["detail"], "nothing was changed")
	}
	rec, err := e.Get(ctx, id("p1"))
	require.NoError(t, err)
	require.Equal(t, idemkv.StateUncertain, rec.State)
}

// TestExportLeavesOutOnlyTheInboxsRecords: an export leaves out the inbox
// consumers' records unless asked, and keeps a service's tenant that
// happens to be named as the inbox's, whose endpoints are routes.
func TestExportLeavesOutOnlyTheInboxsRecords(t *testing.T) {
	e, err := engine.Open(t.TempDir(), &engine.Options{NoBackgroundSweep: true})
	require.NoError(t, err)
	defer e.Close()
	for _, id := range []idemkv.ID{
		{Tenant: "acct_1", Endpoint: "POST /v1/payments", Key: "order-1"},
		{Tenant: inbox.Tenant, Endpoint: "POST /v1/payments", Key: "order-1"}, // an account named "inbox"
		{Tenant: inbox.Tenant, Endpoint: "ledger", Key: "id/ev-1"},            // a consumer's mark
	} {
		c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: []byte{1}})
		require.NoError(t, err)
		require.NoError(t, e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, nil))
	}
	for _, withInbox := range []bool{false, true} {
		n, err := admin.Export(ctx, e, io.Discard, admin.ExportOptions{Inbox: withInbox})
		require.NoError(t, err)
		require.Equal(t, map[bool]int{false: 2, true: 3}[withInbox], n.Records, "inbox %v", withInbox)
	}
}
