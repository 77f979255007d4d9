package baseline

import (
	"bytes"
	"cmp"
	"context"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine/internal/record"
)

// settleable reads k's record and checks that it can be settled under
// token: uncertain, or a remote record in progress past its lease.
// REQUIRES: k's stripe mutex held.
func (s *DB) settleable(st *stripe, k []byte, id idemkv.ID, token uint64, now time.Time) (idemkv.Record, error) {
	cur, found, err := s.get(st, k, now)
	switch {
	case err != nil:
		return idemkv.Record{}, err
	case !found:
		return idemkv.Record{}, fmt.Errorf("%w: %q", idemkv.ErrNotFound, id.Key)
	case cur.State == idemkv.StateCompleted:
		return idemkv.Record{}, fmt.Errorf("%w: %q is completed", idemkv.ErrWrongState, id.Key)
	case cur.State == idemkv.StateInProgress && !abandoned(&cur, now):
		return idemkv.Record{}, fmt.Errorf("%w: %q is in progress under a live lease", idemkv.ErrWrongState, id.Key)
	case cur.Token != token:
		return idemkv.Record{}, fmt.Errorf("%w: token %d, record has %d", idemkv.ErrFenced, token, cur.Token)
	}
	cur.ID = id
	return cur, nil
}

func abandoned(rec *idemkv.Record, now time.Time) bool {
	return rec.State == idemkv.StateInProgress && rec.Mode == idemkv.ModeRemote && !now.Before(rec.LeaseExpires)
}

// settle runs fn with the settleable record of id under token, with its
// stripe mutex held.
func (s *DB) settle(ctx context.Context, id idemkv.ID, token uint64, since time.Time, note string, fn func(st *stripe, k []byte, cur idemkv.Record, now time.Time) error) error {
	if err := id.Validate(); err != nil {
		return err
	}
	if len(note) > idemkv.MaxNoteLen {
		return fmt.Errorf("%w: note is %d bytes, limit %d", idemkv.ErrInvalidArgument, len(note), idemkv.MaxNoteLen)
	}
	if err := s.enter(ctx); err != nil {
		return err
	}
	defer s.gate.RUnlock()
	k := recordKey(id)
	st := s.stripe(k)
	st.mu.Lock()
	defer st.mu.Unlock()
	now := s.o.Clock.Now()
	cur, err := s.settleable(st, k, id, token, now)
	if err != nil {
		return err
	}
	if !since.IsZero() && cur.MovedSince(since) {
		return fmt.Errorf("%w: key %q was renewed or marked after %v", idemkv.ErrFenced, id.Key, since)
	}
	return fn(st, k, cur, now)
}

// Resolve implements idemkv.Store.
func (s *DB) Resolve(ctx context.Context, req idemkv.ResolveRequest) error {
	if !req.NoEffect {
		if err := s.validateResult(&req.Result); err != nil {
			return err
		}
	}
	return s.settle(ctx, req.ID, req.Token, req.Since, req.Note, func(st *stripe, k []byte, cur idemkv.Record, now time.Time) error {
		b := s.db.NewBatch()
		fx := &effects{b: b}
		if req.Apply != nil {
			if err := req.Apply(fx); err != nil {
				_ = b.Close()
				return err
			}
		}
		if req.NoEffect {
			putRecord(b, k, &cur, nil)
			return s.commit(st, k, b)
		}
		done := cur
		done.State = idemkv.StateCompleted
		done.Escalated = false
		done.Marked = time.Time{}
		done.LeaseExpires = time.Time{}
		done.Note = req.Note
		done.Expires = now.Add(s.window(done.Class))
		done.Result = req.Result
		done.Effects = fx.count()
		putRecord(b, k, &cur, &done)
		return s.commit(st, k, b)
	})
}

// Escalate implements idemkv.Store. An uncertain record keeps its mark;
// an abandoned one is marked uncertain now.
func (s *DB) Escalate(ctx context.Context, req idemkv.EscalateRequest) error {
	return s.settle(ctx, req.ID, req.Token, req.Since, req.Note, func(st *stripe, k []byte, cur idemkv.Record, now time.Time) error {
		esc := cur
		esc.State = idemkv.StateUncertain
		esc.Escalated = true
		esc.LeaseExpires = time.Time{}
		esc.Note = req.Note
		if cur.State != idemkv.StateUncertain {
			esc.Expires = now.Add(s.window(esc.Class))
			esc.Marked = marked(now)
		}
		return s.put(st, k, &cur, &esc)
	})
}

// List implements idemkv.Store by reading the pending index, as the
// engine does, and each entry's record under its stripe mutex.
func (s *DB) List(ctx context.Context, req idemkv.ListRequest) (idemkv.ListPage, error) {
	if err := req.Validate(); err != nil {
		return idemkv.ListPage{}, err
	}
	section := record.PendingOpen
	if req.Escalated {
		section = record.PendingEscalated
	}
	prefix := record.AppendPendingPrefix(nil, section)
	lower := prefix
	if req.After != "" {
		after, err := hex.DecodeString(req.After)
		if err != nil || !bytes.HasPrefix(after, prefix) || len(after) <= record.PendingPrefixLen {
			return idemkv.ListPage{}, fmt.Errorf("%w: malformed cursor %q", idemkv.ErrInvalidArgument, req.After)
		}
		lower = append(after, 0)
	}
	limit := min(cmp.Or(req.Limit, 100), 1000)
	if err := s.enter(ctx); err != nil {
		return idemkv.ListPage{}, err
	}
	defer s.gate.RUnlock()
	upper := record.AppendPendingPrefix(nil, section+1)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return idemkv.ListPage{}, err
	}
	defer it.Close()
	var (
		page idemkv.ListPage
		last []byte
	)
	now := s.o.Clock.Now()
	for valid := it.First(); valid; valid = it.Next() {
		if len(page.Records) == limit {
			page.Next = hex.EncodeToString(last)
			break
		}
		last = append(last[:0], it.Key()...)
		_, _, k, err := record.SplitPendingKey(last)
		if err != nil {
			return idemkv.ListPage{}, err
		}
		id, err := record.DecodeKey(k)
		if err != nil {
			return idemkv.ListPage{}, err
		}
		if req.Tenant != "" && id.Tenant != req.Tenant {
			continue
		}
		st := s.stripe(k)
		st.mu.Lock()
		rec, found, err := s.get(st, k, now)
		st.mu.Unlock()
		if err != nil {
			return idemkv.ListPage{}, err
		}
		rec.ID = id
		switch {
		case !found:
		case req.Escalated && rec.State == idemkv.StateUncertain && rec.Escalated,
			!req.Escalated && (rec.State == idemkv.StateUncertain && !rec.Escalated || abandoned(&rec, now)):
			page.Records = append(page.Records, rec)
		}
	}
	return page, it.Error()
}
