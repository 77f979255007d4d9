package reconcile_test

import (
	"context"
	"sync"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/layertest/teststore"
)

// markedStore is the store of a suite with Record.Marked as the contract
// has it, whether or not the store under it keeps it yet (the engine and
// pgstore are being taught to on branches i36-engine and i36-pg): it
// notes when each record is marked uncertain through it (MarkUncertain,
// or a claim that found its remote lease run out and answered
// Reconciling), to the millisecond, and fills Marked in on the records
// the store returns without one. On a store that sets Marked it changes
// nothing.
//
// With old set, it does the opposite: it clears Marked on every record,
// as a store from before Marked existed returns them.
type markedStore struct {
	teststore.Store
	clock idemkv.Clock
	old   bool
	marks *marks // kept across reopens, as the store keeps its records
}

// marks are the moments markedStore saw records marked, by ID and token.
type marks struct {
	mu sync.Mutex
	at map[markKey]time.Time
}

type markKey struct {
	id    idemkv.ID
	token uint64
}

func newMarks() *marks { return &marks{at: map[markKey]time.Time{}} }

// note records that rec was marked uncertain at now, unless it already
// was: the first to see it marked is the one that marked it.
func (s *markedStore) note(id idemkv.ID, token uint64) {
	s.marks.mu.Lock()
	defer s.marks.mu.Unlock()
	k := markKey{id, token}
	if _, ok := s.marks.at[k]; !ok {
		s.marks.at[k] = s.clock.Now().Truncate(time.Millisecond)
	}
}

// fill sets rec.Marked as the contract has it (or clears it, for an old
// store).
func (s *markedStore) fill(rec *idemkv.Record) {
	if s.old {
		rec.Marked = time.Time{}
		return
	}
	if rec.State != idemkv.StateUncertain || !rec.Marked.IsZero() {
		return
	}
	s.marks.mu.Lock()
	defer s.marks.mu.Unlock()
	rec.Marked = s.marks.at[markKey{rec.ID, rec.Token}]
}

func (s *markedStore) MarkUncertain(ctx context.Context, l idemkv.Lease, note string) error {
	err := s.Store.MarkUncertain(ctx, l, note)
	if err == nil {
		s.note(l.ID, l.Token)
	}
	return err
}

func (s *markedStore) Claim(ctx context.Context, req idemkv.ClaimRequest) (idemkv.Claim, error) {
	c, err := s.Store.Claim(ctx, req)
	if err == nil && c.Outcome == idemkv.Reconciling && c.Record.Marked.IsZero() {
		s.note(c.Record.ID, c.Record.Token)
	}
	s.fill(&c.Record)
	return c, err
}

func (s *markedStore) Get(ctx context.Context, id idemkv.ID) (idemkv.Record, error) {
	rec, err := s.Store.Get(ctx, id)
	s.fill(&rec)
	return rec, err
}

func (s *markedStore) List(ctx context.Context, req idemkv.ListRequest) (idemkv.ListPage, error) {
	page, err := s.Store.List(ctx, req)
	for i := range page.Records {
		s.fill(&page.Records[i])
	}
	return page, err
}
