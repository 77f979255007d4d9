package engine

import (
	"bytes"
	"cmp"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine/internal/record"
)

// Completed records live in expiry buckets (layout 3, internal/record's
// keys.go): each retention class has buckets bucketsPerWindow to its
// window, and a completed record goes into the bucket of its class that
// ends at or after its expiry. Every record in a bucket has expired once the
// bucket has ended, so the sweeper drops whole buckets with one range
// deletion each: no per-record tombstones to compact away, and no write
// can race the drop, because a write into a bucket that has ended writes
// a record that has expired already.
//
// Unsettled records (in progress, uncertain) keep the record key: they
// never expire while unsettled, and they are rewritten as they move
// through their states. Settling one moves it: its record key is deleted
// and its expiry key set in the same batch.
//
// A lookup reads the record key first and then, if the claim filter did
// not rule the key out, probes the key in every bucket that has not
// ended. The buckets a lookup must probe are kept in memory (bucketSet):
// all the buckets in the store when it was opened, and every bucket a
// write has used since, added before the write commits so that a reader
// who can see the record also probes its bucket.

// BucketsPerWindow is how many expiry buckets span a retention class's
// window. A completed record is swept at most one bucket's width (its
// class's window / BucketsPerWindow) plus one sweeper interval and pass
// after it expires; every read treats it as absent from its expiry on.
const BucketsPerWindow = bucketsPerWindow

// bucketsPerWindow is how many buckets span a retention class's window.
// A bucket holds records up to its width past their expiry, so the store
// keeps about 1/bucketsPerWindow more than the live records; each lookup
// the claim filter lets through probes about bucketsPerWindow+1 buckets
// per class in use.
const bucketsPerWindow = 24

// bucketSet is the set of expiry buckets that lookups probe, the latest
// end first. Readers load the current slice without locking; writers add
// under mu, copying.
type bucketSet struct {
	mu   sync.Mutex
	list atomic.Pointer[[]bucket]
}

// bucket is one expiry bucket: its key prefix and its end.
type bucket struct {
	prefix string
	end    uint64 // unix seconds
}

func (bs *bucketSet) load() []bucket {
	if p := bs.list.Load(); p != nil {
		return *p
	}
	return nil
}

// add makes sure b is in the set. Nearly every call finds it there.
func (bs *bucketSet) add(prefix []byte, end uint64) {
	for _, b := range bs.load() {
		if b.end == end && b.prefix == string(prefix) {
			return
		}
	}
	bs.mu.Lock()
	defer bs.mu.Unlock()
	cur := bs.load()
	for _, b := range cur {
		if b.end == end && b.prefix == string(prefix) {
			return
		}
	}
	// Latest end first: a retry usually follows its first attempt closely,
	// so its record is in one of the newest buckets.
	i, _ := slices.BinarySearchFunc(cur, end, func(b bucket, end uint64) int { return cmp.Compare(end, b.end) })
	next := slices.Insert(slices.Clone(cur), i, bucket{prefix: string(prefix), end: end})
	bs.list.Store(&next)
}

// forget drops the buckets that ended at or before now: lookups skip them
// anyway.
func (bs *bucketSet) forget(now uint64) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	next := slices.DeleteFunc(slices.Clone(bs.load()), func(b bucket) bool { return b.end <= now })
	bs.list.Store(&next)
}

// bucketOf returns the prefix of the bucket that rec, a completed record,
// goes into, and the bucket's end.
func (e *Engine) bucketOf(rec *idemkv.Record) ([]byte, uint64) {
	end := record.BucketEnd(rec.Expires, e.window(rec.Class)/bucketsPerWindow)
	return record.AppendBucket(nil, rec.Class, end), end
}

// putRecord adds to b the writes that make next (nil: none) k's record,
// where prev is k's current record if it is stored under its record key
// (an unsettled record that was written), else nil. A completed record
// goes to its bucket, which is added to the set lookups probe first; the
// pending index follows (putPending).
func (e *Engine) putRecord(b batchWriter, k []byte, prev, next *idemkv.Record) {
	e.putPending(b, k, prev, next)
	stored := prev != nil
	switch {
	case next == nil:
		if stored {
			_ = b.Delete(k, nil)
		}
	case next.State == idemkv.StateCompleted:
		bp, end := e.bucketOf(next)
		e.buckets.add(bp, end)
		_ = b.Set(record.AppendExpiryKey(nil, bp, k), e.encodeRecord(nil, k, next), nil)
		if stored {
			_ = b.Delete(k, nil)
		}
	default:
		_ = b.Set(k, e.encodeRecord(nil, k, next), nil)
	}
}

// scanBuckets calls fn with the prefix and end of every bucket in r (the
// store or a snapshot), in key order, seeking past each bucket's records.
func scanBuckets(r pebble.Reader, fn func(prefix []byte, end uint64) error) error {
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: expiryStart, UpperBound: expiryEnd})
	if err != nil {
		return err
	}
	for valid := it.First(); valid; {
		bp, _, end, _, err := record.SplitExpiryKey(it.Key())
		if err != nil {
			_ = it.Close()
			return fmt.Errorf("expiry key %x: %w", it.Key(), err)
		}
		bp = bytes.Clone(bp)
		if err := fn(bp, end); err != nil {
			_ = it.Close()
			return err
		}
		valid = it.SeekGE(prefixEnd(bp))
	}
	if err := it.Error(); err != nil {
		_ = it.Close()
		return err
	}
	return it.Close()
}

// loadBuckets fills the set lookups probe with every bucket in the store,
// ended or not: lookups skip the ended ones by the time they read, and a
// clock that is wrong at Open must not hide a bucket it is later corrected
// back into. The sweeper forgets them as it drops them.
func (e *Engine) loadBuckets() error {
	err := scanBuckets(e.db, func(bp []byte, end uint64) error {
		e.buckets.add(bp, end)
		return nil
	})
	if err != nil {
		return fmt.Errorf("engine: open: read expiry buckets: %w", err)
	}
	return nil
}

// readBucketsLocked probes k in every bucket that has not ended, with it,
// and returns the first completed record it finds that has not expired.
//
// REQUIRES: the key's shard mutex held (see shard).
func (e *Engine) readBucketsLocked(it *pebble.Iterator, k []byte, now time.Time) (idemkv.Record, bool, error) {
	_, rec, found, err := e.findInBucketsLocked(it, k, now)
	return rec, found, err
}

// findInBucketsLocked is readBucketsLocked that also returns the expiry
// key the record is stored under (a fresh slice).
func (e *Engine) findInBucketsLocked(it *pebble.Iterator, k []byte, now time.Time) ([]byte, idemkv.Record, bool, error) {
	var probe []byte
	unix := uint64(now.Unix())
	for _, b := range e.buckets.load() {
		if b.end <= unix {
			continue // every record in it has expired
		}
		probe = append(append(probe[:0], b.prefix...), k[1:]...)
		if !it.SeekPrefixGE(probe) || !bytes.Equal(it.Key(), probe) {
			continue
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return nil, idemkv.Record{}, false, err
		}
		rec, err := e.decodeRecord(k, v)
		if err != nil {
			return nil, idemkv.Record{}, false, err
		}
		if now.Before(rec.Expires) {
			return probe, rec, true, nil
		}
	}
	return nil, idemkv.Record{}, false, it.Error()
}
