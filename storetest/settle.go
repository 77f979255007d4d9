package storetest

import (
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/idemkv/idemkv"
	"pgregory.net/rapid"
)

// The state machine's settling steps: Resolve, Escalate and List, on
// uncertain records and on abandoned ones (remote records in progress
// past their lease).

// settleable reports whether the model's r can be settled now.
func (m *machine) settleable(r *mrec) bool {
	return r.state == idemkv.StateUncertain ||
		r.state == idemkv.StateInProgress && r.mode == idemkv.ModeRemote && !m.h.Now().Before(r.lease)
}

// settleToken draws the token a settling call sends for id: the record's,
// or a stale one.
func (m *machine) settleToken(t *rapid.T, r *mrec) uint64 {
	var tok uint64
	if r != nil {
		tok = r.token
	}
	if rapid.Bool().Draw(t, "stale") {
		tok++
	}
	return tok
}

// expectSettle checks the error of a settling call on r with tok, and
// reports whether it succeeded.
func (m *machine) expectSettle(t *rapid.T, op string, r *mrec, tok uint64, err error) bool {
	switch {
	case r == nil:
		if !errors.Is(err, idemkv.ErrNotFound) {
			t.Fatalf("%s absent: %v", op, err)
		}
	case !m.settleable(r):
		if !errors.Is(err, idemkv.ErrWrongState) {
			t.Fatalf("%s %v record (lease %v, now %v): %v", op, r.state, r.lease, m.h.Now(), err)
		}
	case tok != r.token:
		m.expectFenced(t, op, err)
	case err != nil:
		t.Fatalf("%s: %v", op, err)
	default:
		return true
	}
	return false
}

func (m *machine) resolve(t *rapid.T) {
	id := rapid.SampledFrom(modelIDs).Draw(t, "id")
	r := m.live(id)
	tok := m.settleToken(t, r)
	noEffect := rapid.Bool().Draw(t, "noEffect")
	note := rapid.SampledFrom([]string{"", "ops: seen at the processor"}).Draw(t, "note")
	res := idemkv.Result{Status: 201, Pointer: "/resolved"}
	err := m.h.Store().Resolve(ctx, idemkv.ResolveRequest{ID: id, Token: tok, NoEffect: noEffect, Result: res, Note: note})
	if !m.expectSettle(t, "resolve", r, tok, err) {
		return
	}
	if noEffect {
		delete(m.recs, id)
		return
	}
	r.state, r.result, r.effects, r.escalated, r.note = idemkv.StateCompleted, res, 0, false, note
	r.expires = m.h.Now().Add(window(r.class))
	r.marked, r.looseMark = time.Time{}, false
}

func (m *machine) escalate(t *rapid.T) {
	id := rapid.SampledFrom(modelIDs).Draw(t, "id")
	r := m.live(id)
	tok := m.settleToken(t, r)
	err := m.h.Store().Escalate(ctx, idemkv.EscalateRequest{ID: id, Token: tok, Note: "gave up"})
	if !m.expectSettle(t, "escalate", r, tok, err) {
		return
	}
	if r.state != idemkv.StateUncertain { // abandoned: an uncertain record keeps its mark
		r.expires = m.h.Now().Add(window(r.class))
		r.marked, r.looseMark = m.h.Now(), true
	}
	r.state, r.escalated, r.note = idemkv.StateUncertain, true, "gave up"
}

// list pages through both listings, in pages of a drawn size and
// optionally for one tenant, and checks them against the model: exactly
// the records awaiting reconciliation, or the escalated ones, oldest
// first, each with the record's current token.
func (m *machine) list(t *rapid.T) {
	escalated := rapid.Bool().Draw(t, "escalated")
	tenant := rapid.SampledFrom([]string{"", "t1", "t2"}).Draw(t, "tenant")
	limit := rapid.IntRange(0, 3).Draw(t, "limit")
	var got []idemkv.Record
	req := idemkv.ListRequest{Escalated: escalated, Tenant: tenant, Limit: limit}
	for pages := 0; ; pages++ {
		if pages > len(modelIDs)+1 {
			t.Fatalf("list does not end")
		}
		page, err := m.h.Store().List(ctx, req)
		if err != nil {
			t.Fatalf("list: %v", err)
		}
		if limit > 0 && len(page.Records) > limit {
			t.Fatalf("page of %d records, limit %d", len(page.Records), limit)
		}
		got = append(got, page.Records...)
		if page.Next == "" {
			break
		}
		req.After = page.Next
	}
	var want []idemkv.ID
	for _, id := range modelIDs {
		r := m.live(id)
		if r == nil || tenant != "" && id.Tenant != tenant {
			continue
		}
		awaiting := r.state == idemkv.StateUncertain && !r.escalated ||
			r.state == idemkv.StateInProgress && r.mode == idemkv.ModeRemote && !m.h.Now().Before(r.lease)
		if escalated && r.escalated || !escalated && awaiting {
			want = append(want, id)
		}
	}
	var ids []idemkv.ID
	for i, rec := range got {
		ids = append(ids, rec.ID)
		r := m.live(rec.ID)
		if r == nil || rec.Token != r.token || rec.State != r.state {
			t.Fatalf("listed %v token %d %v, model %+v", rec.ID, rec.Token, rec.State, r)
		}
		m.checkMarked(t, "list", rec, r)
		if i > 0 && rec.Created.Before(got[i-1].Created) {
			t.Fatalf("listing not oldest first: %v after %v", rec.Created, got[i-1].Created)
		}
	}
	key := func(a, b idemkv.ID) int {
		return strings.Compare(a.Tenant+"\x00"+a.Endpoint+"\x00"+a.Key, b.Tenant+"\x00"+b.Endpoint+"\x00"+b.Key)
	}
	slices.SortFunc(ids, key)
	slices.SortFunc(want, key)
	if !slices.Equal(ids, want) {
		t.Fatalf("list (escalated %v, tenant %q): %v, model %v", escalated, tenant, ids, want)
	}
}
