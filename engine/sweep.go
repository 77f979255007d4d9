package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv/engine/internal/record"
	"github.com/idemkv/idemkv/ttl"
)

// The sweeper (package ttl) walks the store in passes, a chunk of records
// at a time. A pass has two parts:
//
//  1. The expiry buckets (expiry.go), in key order. It reads the records
//     of every bucket that has ended, counting them, and drops each such
//     bucket with one range deletion once it has read to the bucket's end.
//     Buckets that have not ended are skipped with a seek.
//  2. The unsettled records, which it only counts: those past their
//     expiry are held (ttl.Pass.Held), never deleted.
//
// Each chunk's range deletions and the position reached are one atomic
// batch, so a pass resumes where it stopped after a crash or a restart.
// The reads exist for the counts and for the rate limit: the deletion
// itself costs the same for a bucket of any size.
//
// No record in an ended bucket can be live: a bucket ends at or after the
// expiry of every record in it. So the range deletions need no check
// against concurrent writes. A write that commits into a bucket after it
// was dropped writes a record that had expired before it was written
// (its writer stalled past the record's whole retention); reads treat it
// as absent, and the next pass drops it.
//
// Sweeper deletes need no sync of their own. Losing one in a crash brings
// back records that every read already treats as absent, and the next
// pass deletes them again. They go through the committer without asking
// for a sync: while requests are committing, a chunk's deletes ride in
// their next group, synced with it, instead of taking a commit of their
// own; on an idle store a chunk commits alone, unsynced. Either way every
// Pebble commit the engine makes goes through the committer, one at a
// time.

// sweepState is the engine's sweeper: the ttl.Sweeper that runs passes,
// its background loop, and the state of the pass running. Passes are
// serial, so only the running pass touches unsaved, bucket and saved.
type sweepState struct {
	s *ttl.Sweeper
	// stop stops the background loop, which closes done when it has
	// returned.
	stop func()
	done chan struct{}
	// unsaved counts records examined since the pass last saved its
	// position.
	unsaved int
	// bucket is the ended bucket the pass is reading, and saved whether a
	// position of the pass is saved in the store.
	bucket sweepBucket
	saved  bool
}

// sweepSaveEvery is how many records a pass may read without deleting
// anything before it saves its position anyway.
const sweepSaveEvery = 1 << 14

var (
	sweepKey    = record.SweepKey
	recordStart = []byte{record.NSRecord}
	recordEnd   = []byte{record.NSRecord + 1}
	expiryStart = []byte{record.NSExpiry}
	expiryEnd   = []byte{record.NSExpiry + 1}
)

// Sweep runs the sweeper's current pass to its end, deleting every
// completed record that is past its expiry when the pass reaches it, and
// returns what the pass did. If the background sweeper is in the middle of
// a pass, Sweep waits for it and then runs a pass of its own. Running it
// twice is harmless.
//
// Calling it vouches for the clock: after an Open with the clock ahead of
// the store's last time, the background sweeper holds back for an hour
// (docs/operations.md, "Clocks"), and Sweep ends that hour.
func (e *Engine) Sweep(ctx context.Context) (ttl.Pass, error) {
	if err := e.writable(); err != nil {
		return ttl.Pass{}, fmt.Errorf("engine: sweep: %w", err)
	}
	e.clock.confirm()
	return e.sweeper.s.Pass(ctx)
}

// sweepTarget adapts the engine to ttl.Target without adding the chunk
// methods to Engine's own API.
type sweepTarget struct{ e *Engine }

func (t sweepTarget) SweepCursor() ([]byte, error) {
	// A pass starts here, resumed or not: it counts only what it reads.
	t.e.sweeper.bucket = sweepBucket{}
	v, closer, err := t.e.db.Get(sweepKey)
	t.e.sweeper.saved = err == nil
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("engine: read sweep cursor: %w", err)
	}
	defer closer.Close()
	if err := checkSweepCursor(v); err != nil {
		return nil, fmt.Errorf("engine: read sweep cursor: %w", err)
	}
	return bytes.Clone(v), nil
}

// checkSweepCursor checks a saved sweeper position: an expiry key, or an
// unsettled record's key (a lone namespace byte starts that part).
func checkSweepCursor(v []byte) error {
	switch {
	case len(v) == 1 && v[0] == nsRecord:
		return nil
	case len(v) > 0 && v[0] == nsRecord:
		_, err := decodeRecordKey(v)
		return err
	case len(v) > 0 && v[0] == nsExpiry:
		_, _, _, _, err := record.SplitExpiryKey(v)
		return err
	}
	return fmt.Errorf("%w: sweeper position %q is not a record or expiry key", record.ErrCorrupt, v)
}

func (t sweepTarget) SweepChunk(ctx context.Context, cursor []byte, n int, now time.Time) (ttl.Chunk, error) {
	e := t.e
	if err := e.gate.begin(ctx); err != nil {
		return ttl.Chunk{}, err
	}
	defer e.gate.exit()
	var (
		c   ttl.Chunk
		b   = e.db.NewBatch()
		err error
	)
	defer b.Close()
	if cursor == nil || cursor[0] == nsExpiry {
		c, err = e.sweepBuckets(cursor, n, now, b)
	} else {
		c, err = e.sweepUnsettled(cursor, n, now)
	}
	if err != nil {
		return ttl.Chunk{}, fmt.Errorf("engine: sweep: %w", err)
	}
	e.sweeper.unsaved += c.Examined
	if b.Empty() && (c.Next == nil && !e.sweeper.saved || c.Next != nil && e.sweeper.unsaved < sweepSaveEvery) {
		// Nothing to delete, and the position need not be saved yet (a
		// restart at worst re-reads sweepSaveEvery records), or removed:
		// none is saved.
		return c, nil
	}
	e.sweeper.unsaved = 0
	if e.testHookSweepChecked != nil {
		e.testHookSweepChecked()
	}
	if c.Next != nil {
		_ = b.Set(sweepKey, c.Next, nil)
	} else {
		_ = b.Delete(sweepKey, nil)
	}
	// The deletes go through the committer, unsynced: while requests are
	// committing they ride in their next group rather than taking a commit
	// of their own.
	g, first, err := e.commits.enqueue(b, false, nil)
	if werr := e.commits.wait(g, first); err == nil {
		err = werr
	}
	if err != nil {
		return ttl.Chunk{}, e.fail(fmt.Errorf("engine: sweep: commit: %w", err))
	}
	e.sweeper.saved = c.Next != nil
	e.counters.swept.Add(int64(c.Deleted))
	return c, nil
}

// sweepBucket is the ended bucket a pass is reading: its prefix and what
// it has counted of it so far. Only the sweeper touches it.
type sweepBucket struct {
	prefix  []byte
	records int
	bytes   int64
}

// sweepBuckets reads up to n records of ended buckets after cursor, adding
// to b a range deletion for each bucket it reads to the end. When no
// bucket is left, it returns the start of the unsettled records as Next.
func (e *Engine) sweepBuckets(cursor []byte, n int, now time.Time, b *pebble.Batch) (ttl.Chunk, error) {
	lower := expiryStart
	if cursor != nil {
		lower = append(bytes.Clone(cursor), 0) // the first key after cursor
	}
	it, err := e.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: expiryEnd})
	if err != nil {
		return ttl.Chunk{}, err
	}
	defer it.Close()
	var (
		c    ttl.Chunk
		last []byte
		sb   = &e.sweeper.bucket
		unix = uint64(now.Unix())
	)
	// drop deletes the bucket read so far, if any.
	drop := func() {
		if sb.prefix != nil {
			_ = b.DeleteRange(sb.prefix, prefixEnd(sb.prefix), nil)
			c.Deleted += sb.records
			c.DeletedBytes += sb.bytes
		}
		*sb = sweepBucket{}
	}
	valid := it.First()
	for valid && c.Examined < n {
		k := it.Key()
		bp, _, end, _, err := record.SplitExpiryKey(k)
		if err != nil {
			return ttl.Chunk{}, fmt.Errorf("expiry key %x: %w", k, err)
		}
		if sb.prefix != nil && !bytes.Equal(bp, sb.prefix) {
			drop() // read to its end
		}
		if end > unix {
			// Not ended, and neither are the class's later buckets.
			valid = it.SeekGE(prefixEnd(bp[:len(bp)-8]))
			continue
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return ttl.Chunk{}, err
		}
		if sb.prefix == nil {
			sb.prefix = bytes.Clone(bp)
		}
		sb.records++
		sb.bytes += int64(len(k) + len(v))
		c.Examined++
		last = append(last[:0], k...)
		valid = it.Next()
	}
	if err := it.Error(); err != nil {
		return ttl.Chunk{}, err
	}
	if valid {
		// Stopped at n with records left. The bucket being read is dropped
		// by the chunk that reads past its end.
		c.Next = bytes.Clone(last)
		return c, nil
	}
	drop()
	e.buckets.forget(unix)
	if err := e.sweepEvictedMarks(int64(unix), b); err != nil {
		return ttl.Chunk{}, err
	}
	c.Next = []byte{nsRecord}
	return c, nil
}

// sweepEvictedMarks adds to b the deletion of each mark of an evicted
// outcome (Evict) that has expired: its effects are past their outcome's
// retention, and Check counts them as expired without it. There is one
// mark per eviction of a record that wrote effects, so they are few.
func (e *Engine) sweepEvictedMarks(unix int64, b *pebble.Batch) error {
	it, err := e.db.NewIter(&pebble.IterOptions{LowerBound: record.EvictedPrefix, UpperBound: prefixEnd(record.EvictedPrefix)})
	if err != nil {
		return err
	}
	defer it.Close()
	for valid := it.First(); valid; valid = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			return err
		}
		if _, exp, _, err := record.SplitEvicted(it.Key(), v); err == nil && exp <= unix {
			_ = b.Delete(bytes.Clone(it.Key()), nil)
		}
	}
	return it.Error()
}

// sweepUnsettled reads up to n unsettled records after cursor and counts
// those past their expiry as held.
func (e *Engine) sweepUnsettled(cursor []byte, n int, now time.Time) (ttl.Chunk, error) {
	it, err := e.db.NewIter(&pebble.IterOptions{LowerBound: append(bytes.Clone(cursor), 0), UpperBound: recordEnd})
	if err != nil {
		return ttl.Chunk{}, err
	}
	defer it.Close()
	var (
		c    ttl.Chunk
		last []byte
	)
	valid := it.First()
	for ; valid && c.Examined < n; valid = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			return ttl.Chunk{}, err
		}
		c.Examined++
		last = append(last[:0], it.Key()...)
		// Unsettled records are kept until they settle, and only counted
		// here; one that does not decode is kept too (Check reports it),
		// rather than fail every pass at it, which would stop the
		// sweeper's next passes from dropping ended buckets.
		if _, expires, err := record.Peek(v); err != nil || !now.Before(expires) {
			c.Held++
		}
	}
	if err := it.Error(); err != nil {
		return ttl.Chunk{}, err
	}
	if valid {
		c.Next = bytes.Clone(last)
	}
	return c, nil
}

// sweepOptions are the sweeper's options: the engine's, with failed
// passes logged before any OnError of the caller's is called.
func (e *Engine) sweepOptions() *ttl.Options {
	o := e.opts.Sweep
	o.Clock = sweepClock{e.clock}
	onError := o.OnError
	o.OnError = func(err error, inARow int) {
		e.opts.Logger.Errorf("idemkv: sweep pass failed (%d in a row), will retry: %v", inARow, err)
		if onError != nil {
			onError(err, inARow)
		}
	}
	return &o
}

// startSweeper starts the background sweeper (unless the store is read-only
// or the options say not to). Close stops it.
func (e *Engine) startSweeper() {
	e.sweeper.done = make(chan struct{})
	if e.opts.ReadOnly || e.opts.NoBackgroundSweep {
		close(e.sweeper.done)
		e.sweeper.stop = func() {}
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.sweeper.stop = cancel
	go func() {
		defer close(e.sweeper.done)
		if err := e.sweeper.s.Run(ctx); err != nil && ctx.Err() == nil {
			e.opts.Logger.Errorf("idemkv: sweeper stopped: %v", err)
		}
	}()
}
