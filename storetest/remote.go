package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
)

// What a reconciler's grace is measured from: when a record was marked
// uncertain (Record.Marked), and until when a remote holder could call
// downstream (Record.LeaseExpires, as renewed, durably).

// markedWithin fails t unless marked is a moment from from (to the
// millisecond) to to: a Marked rounded down to the second, or read from
// another clock, falls outside.
func markedWithin(t *testing.T, what string, marked, from, to time.Time) {
	t.Helper()
	if marked.IsZero() || marked.Before(from.Truncate(time.Millisecond)) || marked.After(to) {
		t.Fatalf("%s: marked %v, want from %v to %v", what, marked, from, to)
	}
}

// unmarked fails t unless rec carries no Marked.
func unmarked(t *testing.T, what string, rec idemkv.Record) {
	t.Helper()
	if !rec.Marked.IsZero() {
		t.Fatalf("%s: a %v record marked %v", what, rec.State, rec.Marked)
	}
}

// markedUncertain: Record.Marked is when the record was marked
// uncertain, by its holder or by a claim that found its remote lease run
// out, to the millisecond, durably; every read of the record carries it
// (Get, Claim, List, Scan), and a record in any other state has none.
func markedUncertain(t *testing.T, newHarness NewHarness) {
	h := newHarness(t, nil)
	defer h.Close()
	// The clock off the whole second and off the previous record's
	// time, so that a Marked rounded to the second, or taken from the
	// claim, is seen.
	h.Advance(1337 * time.Millisecond)
	remote := func(key string, lease time.Duration) idemkv.ClaimRequest {
		return idemkv.ClaimRequest{ID: idemkv.ID{Tenant: "t", Endpoint: "POST /pay", Key: key}, Fingerprint: []byte("fp"),
			Mode: idemkv.ModeRemote, Lease: lease}
	}
	get := func(id idemkv.ID) idemkv.Record {
		t.Helper()
		rec, err := h.Store().Get(ctx, id)
		must(t, err)
		return rec
	}

	// By the holder.
	byHolder := remote("m-1", 0)
	l := claimAcquired(t, h, byHolder)
	unmarked(t, "claimed", get(byHolder.ID))
	h.Advance(2*time.Second + 250*time.Millisecond)
	from := h.Now()
	if from.Truncate(time.Millisecond).Equal(from.Truncate(time.Second)) {
		t.Fatalf("the test's clock reads a whole second: %v", from)
	}
	must(t, h.Store().MarkUncertain(ctx, l, "timeout"))
	to := h.Now()
	rec := get(byHolder.ID)
	if rec.State != idemkv.StateUncertain {
		t.Fatalf("after MarkUncertain: %v", rec.State)
	}
	markedWithin(t, "MarkUncertain", rec.Marked, from, to)
	marked1 := rec.Marked

	// By a claim that finds the remote lease run out and cannot resume
	// the operation.
	byClaim := remote("m-2", 5*time.Second)
	claimAcquired(t, h, byClaim)
	h.Advance(5*time.Second + 111*time.Millisecond)
	from = h.Now()
	c, err := h.Store().Claim(ctx, byClaim)
	must(t, err)
	to = h.Now()
	if c.Outcome != idemkv.Reconciling {
		t.Fatalf("claim of an abandoned remote record: %v, want reconciling", c.Outcome)
	}
	markedWithin(t, "the claim's answer", c.Record.Marked, from, to)
	rec = get(byClaim.ID)
	markedWithin(t, "a claim that found the lease run out", rec.Marked, from, to)
	marked2 := rec.Marked

	// A retry reads it from the claim's answer; a reconciler from List,
	// and an operator from Scan; all of it survives a restart.
	h.Advance(3 * time.Second)
	h.Reopen()
	for key, want := range map[idemkv.ID]time.Time{byHolder.ID: marked1, byClaim.ID: marked2} {
		if got := get(key).Marked; !got.Equal(want) {
			t.Fatalf("%v after a restart: marked %v, was %v", key.Key, got, want)
		}
		c, err := h.Store().Claim(ctx, remote(key.Key, 0))
		must(t, err)
		if c.Outcome != idemkv.Reconciling || !c.Record.Marked.Equal(want) {
			t.Fatalf("retry of %v: %v marked %v, want reconciling marked %v", key.Key, c.Outcome, c.Record.Marked, want)
		}
	}
	wantMarked := map[string]time.Time{"m-1": marked1, "m-2": marked2}
	read := func(what string, recs []idemkv.Record) {
		t.Helper()
		if len(recs) != len(wantMarked) {
			t.Fatalf("%s: %d records, want the %d uncertain ones: %+v", what, len(recs), len(wantMarked), recs)
		}
		for _, r := range recs {
			if want := wantMarked[r.ID.Key]; !r.Marked.Equal(want) {
				t.Fatalf("%s: %v marked %v, want %v", what, r.ID.Key, r.Marked, want)
			}
		}
	}
	page, err := h.Store().List(ctx, idemkv.ListRequest{})
	must(t, err)
	read("List", page.Records)
	if sc, ok := h.Store().(idemkv.Scanner); ok {
		page, err := sc.Scan(ctx, idemkv.ScanRequest{State: idemkv.StateUncertain})
		must(t, err)
		read("Scan", page.Records)
	}

	// Nothing else is marked: a record settled, or claimed again.
	must(t, h.Store().Resolve(ctx, idemkv.ResolveRequest{ID: byHolder.ID, Token: l.Token, Result: idemkv.Result{Status: 201}}))
	unmarked(t, "resolved", get(byHolder.ID))
	must(t, h.Store().Resolve(ctx, idemkv.ResolveRequest{ID: byClaim.ID, Token: get(byClaim.ID).Token, NoEffect: true}))
	again := claimAcquired(t, h, byClaim)
	unmarked(t, "claimed after a resolution with no effect", get(byClaim.ID))
	must(t, h.Store().Complete(ctx, again, idemkv.Result{Status: 201}, nil))
	unmarked(t, "completed", get(byClaim.ID))
	loc := claimAcquired(t, h, idemkv.ClaimRequest{ID: idemkv.ID{Tenant: "t", Endpoint: "POST /pay", Key: "m-3"}, Fingerprint: []byte("fp")})
	unmarked(t, "a local claim", get(loc.ID))
}

// remoteRenewal: a remote holder's Renew is what the record says (Get's
// LeaseExpires), also after a restart, and what a retry is held off by:
// the contract makes a remote claim's renewal durable, since it bounds
// when the holder could last have called downstream.
func remoteRenewal(t *testing.T, newHarness NewHarness) {
	h := newHarness(t, nil)
	defer h.Close()
	req := idemkv.ClaimRequest{ID: idemkv.ID{Tenant: "t", Endpoint: "POST /pay", Key: "r-1"}, Fingerprint: []byte("fp"),
		Mode: idemkv.ModeRemote, Lease: 10 * time.Second}
	l := claimAcquired(t, h, req)
	h.Advance(4 * time.Second)
	nl, err := h.Store().Renew(ctx, l, time.Minute)
	must(t, err)
	if want := h.Now().Add(time.Minute); !nl.Expires.Equal(want) || nl.Token != l.Token {
		t.Fatalf("renewed lease %+v, want token %d expiring %v", nl, l.Token, want)
	}
	check := func(what string) {
		t.Helper()
		rec, err := h.Store().Get(ctx, req.ID)
		must(t, err)
		if rec.State != idemkv.StateInProgress || !rec.LeaseExpires.Equal(nl.Expires) {
			t.Fatalf("%s: %v, lease expires %v, want in progress until %v", what, rec.State, rec.LeaseExpires, nl.Expires)
		}
	}
	check("after Renew")
	h.Reopen()
	check("after a restart")

	// Past the lease it was claimed with: a retry waits for the renewed
	// one, and no reconciler lists the record as abandoned.
	h.Advance(10 * time.Second)
	c, err := h.Store().Claim(ctx, req)
	must(t, err)
	if c.Outcome != idemkv.InProgress || c.RetryAfter != nl.Expires.Sub(h.Now()) {
		t.Fatalf("retry under the renewed lease: %v, retry after %v, want in progress for %v", c.Outcome, c.RetryAfter, nl.Expires.Sub(h.Now()))
	}
	page, err := h.Store().List(ctx, idemkv.ListRequest{})
	must(t, err)
	for _, r := range page.Records {
		if r.ID == req.ID {
			t.Fatalf("a record under a renewed lease listed as abandoned")
		}
	}
	must(t, h.Store().Complete(ctx, nl, idemkv.Result{Status: 201}, nil))
	if _, err := h.Store().Renew(ctx, nl, time.Minute); !errors.Is(err, idemkv.ErrFenced) {
		t.Fatalf("renew after the outcome: %v, want ErrFenced", err)
	}
}

// resolveSince: a resolution decided from a record as read
// (ResolveRequest.Since) is refused with ErrFenced once the record's
// holder has renewed its lease, or marked it uncertain, after that
// moment: its call may have gone out after the downstream was asked. A
// resolution decided from the record as it stands goes through, and one
// without Since is the operator's, made on the operator's word. Escalate
// and Evict take Since as Resolve does.
func resolveSince(t *testing.T, newHarness NewHarness) {
	h := newHarness(t, nil)
	defer h.Close()
	h.Advance(1337 * time.Millisecond)
	req := func(key string) idemkv.ClaimRequest {
		return idemkv.ClaimRequest{ID: idemkv.ID{Tenant: "t", Endpoint: "POST /pay", Key: key}, Fingerprint: []byte("fp"),
			Mode: idemkv.ModeRemote, Lease: 5 * time.Second}
	}
	listed := func(id idemkv.ID) idemkv.Record {
		t.Helper()
		rec, err := h.Store().Get(ctx, id)
		must(t, err)
		return rec
	}
	resolve := func(rec idemkv.Record, since time.Time) error {
		return h.Store().Resolve(ctx, idemkv.ResolveRequest{ID: rec.ID, Token: rec.Token, NoEffect: true, Since: since})
	}
	fenced := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, idemkv.ErrFenced) {
			t.Fatalf("%s: %v, want ErrFenced", what, err)
		}
	}

	// renewed claims key and lets its lease run out; seen is the record
	// then, as a reconciler lists it. Its holder renews it after all and
	// lets the new lease run out too.
	renewed := func(key string) (seen idemkv.Record) {
		t.Helper()
		r := req(key)
		l := claimAcquired(t, h, r)
		h.Advance(6 * time.Second) // abandoned
		seen = listed(r.ID)
		if _, err := h.Store().Renew(ctx, l, 5*time.Second); err != nil {
			t.Fatalf("a renewal after the lease ran out, before any takeover: %v", err)
		}
		h.Advance(6 * time.Second) // abandoned again
		return seen
	}
	// marked is renewed's record marked uncertain by its holder instead.
	marked := func(key string) (seen idemkv.Record) {
		t.Helper()
		r := req(key)
		l := claimAcquired(t, h, r)
		h.Advance(6 * time.Second)
		seen = listed(r.ID)
		h.Advance(250 * time.Millisecond)
		must(t, h.Store().MarkUncertain(ctx, l, "timeout"))
		return seen
	}

	// Renewed after its lease ran out, past the moment the resolution
	// was decided from.
	seen := renewed("since-renewed")
	fenced("renewed since", resolve(seen, seen.LeaseExpires))
	now := listed(seen.ID)
	must(t, resolve(now, now.LeaseExpires))

	// Marked uncertain by its holder after it was read abandoned.
	seen = marked("since-marked")
	fenced("marked since", resolve(seen, seen.LeaseExpires))
	now = listed(seen.ID)
	must(t, resolve(now, now.Marked))

	// Escalate takes Since as Resolve does: giving up on a record whose
	// holder renewed it since would fence off an attempt running again.
	seen = renewed("since-escalated")
	escalate := func(rec idemkv.Record, since time.Time) error {
		return h.Store().Escalate(ctx, idemkv.EscalateRequest{ID: rec.ID, Token: rec.Token, Note: "gave up", Since: since})
	}
	fenced("escalated, renewed since", escalate(seen, seen.LeaseExpires))
	if got := listed(seen.ID); got.State != idemkv.StateInProgress || got.Escalated {
		t.Fatalf("a refused escalation changed the record: %+v", got)
	}
	now = listed(seen.ID)
	must(t, escalate(now, now.LeaseExpires))
	if got := listed(seen.ID); !got.Escalated {
		t.Fatalf("escalated from the record as it stands: %+v, want escalated", got)
	}

	// Evict takes Since too, where the store evicts.
	if ev, ok := h.Store().(idemkv.Evicter); ok {
		seen = marked("since-evicted")
		_, err := ev.Evict(ctx, idemkv.EvictRequest{ID: seen.ID, Token: seen.Token, Since: seen.LeaseExpires})
		fenced("evicted, marked since", err)
		now = listed(seen.ID)
		_, err = ev.Evict(ctx, idemkv.EvictRequest{ID: seen.ID, Token: now.Token, Since: now.Marked})
		must(t, err)

		// Read abandoned, then completed by its holder after all: the
		// eviction was decided on an unsettled record, and must not
		// forget an outcome no one judged.
		r := req("since-completed")
		l := claimAcquired(t, h, r)
		h.Advance(6 * time.Second)
		seen = listed(r.ID)
		must(t, h.Store().Complete(ctx, l, idemkv.Result{Status: 201}, nil))
		_, err = ev.Evict(ctx, idemkv.EvictRequest{ID: seen.ID, Token: seen.Token, Since: seen.LastCall()})
		fenced("evicted, completed since", err)
		if got := listed(seen.ID); got.State != idemkv.StateCompleted {
			t.Fatalf("a refused eviction changed the record: %+v", got)
		}
	}

	// Without Since: the operator's resolution.
	seen = renewed("since-operator")
	must(t, resolve(seen, time.Time{}))
}
