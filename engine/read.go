package engine

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv"
)

// Get implements idemkv.Store. A record held in progress in memory is
// returned as StateInProgress; a completed record past its retention is
// ErrNotFound.
func (e *Engine) Get(ctx context.Context, id idemkv.ID) (idemkv.Record, error) {
	if err := id.Validate(); err != nil {
		return idemkv.Record{}, err
	}
	if err := e.gate.begin(ctx); err != nil {
		return idemkv.Record{}, err
	}
	defer e.gate.exit()
	k := appendRecordKey(nil, id)
	st := e.table.stripe(k)
	rec, found, err := e.lookup(st, k)
	if err != nil {
		return idemkv.Record{}, err
	}
	if !found {
		return idemkv.Record{}, fmt.Errorf("%w: key_hash %s", idemkv.ErrNotFound, id.Hash())
	}
	rec.ID = id
	return rec, nil
}

// readLocked reads the record stored for k: the unsettled record under k
// itself, or else a completed record that has not expired at now, in its
// expiry bucket. It uses prefix seeks rather than DB.Get because Get skips
// the bloom filters of L6, where nearly all records live, and nearly every
// probe looks up a key that is not there.
//
// REQUIRES: the key's stripe mutex held (see leaseTable).
func (e *Engine) readLocked(k []byte, now time.Time) (idemkv.Record, bool, error) {
	it, err := e.db.NewIter(&pebble.IterOptions{UseL6Filters: true})
	if err != nil {
		return idemkv.Record{}, false, err
	}
	rec, found, err := e.readWith(it, k, now)
	if cerr := it.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return idemkv.Record{}, false, fmt.Errorf("engine: read record: %w", err)
	}
	return rec, found, nil
}

// lookup is lookupLocked under k's stripe mutex, for a reader.
func (e *Engine) lookup(st *stripe, k []byte) (idemkv.Record, bool, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	rec, _, found, err := e.lookupLocked(st, k, e.clock.Now())
	return rec, found, err
}

// lookupLocked returns the current record for k: the in-memory slot if one
// exists, else the stored record. A completed record past its retention is
// reported absent.
//
// REQUIRES: st.mu held.
func (e *Engine) lookupLocked(st *stripe, k []byte, now time.Time) (rec idemkv.Record, s *slot, found bool, err error) {
	if e.testHookLookup != nil {
		e.testHookLookup()
	}
	if s = st.slotLocked(k); s != nil {
		rec = s.rec
		rec.Fingerprint = bytes.Clone(rec.Fingerprint) // the slot's copy is not the caller's
		return rec, s, true, nil
	}
	// The filter first: nearly every claim is of a new key, and a key the
	// filter has never seen is neither stored nor cached (the cache holds
	// only stored records). It costs a few bit tests; a cache lookup
	// hashes the key and takes a segment lock.
	if f := st.mu.filter; f != nil && !f.Test(k) {
		e.filter.skips.Add(1)
		return rec, nil, false, nil
	}
	if rec, ok := e.table.replay.get(k); ok {
		e.counters.cacheHits.Add(1)
		return rec, nil, now.Before(rec.Expires), nil
	}
	rec, found, err = e.readLocked(k, now)
	if !found && err == nil && st.mu.filter != nil {
		e.filter.misses.Add(1)
	}
	if found && rec.State == idemkv.StateCompleted {
		if !now.Before(rec.Expires) {
			found = false
		} else {
			e.table.replay.put(k, &rec, now)
		}
	}
	return rec, nil, found, err
}

// readWith reads the record stored for k through it, as readLocked does.
//
// REQUIRES: the key's stripe mutex held, or no other caller of the engine
// (Load's private engine).
func (e *Engine) readWith(it *pebble.Iterator, k []byte, now time.Time) (idemkv.Record, bool, error) {
	if it.SeekPrefixGE(k) && bytes.Equal(it.Key(), k) {
		v, err := it.ValueAndErr()
		if err != nil {
			return idemkv.Record{}, false, err
		}
		rec, err := e.decodeRecord(k, v)
		return rec, err == nil, err
	}
	if err := it.Error(); err != nil {
		return idemkv.Record{}, false, err
	}
	return e.readBucketsLocked(it, k, now)
}
