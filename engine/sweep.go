package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/record"
	"github.com/idemkv/idemkv/ttl"
)

// The sweeper (package ttl) walks the record namespace in key order, a
// chunk at a time, and deletes completed records past their expiry. Each
// chunk's deletes and the position reached are one atomic batch, so a pass
// resumes where it stopped after a crash or a restart.
//
// Sweeper deletes need no sync of their own. Losing one in a crash brings
// back a record that every read already treats as absent, and the next
// pass deletes it again. They go through the committer without asking for
// a sync: while requests are committing, a chunk's deletes ride in their
// next group, synced with it, instead of taking a commit of their own; on
// an idle store a chunk commits alone, unsynced. Either way every Pebble
// commit the engine makes goes through the committer, one at a time.
//
// A delete must not remove a record that a write replaced after the scan
// read it. Every record write begins by marking its key's slot busy and
// ends by clearing or removing it and bumping the shard's write count,
// both under the shard mutex. A chunk reads the counts before it creates
// its iterator. Then, shard by shard under the mutex: a key with a slot is
// skipped (a holder or a write is at work on it); a key in a shard whose
// count has not moved is exactly as the iterator saw it; any other key is
// read again. Before releasing the mutex of a shard with deletes, the
// chunk sets the shard's fence, and no write may begin in a fenced shard
// (beginWriteLocked waits) until the batch is in the committer's queue,
// which orders it before every write queued later. So no write of a
// deleted key can begin between its check and the delete, and yet no
// engine lock is held while the batch commits.

// sweepSaveEvery is how many records a pass may read without deleting
// anything before it saves its position anyway.
const sweepSaveEvery = 1 << 14

var (
	sweepKey    = record.SweepKey
	recordStart = []byte{record.NSRecord}
	recordEnd   = []byte{record.NSRecord + 1}
)

// Sweep runs the sweeper's current pass to its end, deleting every
// completed record that is past its expiry when the pass reaches it, and
// returns what the pass did. If the background sweeper is in the middle of
// a pass, Sweep waits for it and then runs a pass of its own. Running it
// twice is harmless.
func (e *Engine) Sweep(ctx context.Context) (ttl.Pass, error) {
	if e.opts.ReadOnly {
		return ttl.Pass{}, fmt.Errorf("engine: sweep: %w: store opened read-only", idemkv.ErrInvalidArgument)
	}
	return e.sweeper.Pass(ctx)
}

// sweepTarget adapts the engine to ttl.Target without adding the chunk
// methods to Engine's own API.
type sweepTarget struct{ e *Engine }

func (t sweepTarget) SweepCursor() ([]byte, error) {
	v, closer, err := t.e.db.Get(sweepKey)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("engine: read sweep cursor: %w", err)
	}
	defer closer.Close()
	if len(v) == 0 || v[0] != record.NSRecord {
		return nil, fmt.Errorf("engine: read sweep cursor: %w: %q", record.ErrCorrupt, v)
	}
	return bytes.Clone(v), nil
}

type sweepCandidate struct {
	k     []byte
	size  int // key and value bytes
	shard int
}

func (t sweepTarget) SweepChunk(ctx context.Context, cursor []byte, n int, now time.Time) (ttl.Chunk, error) {
	e := t.e
	if err := e.begin(ctx); err != nil {
		return ttl.Chunk{}, err
	}
	defer e.exit()

	gens := make([]uint64, len(e.shards))
	for i := range e.shards {
		gens[i] = e.shards[i].writes.Load()
	}
	lower := recordStart
	if cursor != nil {
		lower = append(bytes.Clone(cursor), 0) // the first key after cursor
	}
	it, err := e.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: recordEnd})
	if err != nil {
		return ttl.Chunk{}, fmt.Errorf("engine: sweep: %w", err)
	}
	var (
		c     ttl.Chunk
		cands []sweepCandidate
		last  []byte
		valid = it.First()
	)
	for ; valid && c.Examined < n; valid = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			_ = it.Close()
			return ttl.Chunk{}, fmt.Errorf("engine: sweep: %w", err)
		}
		state, expires, err := record.Peek(v)
		if err != nil {
			_ = it.Close()
			return ttl.Chunk{}, fmt.Errorf("engine: sweep: record %q: %w", it.Key(), err)
		}
		c.Examined++
		last = append(last[:0], it.Key()...)
		if now.Before(expires) {
			continue
		}
		if state != idemkv.StateCompleted {
			c.Held++ // unsettled: kept until it settles
			continue
		}
		k := bytes.Clone(it.Key())
		cands = append(cands, sweepCandidate{k: k, size: len(k) + len(v), shard: e.shardIndex(k)})
	}
	if err := it.Close(); err != nil {
		return ttl.Chunk{}, fmt.Errorf("engine: sweep: %w", err)
	}
	if valid { // stopped at n with records left
		c.Next = bytes.Clone(last)
	}

	if e.testHookSweepScanned != nil {
		e.testHookSweepScanned()
	}
	b := e.db.NewBatch()
	defer b.Close()
	slices.SortFunc(cands, func(a, b sweepCandidate) int { return a.shard - b.shard })
	fence := make(chan struct{})
	var fenced []*shard
	lifted := false
	lift := func() {
		if !lifted {
			lifted = true
			close(fence)
			for _, sh := range fenced {
				sh.fence.CompareAndSwap(&fence, nil)
			}
		}
	}
	defer lift()
	for i := 0; i < len(cands); {
		sh := &e.shards[cands[i].shard]
		sh.mu.Lock()
		deleted := false
		for ; i < len(cands) && &e.shards[cands[i].shard] == sh; i++ {
			cd := cands[i]
			if sh.mu.slots[string(cd.k)] != nil {
				c.Held++ // a holder or a write is at work on it
				continue
			}
			if sh.writes.Load() != gens[cd.shard] {
				rec, found, err := e.readLocked(cd.k)
				if err != nil {
					sh.mu.Unlock()
					return ttl.Chunk{}, err
				}
				if !found || rec.State != idemkv.StateCompleted || now.Before(rec.Expires) {
					continue // replaced since the scan
				}
			}
			sh.mu.cache.drop(cd.k)
			// The size is a hint for Pebble's compaction picker; key and
			// value together are what the delete frees.
			_ = b.DeleteSized(cd.k, uint32(cd.size), nil)
			c.Deleted++
			c.DeletedBytes += int64(cd.size)
			deleted = true
		}
		if deleted {
			// No write may begin in this shard until the batch is in.
			sh.fence.Store(&fence)
			fenced = append(fenced, sh)
		}
		sh.mu.Unlock()
	}
	e.sweepUnsaved += c.Examined
	if c.Deleted == 0 && (c.Next == nil && cursor == nil || c.Next != nil && e.sweepUnsaved < sweepSaveEvery) {
		// Nothing to delete, and the position need not be saved yet: a
		// restart at worst re-reads sweepSaveEvery records.
		return c, nil
	}
	e.sweepUnsaved = 0
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
	// of their own. Once enqueued they are ordered before any write that
	// begins after the fence is lifted, so the fence is lifted then, not
	// after the commit.
	g, first, err := e.commits.enqueue(b, false)
	lift()
	if werr := e.commits.wait(g, first); err == nil {
		err = werr
	}
	if err != nil {
		return ttl.Chunk{}, e.fail(fmt.Errorf("engine: sweep: commit: %w", err))
	}
	e.counters.swept.Add(int64(c.Deleted))
	return c, nil
}

// startSweeper starts the background sweeper (unless the store is read-only
// or the options say not to). Close stops it.
func (e *Engine) startSweeper() {
	e.sweepDone = make(chan struct{})
	if e.opts.ReadOnly || e.opts.NoBackgroundSweep {
		close(e.sweepDone)
		e.sweepStop = func() {}
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.sweepStop = cancel
	go func() {
		defer close(e.sweepDone)
		if err := e.sweeper.Run(ctx); err != nil && ctx.Err() == nil {
			e.opts.Logger.Errorf("idemkv: sweeper stopped: %v", err)
		}
	}()
}
