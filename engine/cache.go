package engine

import (
	"container/list"
	"time"

	"github.com/idemkv/idemkv"
)

// replayCache keeps recently completed records of one stripe in memory, so
// that replays (retries of finished requests, the common case right after
// a lost response) are answered without a Pebble read. It is an LRU bounded
// in bytes.
//
// Invariant, under the stripe mutex: an entry for k is a durable completed
// record and equals what Pebble holds for k. It is kept by two rules: every
// slot installed for k drops k's entry (all writes to k happen under a
// slot, and while a slot exists lookups never consult the cache), and an
// entry is (re)filled only from a durable source — a disk read with no slot,
// or a write that has just become durable, as its slot is removed.
type replayCache struct {
	budget int64 // bytes; 0 disables the cache
	used   int64
	lru    list.List // of *cacheEntry, most recently used at the front
	byKey  map[string]*list.Element
}

type cacheEntry struct {
	key  string
	rec  idemkv.Record
	size int64
}

func (c *replayCache) init(budget int64) {
	c.budget = budget
	c.byKey = make(map[string]*list.Element)
}

// entrySize approximates the memory an entry holds.
func entrySize(k []byte, r *idemkv.Record) int64 {
	return int64(160 + 2*len(k) + len(r.Fingerprint) + len(r.Result.Pointer) + len(r.Result.Body))
}

// get returns a copy of the cached record for k, if any. The copy does not
// alias the cache.
func (c *replayCache) get(k []byte) (idemkv.Record, bool) {
	el, ok := c.byKey[string(k)]
	if !ok {
		return idemkv.Record{}, false
	}
	c.lru.MoveToFront(el)
	rec := el.Value.(*cacheEntry).rec
	rec.Fingerprint = append([]byte(nil), rec.Fingerprint...)
	if rec.Result.Body != nil {
		rec.Result.Body = append([]byte(nil), rec.Result.Body...)
	}
	return rec, true
}

// put caches r (a durable completed record) under k, evicting the least
// recently used entries to stay within budget. It keeps its own copy.
func (c *replayCache) put(k []byte, r *idemkv.Record, now time.Time) {
	if c.budget == 0 || r.State != idemkv.StateCompleted || !now.Before(r.Expires) {
		return
	}
	size := entrySize(k, r)
	if size > c.budget/4 {
		return // one huge body must not flush the whole stripe
	}
	c.drop(k)
	rec := *r
	rec.ID = idemkv.ID{}
	rec.Fingerprint = append([]byte(nil), r.Fingerprint...)
	if r.Result.Body != nil {
		rec.Result.Body = append([]byte(nil), r.Result.Body...)
	}
	e := &cacheEntry{key: string(k), rec: rec, size: size}
	c.byKey[e.key] = c.lru.PushFront(e)
	c.used += size
	for c.used > c.budget {
		old := c.lru.Back().Value.(*cacheEntry)
		c.drop([]byte(old.key))
	}
}

// drop forgets k.
func (c *replayCache) drop(k []byte) {
	el, ok := c.byKey[string(k)]
	if !ok {
		return
	}
	e := c.lru.Remove(el).(*cacheEntry)
	delete(c.byKey, e.key)
	c.used -= e.size
}

func (c *replayCache) len() int { return len(c.byKey) }
