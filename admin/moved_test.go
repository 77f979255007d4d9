package admin_test

import (
	"context"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/admin"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/reconcile"
)

// openAudited opens an engine on clock and an audit log.
func openAudited(t *testing.T, clock idemkv.Clock) (*engine.Engine, *admin.AuditLog) {
	t.Helper()
	e, err := engine.Open(t.TempDir(), &engine.Options{NoBackgroundSweep: true, Clock: clock})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	audit, err := admin.OpenAuditLog(filepath.Join(t.TempDir(), "audit.log"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = audit.Close() })
	return e, audit
}

// TestVerifiedResolveOfARecordThatMoved: a verified "no effect" of an
// abandoned record; while the reconciler is asked (and finds no charge),
// the holder wakes, renews its lease, sends its call and marks the
// record uncertain, under the same token. The answer predates the call:
// the resolution is refused, and the record stays for the reconciler.
func TestVerifiedResolveOfARecordThatMoved(t *testing.T) {
	clock := fakeclock.New(time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC))
	e, audit := openAudited(t, clock)
	c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id("p1"), Fingerprint: []byte{1}, Mode: idemkv.ModeRemote, Lease: time.Second})
	require.NoError(t, err)
	clock.Advance(2 * time.Second) // abandoned
	r := reconcile.ReconcilerFunc(func(ctx context.Context, rec idemkv.Record) (reconcile.Answer, error) {
		l, err := e.Renew(ctx, c.Lease, 5*time.Second)
		require.NoError(t, err)
		clock.Advance(100 * time.Millisecond)
		require.NoError(t, e.MarkUncertain(ctx, l, "the charge timed out"))
		return reconcile.Answer{Verdict: reconcile.NotApplied}, nil
	})
	_, err = admin.Resolve(ctx, e, audit, admin.ResolveRequest{Tenant: "acct_1", Endpoint: "POST /v1/payments", Key: "p1",
		Token: c.Lease.Token, NoEffect: true, Verify: true, Note: "ops: verify"}, &admin.ResolveOptions{Reconciler: r})
	require.ErrorIs(t, err, idemkv.ErrFenced)
	rec, err := e.Get(ctx, id("p1"))
	require.NoError(t, err, "the record whose call went out is kept")
	require.Equal(t, idemkv.StateUncertain, rec.State)

	// The same with the operator's Since later than the record showed
	// (the moment they looked): the store still judges from Resolve's
	// own read.
	c, err = e.Claim(ctx, idemkv.ClaimRequest{ID: id("p2"), Fingerprint: []byte{1}, Mode: idemkv.ModeRemote, Lease: time.Second})
	require.NoError(t, err)
	clock.Advance(2 * time.Second)
	_, err = admin.Resolve(ctx, e, audit, admin.ResolveRequest{Tenant: "acct_1", Endpoint: "POST /v1/payments", Key: "p2",
		Token: c.Lease.Token, Since: clock.Now().Add(10 * time.Second), NoEffect: true, Verify: true, Note: "ops: verify"},
		&admin.ResolveOptions{Reconciler: r})
	require.ErrorIs(t, err, idemkv.ErrFenced, "a late Since")
}

// TestOperatorWriteOfARecordThatMovedSinceShown: an operator judged a
// record as it was shown (ResolveRequest.Since, EvictRequest.Since); its
// attempt renewed and marked it since, keeping its token. Both writes are
// refused; judged from the record as it stands, they go through.
func TestOperatorWriteOfARecordThatMovedSinceShown(t *testing.T) {
	clock := fakeclock.New(time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC))
	e, audit := openAudited(t, clock)
	c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id("p1"), Fingerprint: []byte{1}, Mode: idemkv.ModeRemote, Lease: time.Second})
	require.NoError(t, err)
	clock.Advance(2 * time.Second)
	shown, err := e.Get(ctx, id("p1"))
	require.NoError(t, err)
	l, err := e.Renew(ctx, c.Lease, 5*time.Second)
	require.NoError(t, err)
	clock.Advance(time.Second)
	require.NoError(t, e.MarkUncertain(ctx, l, "the charge timed out"))

	_, err = admin.Resolve(ctx, e, audit, admin.ResolveRequest{Tenant: "acct_1", Endpoint: "POST /v1/payments", Key: "p1",
		Token: shown.Token, Since: shown.LeaseExpires, NoEffect: true, Note: "ops: never charged"}, nil)
	require.ErrorIs(t, err, idemkv.ErrFenced)
	_, err = admin.Evict(ctx, e, audit, admin.EvictRequest{Tenant: "acct_1", Endpoint: "POST /v1/payments", Key: "p1",
		Token: shown.Token, Since: shown.LeaseExpires, Reason: "ops: clear it"})
	require.ErrorIs(t, err, idemkv.ErrFenced)
	now, err := e.Get(ctx, id("p1"))
	require.NoError(t, err)
	_, err = admin.Resolve(ctx, e, audit, admin.ResolveRequest{Tenant: "acct_1", Endpoint: "POST /v1/payments", Key: "p1",
		Token: now.Token, Since: now.Marked, Status: 201, Note: "ops: the processor shows the charge"}, nil)
	require.NoError(t, err)
}

// TestSagaRecordsAreNotHTTPResponses: an applied resolution of a saga's
// record must hold the saga's output (raw) or the reconciler's answer,
// never an HTTP response the saga would take for its step's output.
func TestSagaRecordsAreNotHTTPResponses(t *testing.T) {
	e, audit := openAudited(t, nil)
	step := idemkv.ID{Tenant: "acct_1", Endpoint: "saga/order/do/authorize", Key: "o1"}
	c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: step, Fingerprint: []byte{1}, Mode: idemkv.ModeRemote})
	require.NoError(t, err)
	require.NoError(t, e.MarkUncertain(ctx, c.Lease, "timed out"))
	req := admin.ResolveRequest{Tenant: step.Tenant, Endpoint: step.Endpoint, Key: step.Key, Note: "ops: authorized"}
	_, err = admin.Resolve(ctx, e, audit, req, nil)
	require.ErrorIs(t, err, idemkv.ErrInvalidArgument)
	req.Raw, req.Body = true, []byte("auth_123")
	_, err = admin.Resolve(ctx, e, audit, req, nil)
	require.NoError(t, err)
	rec, err := e.Get(ctx, step)
	require.NoError(t, err)
	require.Equal(t, "auth_123", string(rec.Result.Body))
}

// TestConsoleRefusesARecordThatMovedAfterTheConfirmPage: the confirm
// page carries the moment the record was shown; an attempt that renews
// and marks the record before the operator submits keeps its token, and
// the action is still refused.
func TestConsoleRefusesARecordThatMovedAfterTheConfirmPage(t *testing.T) {
	clock := fakeclock.New(time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC))
	e, srv, _ := serveAuditedOn(t, clock)
	c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id("p1"), Fingerprint: []byte{1}, Mode: idemkv.ModeRemote, Lease: time.Second})
	require.NoError(t, err)
	clock.Advance(2 * time.Second)
	b := newBrowser(t, srv)
	b.signIn()
	q := url.Values{"tenant": {"acct_1"}, "endpoint": {"POST /v1/payments"}, "key": {"p1"}, "action": {"no-effect"}}
	status, _, page := b.do("GET", "/console/confirm?"+q.Encode(), nil, nil)
	require.Equal(t, http.StatusOK, status)
	since := regexp.MustCompile(`name="since" value="([^"]+)"`).FindStringSubmatch(page)
	require.NotNil(t, since, "the form carries the moment shown")

	l, err := e.Renew(ctx, c.Lease, 5*time.Second)
	require.NoError(t, err)
	clock.Advance(time.Second)
	require.NoError(t, e.MarkUncertain(ctx, l, "the charge timed out"))
	form := url.Values{"action": {"no-effect"}, "tenant": {"acct_1"}, "endpoint": {"POST /v1/payments"}, "key": {"p1"},
		"token": {itoa(c.Lease.Token)}, "since": {since[1]}, "note": {"ops: never charged"}, "csrf": {b.csrf}}
	status, _, _ = b.do("POST", "/console/act", form, http.Header{"Sec-Fetch-Site": {"same-origin"}})
	require.Equal(t, http.StatusConflict, status)
	rec, err := e.Get(ctx, id("p1"))
	require.NoError(t, err)
	require.Equal(t, idemkv.StateUncertain, rec.State)
}

// TestConsoleOffersNoHTTPOutcomeForSagaRecords: a saga action's record
// is offered no "Resolve as applied" (its outcome is the step's output);
// the saga's own record, which its runner takes over, is offered nothing
// until it is escalated.
func TestConsoleOffersNoHTTPOutcomeForSagaRecords(t *testing.T) {
	clock := fakeclock.New(time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC))
	e, srv, _ := serveAuditedOn(t, clock)
	step := idemkv.ID{Tenant: "acct_1", Endpoint: "saga/order/do/authorize", Key: "o1"}
	own := idemkv.ID{Tenant: "acct_1", Endpoint: "saga/order", Key: "o1"}
	c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: step, Fingerprint: []byte{1}, Mode: idemkv.ModeRemote})
	require.NoError(t, err)
	require.NoError(t, e.MarkUncertain(ctx, c.Lease, "timed out"))
	_, err = e.Claim(ctx, idemkv.ClaimRequest{ID: own, Fingerprint: []byte{1}, Mode: idemkv.ModeRemote, Resumable: true, Lease: time.Second})
	require.NoError(t, err)
	clock.Advance(2 * time.Second) // the saga's record is abandoned
	b := newBrowser(t, srv)
	b.signIn()
	page := func(id idemkv.ID) string {
		q := url.Values{"tenant": {id.Tenant}, "endpoint": {id.Endpoint}, "key": {id.Key}}
		status, _, page := b.do("GET", "/console/record?"+q.Encode(), nil, nil)
		require.Equal(t, http.StatusOK, status)
		return page
	}
	p := page(step)
	require.NotContains(t, p, "action=applied")
	require.Contains(t, p, "action=no-effect")
	p = page(own)
	require.NotContains(t, p, "action=applied")
	require.NotContains(t, p, "action=no-effect")
	require.NotContains(t, p, "action=evict")
}

// TestAuditLogCutsATornEntry: a crash in the middle of an append leaves
// part of an entry at the end of the log; the next process cuts it off,
// so its own entries start lines of their own and are all read back.
func TestAuditLogCutsATornEntry(t *testing.T) {
	e, err := engine.Open(t.TempDir(), &engine.Options{NoBackgroundSweep: true})
	require.NoError(t, err)
	defer e.Close()
	path := filepath.Join(t.TempDir(), "audit.log")
	whole := `{"time":"2026-12-07T12:00:00Z","action":"evict","phase":"begun","tenant":"acct_1","endpoint":"POST /v1/payments","key":"p0","was":"uncertain","token":1,"outcome":"removed","note":"n"}` + "\n"
	require.NoError(t, os.WriteFile(path, []byte(whole+`{"time":"2026-12-07T12:00:01Z","action":"resolve","phase":"begun","tenant":"acct_1","endp`), 0o600))
	audit, err := admin.OpenAuditLog(path)
	require.NoError(t, err)
	defer audit.Close()
	uncertain(t, e, "p1")
	_, err = admin.Resolve(ctx, e, audit, admin.ResolveRequest{Tenant: "acct_1", Endpoint: "POST /v1/payments", Key: "p1",
		NoEffect: true, Note: "ops: never charged"}, nil)
	require.NoError(t, err)
	h, err := audit.History(id("p1"))
	require.NoError(t, err)
	require.Len(t, h, 2, "begun and done")
	h, err = audit.History(id("p0"))
	require.NoError(t, err)
	require.Len(t, h, 1, "the whole entry before the torn one stays")
}
