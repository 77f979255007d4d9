package engine

import (
	"time"

	"github.com/coocood/freecache"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine/internal/record"
)

// replayCache keeps recently completed records in memory, so that replays
// (retries of finished requests, the common case right after a lost
// response) are answered without a Pebble read. The engine has one; each
// key's entry is read and written only under its stripe's mutex.
//
// The records are kept encoded (the codec of internal/record) in
// freecache's ring buffers: a few hundred large byte slices without
// pointers, which the garbage collector never scans. A cache of Go values
// (a map and a list of records) costs the collector several pointers per
// entry on every cycle; at the default 128 MiB, hundreds of thousands of
// entries, that marking showed up as latency on every request of the
// process that embeds the engine. Eviction is freecache's: per segment,
// least recently used first, approximately.
//
// Invariant, under the stripe mutex: an entry for k is a durable completed
// record and equals what Pebble holds for k. It is kept by two rules: every
// slot installed for k drops k's entry (all writes to k happen under a
// slot, and while a slot exists lookups never consult the cache), and an
// entry is (re)filled only from a durable source — a disk read with no slot,
// or a write that has just become durable, as its slot is removed.
type replayCache struct {
	fc *freecache.Cache // nil disables the cache
}

// newReplayCache returns a cache of about budget bytes, or a disabled one
// if budget is not positive. freecache rounds a budget below 512 KiB up to
// it, and takes an entry (key and encoded record) of at most a 1,024th of
// the budget: 128 KiB at the default.
func newReplayCache(budget int64) replayCache {
	if budget <= 0 {
		return replayCache{}
	}
	return replayCache{fc: freecache.NewCacheCustomTimer(int(budget), noTimer{})}
}

// noTimer is freecache's clock. The engine sets no freecache expiry (the
// lookup checks a record's own expiry against the engine's clock), so the
// cache needs no time and reads none.
type noTimer struct{}

func (noTimer) Now() uint32 { return 0 }

// get returns the cached record for k, if any. The record does not alias
// the cache. Its ID is empty.
func (c replayCache) get(k []byte) (idemkv.Record, bool) {
	if c.fc == nil {
		return idemkv.Record{}, false
	}
	var (
		rec idemkv.Record
		err error
	)
	if c.fc.GetFn(k, func(v []byte) error {
		rec, err = record.Decode(v)
		return err
	}) != nil {
		if err != nil {
			c.fc.Del(k) // cannot happen: only Encode's output is stored
		}
		return idemkv.Record{}, false
	}
	return rec, true
}

// put caches r (a durable completed record) under k, evicting older
// entries to stay within budget. A record too large for the cache is not
// cached.
func (c replayCache) put(k []byte, r *idemkv.Record, now time.Time) {
	if c.fc == nil || r.State != idemkv.StateCompleted || !now.Before(r.Expires) {
		return
	}
	var buf [256]byte
	if c.fc.Set(k, record.Encode(buf[:0], r), 0) != nil {
		c.fc.Del(k) // no older entry may outlive a failed update
	}
}

// drop forgets k.
func (c replayCache) drop(k []byte) {
	if c.fc != nil {
		c.fc.Del(k)
	}
}

// len returns how many records the cache holds.
func (c replayCache) len() int {
	if c.fc == nil {
		return 0
	}
	return int(c.fc.EntryCount())
}
