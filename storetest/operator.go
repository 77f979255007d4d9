package storetest

import (
	"cmp"
	"errors"
	"slices"
	"strings"

	"github.com/idemkv/idemkv"
	"pgregory.net/rapid"
)

// The state machine's operator steps, for a store that offers them:
// Scan (idemkv.Scanner) and Evict (idemkv.Evicter).

// scan pages through every record, for a drawn state and tenant in pages
// of a drawn size, and checks it against the model: each live record
// exactly once (a local claim only if the store stores it), with its
// current token and state.
func (m *machine) scan(t *rapid.T) {
	sc, ok := m.h.Store().(idemkv.Scanner)
	if !ok {
		t.Skip("the store is no Scanner")
	}
	req := idemkv.ScanRequest{
		State:  rapid.SampledFrom([]idemkv.State{0, idemkv.StateInProgress, idemkv.StateUncertain, idemkv.StateCompleted}).Draw(t, "state"),
		Tenant: rapid.SampledFrom([]string{"", "t1", "t2"}).Draw(t, "tenant"),
		Limit:  rapid.IntRange(0, 3).Draw(t, "limit"),
	}
	var got []idemkv.ID
	for pages := 0; ; pages++ {
		if pages > len(modelIDs)+1 {
			t.Fatalf("scan does not end")
		}
		page, err := sc.Scan(ctx, req)
		if err != nil {
			t.Fatalf("scan: %v", err)
		}
		if req.Limit > 0 && len(page.Records) > req.Limit {
			t.Fatalf("page of %d records, limit %d", len(page.Records), req.Limit)
		}
		for _, rec := range page.Records {
			r := m.live(rec.ID)
			if r == nil || rec.Token != r.token || rec.State != r.state || rec.Escalated != r.escalated {
				t.Fatalf("scanned %v token %d %v, model %+v", rec.ID, rec.Token, rec.State, r)
			}
			m.checkMarked(t, "scan", rec, r)
			got = append(got, rec.ID)
		}
		if page.Next == "" {
			break
		}
		req.After = page.Next
	}
	var want []idemkv.ID
	for _, id := range modelIDs {
		r := m.live(id)
		switch {
		case r == nil, req.Tenant != "" && id.Tenant != req.Tenant, req.State != 0 && r.state != req.State:
		case r.state == idemkv.StateInProgress && !r.durable() && m.h.Config().VolatileLocalClaims:
		default:
			want = append(want, id)
		}
	}
	slices.SortFunc(got, compareIDs)
	slices.SortFunc(want, compareIDs)
	if !slices.Equal(got, want) {
		t.Fatalf("scan (state %v, tenant %q): %v, model %v", req.State, req.Tenant, got, want)
	}
}

// evict removes a record, with its current token, a stale one or none:
// refused for a record in progress under a live lease. The effects of an
// evicted completion stay (the check step reads them).
func (m *machine) evict(t *rapid.T) {
	ev, ok := m.h.Store().(idemkv.Evicter)
	if !ok {
		t.Skip("the store is no Evicter")
	}
	id := rapid.SampledFrom(modelIDs).Draw(t, "id")
	r := m.live(id)
	var tok uint64
	if rapid.Bool().Draw(t, "withToken") {
		tok = m.settleToken(t, r)
	}
	got, err := ev.Evict(ctx, idemkv.EvictRequest{ID: id, Token: tok})
	switch {
	case r == nil:
		if !errors.Is(err, idemkv.ErrNotFound) {
			t.Fatalf("evict absent %v: %v", id, err)
		}
	case r.state == idemkv.StateInProgress && !m.settleable(r):
		if !errors.Is(err, idemkv.ErrWrongState) {
			t.Fatalf("evict %v record (lease %v, now %v): %v", r.state, r.lease, m.h.Now(), err)
		}
	case tok != 0 && tok != r.token:
		m.expectFenced(t, "evict", err)
	case err != nil:
		t.Fatalf("evict: %v", err)
	default:
		if got.ID != id || got.Token != r.token || got.State != r.state {
			t.Fatalf("evicted %+v, model %+v", got, *r)
		}
		delete(m.recs, id)
	}
}

// compareIDs orders IDs by tenant, endpoint and key.
func compareIDs(a, b idemkv.ID) int {
	return cmp.Or(strings.Compare(a.Tenant, b.Tenant), strings.Compare(a.Endpoint, b.Endpoint), strings.Compare(a.Key, b.Key))
}
