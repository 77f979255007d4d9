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
// Sweeper deletes are not synced. Losing one in a crash brings back a
// record that every read already treats as absent, and the next pass
// deletes it again; the next synced write makes it durable anyway, since
// Pebble's log is ordered.
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
// (beginWriteLocked waits) until the batch is committed. So no write of a
// deleted key can begin between its check and the delete, and yet no
// engine lock is held while the batch commits.

// sweepSaveEvery is how many records a pass may read without deleting
// anything before it saves its position anyway.
const sweepSaveEvery = 1 << 14

// defaultSweepBatch is how many expired records a pass gathers before it
// deletes them in one batch (Engine.sweepBatch; tests lower it).
const defaultSweepBatch = 256

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
	vlen  int // the value's length
	shard int
}

// sweepPending is what a pass has scanned but not yet deleted: deletes are
// gathered over several chunks so that a pass commits one batch per
// sweepBatch candidates rather than one per chunk (each commit is a trip
// through Pebble's commit pipeline, shared with the foreground's).
type sweepPending struct {
	gens  []uint64 // the shards' write counts before the first scan
	cands []sweepCandidate
	next  []byte // where the scan stopped; nil at the end of the pass
	held  int
}

func (t sweepTarget) SweepChunk(ctx context.Context, cursor []byte, n int, now time.Time) (ttl.Chunk, error) {
	e := t.e
	if err := e.begin(ctx); err != nil {
		return ttl.Chunk{}, err
	}
	defer e.exit()

	// Pending candidates carry over only to the chunk that continues
	// exactly where they were scanned; anything else (a new or resumed
	// pass) starts afresh from the saved position.
	p := e.sweepPend
	if p == nil || !bytes.Equal(p.next, cursor) || p.next == nil {
		p = &sweepPending{gens: make([]uint64, len(e.shards))}
		for i := range e.shards {
			p.gens[i] = e.shards[i].writes.Load()
		}
		e.sweepUnsaved = 0
	}
	e.sweepPend = nil
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
		p.cands = append(p.cands, sweepCandidate{k: k, vlen: len(v), shard: e.shardIndex(k)})
	}
	if err := it.Close(); err != nil {
		return ttl.Chunk{}, fmt.Errorf("engine: sweep: %w", err)
	}
	p.next = nil
	if valid { // stopped at n with records left
		p.next = bytes.Clone(last)
	}
	c.Next = p.next
	e.sweepUnsaved += c.Examined
	switch {
	case p.next == nil && cursor == nil && len(p.cands) == 0:
		return c, nil // a whole pass in one chunk that found nothing
	case p.next != nil && len(p.cands) < e.sweepBatch && e.sweepUnsaved < sweepSaveEvery:
		// Keep gathering; a restart at worst re-reads sweepSaveEvery
		// records.
		e.sweepPend = p
		return c, nil
	}
	e.sweepUnsaved = 0
	del, err := e.sweepDelete(p, now)
	c.Deleted, c.DeletedBytes, c.Held = del.Deleted, del.DeletedBytes, c.Held+del.Held
	return c, err
}

// sweepDelete checks p's candidates again under their shards' mutexes
// and deletes those still expired, saving the position p.next in the
// same batch.
func (e *Engine) sweepDelete(p *sweepPending, now time.Time) (ttl.Chunk, error) {
	var c ttl.Chunk
	if e.testHookSweepScanned != nil {
		e.testHookSweepScanned()
	}
	b := e.db.NewBatch()
	defer b.Close()
	cands := p.cands
	slices.SortFunc(cands, func(a, b sweepCandidate) int { return a.shard - b.shard })
	fence := make(chan struct{})
	var fenced []*shard
	defer func() {
		close(fence)
		for _, sh := range fenced {
			sh.fence.CompareAndSwap(&fence, nil)
		}
	}()
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
			if sh.writes.Load() != p.gens[cd.shard] {
				rec, found, err := e.readLocked(cd.k)
				if err != nil {
					sh.mu.Unlock()
					return c, err
				}
				if !found || rec.State != idemkv.StateCompleted || now.Before(rec.Expires) {
					continue // replaced since the scan
				}
			}
			sh.mu.cache.drop(cd.k)
			_ = b.DeleteSized(cd.k, uint32(cd.vlen), nil)
			c.Deleted++
			c.DeletedBytes += int64(len(cd.k) + cd.vlen)
			deleted = true
		}
		if deleted {
			// No write may begin in this shard until the batch is in.
			sh.fence.Store(&fence)
			fenced = append(fenced, sh)
		}
		sh.mu.Unlock()
	}
	if e.testHookSweepChecked != nil {
		e.testHookSweepChecked()
	}
	if p.next != nil {
		_ = b.Set(sweepKey, p.next, nil)
	} else {
		_ = b.Delete(sweepKey, nil)
	}
	if err := b.Commit(pebble.NoSync); err != nil {
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
