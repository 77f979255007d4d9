package engine

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine/internal/record"
)

// Evict implements idemkv.Evicter. The record goes with a synced write,
// like a release: an unsettled one from its key and the pending index, a
// completed one from its expiry bucket and the replay cache. The effects
// of a completed one stay, stamped with its token and expiry; a mark of
// the evicted outcome (record.AppendEvictedKey) is written in the same
// batch, which Check pairs them with until they expire.
func (e *Engine) Evict(ctx context.Context, req idemkv.EvictRequest) (rec idemkv.Record, err error) {
	if err := e.validateSettle(req.ID, ""); err != nil {
		return idemkv.Record{}, err
	}
	if err := e.gate.begin(ctx); err != nil {
		return idemkv.Record{}, err
	}
	defer e.gate.exit()
	k := appendRecordKey(nil, req.ID)
	st := e.table.stripe(k)
	cur, s, bucketKey, err := e.evictable(ctx, st, k, &req)
	if err != nil {
		return idemkv.Record{}, err
	}
	defer e.abandonOnPanic(s, &err)
	if bucketKey == nil {
		err = e.commitRecord(st, k, s, &cur, nil, nil)
	} else {
		b := e.db.NewBatch()
		_ = b.Delete(bucketKey, nil)
		if cur.Effects > 0 {
			_ = b.Set(record.AppendEvictedKey(nil, cur.Token), record.EvictedValue(cur.Expires.Unix(), uint32(cur.Effects)), nil)
		}
		err = e.commitRecord(st, k, s, nil, nil, b)
	}
	if err != nil {
		return idemkv.Record{}, err
	}
	return cur, nil
}

// evictable finds k's record, checks that req may evict it, and marks k
// busy for the write. It returns the record, its busy slot, and the
// expiry key of a completed record (nil for an unsettled one, stored
// under k).
func (e *Engine) evictable(ctx context.Context, st *stripe, k []byte, req *idemkv.EvictRequest) (idemkv.Record, *slot, []byte, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	s := st.slotLocked(k)
	for s != nil && s.busy {
		if err := e.waitLocked(ctx, st, s); err != nil {
			return idemkv.Record{}, nil, nil, err
		}
		s = st.slotLocked(k)
	}
	now := e.clock.Now()
	var (
		cur       idemkv.Record
		bucketKey []byte
		found     bool
		err       error
	)
	if s != nil {
		cur, found = s.rec, true // a holder's, with its lease as renewed
		cur.Fingerprint = bytes.Clone(cur.Fingerprint)
	} else {
		bucketKey, cur, found, err = e.findStoredLocked(k, now)
	}
	switch {
	case err != nil:
		return idemkv.Record{}, nil, nil, fmt.Errorf("engine: evict: %w", err)
	case !found:
		err = fmt.Errorf("%w: key_hash %s", idemkv.ErrNotFound, req.ID.Hash())
	case s != nil && !s.durable, cur.State == idemkv.StateInProgress && !abandoned(&cur, now):
		err = fmt.Errorf("%w: key_hash %s is in progress under a live lease", idemkv.ErrWrongState, req.ID.Hash())
	case req.Token != 0 && cur.Token != req.Token:
		e.counters.fenced.Add(1)
		err = fmt.Errorf("%w: token %d, record has %d", idemkv.ErrFenced, req.Token, cur.Token)
	case !req.Since.IsZero() && cur.MovedSince(req.Since):
		e.counters.fenced.Add(1)
		err = fmt.Errorf("%w: key_hash %s: its holder renewed it or marked it after %v", idemkv.ErrFenced, req.ID.Hash(), req.Since)
	case !req.Since.IsZero() && cur.State == idemkv.StateCompleted:
		e.counters.fenced.Add(1)
		err = fmt.Errorf("%w: key_hash %s has completed since it was judged unsettled", idemkv.ErrFenced, req.ID.Hash())
	}
	if err != nil {
		return idemkv.Record{}, nil, nil, err
	}
	cur.ID = req.ID
	// Readers of k wait on the busy slot until the write ends; the cached
	// outcome must be gone by then.
	e.table.replay.drop(k)
	return cur, e.table.beginWriteLocked(st, k, s, cur), bucketKey, nil
}

// findStoredLocked reads k's stored record as readLocked does, and
// returns with a completed one the expiry key it is stored under.
//
// REQUIRES: the key's stripe mutex held.
func (e *Engine) findStoredLocked(k []byte, now time.Time) ([]byte, idemkv.Record, bool, error) {
	it, err := e.db.NewIter(&pebble.IterOptions{UseL6Filters: true})
	if err != nil {
		return nil, idemkv.Record{}, false, err
	}
	defer it.Close()
	if it.SeekPrefixGE(k) && bytes.Equal(it.Key(), k) {
		rec, found, err := e.readWith(it, k, now)
		return nil, rec, found, err
	}
	if err := it.Error(); err != nil {
		return nil, idemkv.Record{}, false, err
	}
	return e.findInBucketsLocked(it, k, now)
}
