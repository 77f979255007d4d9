package storetest

import (
	"errors"
	"testing"

	"github.com/idemkv/idemkv"
)

// The downstream identity of a logical request (idemkv.OperationID): a
// store derives it from the request (idemkv.DeriveOperationID under a
// secret of its own), so every claim of the same request, in the same
// generation, sends the same key downstream, whatever became of the
// records in between.

// claimAcquired claims req and fails t unless it acquired.
func claimAcquired(t *testing.T, h Harness, req idemkv.ClaimRequest) idemkv.Lease {
	t.Helper()
	c, err := h.Store().Claim(ctx, req)
	must(t, err)
	if c.Outcome != idemkv.Acquired {
		t.Fatalf("claim of %v: %v, want acquired", req.ID, c.Outcome)
	}
	return c.Lease
}

// operationIdentity: a remote request's OperationID survives a release, a
// resolution with no effect, an eviction (on a store that evicts), the
// record's expiry, a takeover and a restart; it is another for another
// tenant, endpoint, key, fingerprint or generation; a local claim has
// none.
func operationIdentity(t *testing.T, newHarness NewHarness) {
	h := newHarness(t, nil)
	defer h.Close()
	id := idemkv.ID{Tenant: "t", Endpoint: "POST /pay", Key: "pay-1"}
	req := idemkv.ClaimRequest{ID: id, Fingerprint: []byte("body-1"), Mode: idemkv.ModeRemote}
	l := claimAcquired(t, h, req)
	op := l.OperationID
	if op.IsZero() {
		t.Fatalf("a remote claim without an operation id")
	}
	// same claims req again and checks it carries op, after what.
	same := func(what string) idemkv.Lease {
		t.Helper()
		l := claimAcquired(t, h, req)
		if l.OperationID != op {
			t.Fatalf("after %s: operation id %v, the request's first claim had %v", what, l.OperationID, op)
		}
		rec, err := h.Store().Get(ctx, id)
		must(t, err)
		if rec.OperationID != op {
			t.Fatalf("after %s: the record's operation id %v, the lease's %v", what, rec.OperationID, op)
		}
		return l
	}

	must(t, h.Store().Release(ctx, l, nil))
	l = same("a release")

	must(t, h.Store().MarkUncertain(ctx, l, "timeout"))
	rec, err := h.Store().Get(ctx, id)
	must(t, err)
	must(t, h.Store().Resolve(ctx, idemkv.ResolveRequest{ID: id, Token: rec.Token, NoEffect: true}))
	l = same("a resolution with no effect")

	if ev, ok := h.Store().(idemkv.Evicter); ok {
		must(t, h.Store().Complete(ctx, l, idemkv.Result{Status: 201}, nil))
		if _, err := ev.Evict(ctx, idemkv.EvictRequest{ID: id, Token: l.Token}); err != nil {
			t.Fatalf("evict: %v", err)
		}
		l = same("an eviction")
	}

	must(t, h.Store().Complete(ctx, l, idemkv.Result{Status: 201}, nil))
	h.Advance(h.Config().Retention)
	if _, err := h.Store().Get(ctx, id); !errors.Is(err, idemkv.ErrNotFound) {
		t.Fatalf("at the end of its retention: %v, want ErrNotFound", err)
	}
	same("the record's expiry")

	// A takeover resumes the stored operation, whatever generation the
	// claim that takes it over names.
	h.Advance(h.Config().Lease)
	resume := req
	resume.Resumable, resume.Generation = true, 7
	tl := claimAcquired(t, h, resume)
	if !tl.Takeover() || tl.OperationID != op {
		t.Fatalf("takeover: attempt %d, operation id %v, want a takeover of %v", tl.Attempt, tl.OperationID, op)
	}
	must(t, h.Store().Release(ctx, tl, nil))

	h.Reopen()
	l = same("a restart")
	must(t, h.Store().Release(ctx, l, nil))

	// Everything that names another logical request names another
	// identity: each claim starts a record of its own.
	seen := map[idemkv.OperationID]string{op: "the request"}
	other := func(what string, req idemkv.ClaimRequest) {
		t.Helper()
		l := claimAcquired(t, h, req)
		if l.OperationID.IsZero() {
			t.Fatalf("%s: a remote claim without an operation id", what)
		}
		if prev, ok := seen[l.OperationID]; ok {
			t.Fatalf("%s has the operation id of %s: %v", what, prev, l.OperationID)
		}
		seen[l.OperationID] = what
		must(t, h.Store().Release(ctx, l, nil))
	}
	vary := func(f func(r *idemkv.ClaimRequest)) idemkv.ClaimRequest {
		r := req
		f(&r)
		return r
	}
	other("another tenant", vary(func(r *idemkv.ClaimRequest) { r.ID.Tenant = "u" }))
	other("another endpoint", vary(func(r *idemkv.ClaimRequest) { r.ID.Endpoint = "POST /refund" }))
	other("another key", vary(func(r *idemkv.ClaimRequest) { r.ID.Key = "pay-2" }))
	other("another fingerprint", vary(func(r *idemkv.ClaimRequest) { r.Fingerprint = []byte("body-2") }))
	other("generation 1", vary(func(r *idemkv.ClaimRequest) { r.Generation = 1 }))
	other("generation 2", vary(func(r *idemkv.ClaimRequest) { r.Generation = 2 }))
	// The tenant, endpoint and key are kept apart: moving a byte from
	// one to the next names another request.
	other("a shifted scope", vary(func(r *idemkv.ClaimRequest) { r.ID.Tenant, r.ID.Endpoint = "tP", "OST /pay" }))
	must(t, h.Store().Release(ctx, same("claims of other requests"), nil))

	local := claimAcquired(t, h, idemkv.ClaimRequest{ID: idemkv.ID{Tenant: "t", Endpoint: "POST /pay", Key: "local-1"},
		Fingerprint: []byte("body-1")})
	if !local.OperationID.IsZero() {
		t.Fatalf("a local claim with operation id %v", local.OperationID)
	}
	rec, err = h.Store().Get(ctx, local.ID)
	must(t, err)
	if !rec.OperationID.IsZero() {
		t.Fatalf("a local record with operation id %v", rec.OperationID)
	}
}
