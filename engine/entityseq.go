package engine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/bits-and-blooms/bloom/v3"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv/engine/internal/record"
)

// Entity sequences: each event's place among the events of its entity
// (topic and key), numbered by the committer as the event is enqueued.
// An entity's last sequence is found among the writes of the groups not
// yet committed (committer.mu.pending), else in a cache of the entities
// that groups have committed, else in Pebble. The cache and Pebble are
// read before the committer's mutex is taken (prefetchEntities), because
// a Pebble read of a new entity misses through every level and every
// enqueue waits for that mutex. What was read is used under the mutex
// only if no group with events has committed since (eventEpoch): entity
// keys change only in such commits, so it is still the last sequence.
// Otherwise it is read again, under the mutex.
//
// Most events of a service name a new entity only once; its Pebble read
// misses through every level. A Bloom filter of the entities that exist
// (on disk, or written by a group not yet committed) answers "none yet"
// for them without a read: it is loaded with every entity at Open, and an
// entity is added as its first event is enqueued, before any later
// prefetch can look for it. Past its capacity it is dropped, and every
// entity is read from Pebble as before.

// maxCachedEntities bounds the cache; past it, the cache starts afresh
// (a miss only costs a Pebble read).
const maxCachedEntities = 1 << 16

// entityFilter is the filter of existing entities. A nil filter, or one
// whose f is nil (past capacity), says every entity may exist.
type entityFilter struct {
	mu          sync.RWMutex
	f           *bloom.BloomFilter
	n, capacity uint
}

// entityFilterFP is the filter's false-positive rate at capacity.
const entityFilterFP = 0.01

func newEntityFilter(capacity uint) *entityFilter {
	return &entityFilter{f: bloom.NewWithEstimates(capacity, entityFilterFP), capacity: capacity}
}

// mayExist reports whether the entity of outbox key ek may have a
// sequence.
func (ef *entityFilter) mayExist(ek []byte) bool {
	if ef == nil {
		return true
	}
	ef.mu.RLock()
	defer ef.mu.RUnlock()
	return ef.f == nil || ef.f.Test(ek)
}

// add records that the entity of ek exists.
func (ef *entityFilter) add(ek []byte) {
	if ef == nil {
		return
	}
	ef.mu.Lock()
	defer ef.mu.Unlock()
	if ef.f == nil || ef.f.TestAndAdd(ek) {
		return
	}
	if ef.n++; ef.n > ef.capacity {
		ef.f = nil // past capacity: read every entity
	}
}

type entityCache struct {
	mu sync.Mutex
	m  map[string]uint64
}

func (ec *entityCache) get(ek []byte) (uint64, bool) {
	ec.mu.Lock()
	defer ec.mu.Unlock()
	n, ok := ec.m[string(ek)]
	return n, ok
}

func (ec *entityCache) put(ek string, n uint64) {
	ec.mu.Lock()
	defer ec.mu.Unlock()
	if ec.m == nil || len(ec.m) >= maxCachedEntities {
		ec.m = make(map[string]uint64)
	}
	ec.m[ek] = n
}

// prefetchEntities reads the last sequence of each entity t's events
// name, with no lock of the committer's held, and the epoch it read them
// at.
func (c *committer) prefetchEntities(t *txn) error {
	if len(t.entities) == 0 {
		return nil
	}
	t.epoch = c.eventEpoch.Load()
	t.seqs = make([]uint64, len(t.entities))
	for i, ek := range t.entities {
		if !c.entityFilter.mayExist(ek) {
			continue // none yet: 0, unless one is enqueued meanwhile (entitySeqLocked)
		}
		n, ok := c.entities.get(ek)
		if !ok && c.pendingEntity(ek) {
			continue // found among the pending writes under the mutex
		}
		if !ok {
			var err error
			if n, err = readEntitySeq(c.db, ek); err != nil {
				return err
			}
		}
		t.seqs[i] = n
	}
	return nil
}

// pendingEntity reports whether a group not yet committed writes the
// entity whose outbox key is ek: a hot entity's last sequence is found
// there, and its Pebble read would be wasted.
func (c *committer) pendingEntity(ek []byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.mu.pending[string(ek)]
	return ok
}

// entitySeqLocked returns the last sequence of the entity of t's i-th
// event. REQUIRES: c.mu held.
func (c *committer) entitySeqLocked(t *txn, i int) (uint64, error) {
	ek := t.entities[i]
	if p, ok := c.mu.pending[string(ek)]; ok {
		return p.version, nil
	}
	if t.seqs != nil && t.epoch == c.eventEpoch.Load() {
		return t.seqs[i], nil
	}
	return readEntitySeq(c.db, ek)
}

// entitiesCommittedLocked caches the entity sequences g committed and
// advances the epoch. REQUIRES: c.mu held; g committed, its pending
// writes not yet forgotten.
func (c *committer) entitiesCommittedLocked(g *commitGroup) {
	for _, k := range g.keys {
		if p := c.mu.pending[k]; p.g == g && len(k) > 1 && k[0] == record.NSOutbox && k[1] == 'n' {
			c.entities.put(k, p.version)
		}
	}
	c.eventEpoch.Add(1)
}

// readEntitySeq reads the last sequence of the entity whose outbox key is
// ek from r; 0 if it has none.
func readEntitySeq(r pebble.Reader, ek []byte) (uint64, error) {
	v, closer, err := r.Get(ek)
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("engine: read outbox entity: %w", err)
	}
	defer closer.Close()
	if len(v) != 8 {
		return 0, fmt.Errorf("engine: outbox entity %q: %w: value of %d bytes", ek, record.ErrCorrupt, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

// loadEntityFilter fills a filter with every entity the store holds,
// sized for twice as many and at least 1<<20.
func (c *committer) loadEntityFilter() error {
	prefix := []byte{record.NSOutbox, 'n'}
	it, err := c.db.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: prefixEnd(prefix)})
	if err != nil {
		return err
	}
	var keys [][]byte
	for valid := it.First(); valid; valid = it.Next() {
		keys = append(keys, append([]byte(nil), it.Key()...))
	}
	if err := it.Close(); err != nil {
		return err
	}
	ef := newEntityFilter(max(1<<20, 2*uint(len(keys))))
	for _, k := range keys {
		ef.add(k)
	}
	c.entityFilter = ef
	return nil
}
