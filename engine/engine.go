package engine

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bits-and-blooms/bloom/v3"
	"github.com/cespare/xxhash/v2"
	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/record"
	"github.com/idemkv/idemkv/ttl"
)

// Engine is an embedded idempotency store on Pebble. It implements
// idemkv.Store. All methods are safe for concurrent use.
type Engine struct {
	opts  *Options
	clock idemkv.Clock
	dir   string
	// disk caches whether free space is below Options.MinFreeDisk.
	disk struct {
		mu   sync.Mutex
		next atomic.Int64 // UnixNano of the next look at the filesystem
		low  atomic.Bool
	}
	db    *pebble.DB
	cache interface{ Unref() }
	yfs   *yieldFS // the store's filesystem wrapper, if any (yieldfs.go)
	// replay answers replays of recently completed records (cache.go);
	// each key's entry is used only under its shard's mutex.
	replay replayCache
	// commits combines concurrent synced writes (see committer).
	commits *committer

	// epoch is advanced (durably) by every read-write Open; fencing tokens
	// are epoch<<tokenSeqBits | seq, so tokens grow across restarts.
	epoch uint64
	seq   atomic.Uint64

	shards []shard

	// sweeper deletes expired records (sweep.go); sweepStop stops its
	// background loop, which closes sweepDone when it has returned.
	sweeper   *ttl.Sweeper
	sweepStop func()
	sweepDone chan struct{}
	// sweepUnsaved counts records examined since the sweeper last saved
	// its position. Only the running pass touches it (passes are serial).
	sweepUnsaved int
	// sweepBucket is the ended bucket the sweeper's pass is reading, and
	// sweepSaved whether a position of the pass is saved in the store.
	sweepBucket sweepBucket
	sweepSaved  bool

	// gate admits operations and lets Close wait for those in flight
	// (including their fsyncs) before it closes Pebble. Admission never
	// blocks, so an Effects callback that reads through GetData cannot
	// deadlock against a concurrent Close.
	gate struct {
		sync.Mutex
		closed   bool
		inflight int
		drained  sync.Cond // signalled when inflight drops to 0 after close
	}

	// filter keeps claims of new keys out of Pebble (claimfilter.go).
	filter claimFilter

	// buckets are the expiry buckets lookups probe (expiry.go).
	buckets bucketSet

	// failed holds the error that poisoned the engine (see ErrFailed).
	failed atomic.Pointer[error]

	counters counters

	// testHookWait, if set, is called when an operation starts waiting for
	// a write in flight (tests use it to order events without sleeping).
	testHookWait func()
	// testHookSweepChecked, if set, is called by a sweep chunk just before
	// it commits.
	testHookSweepChecked func()
}

var _ idemkv.Store = (*Engine)(nil)

const (
	tokenSeqBits = 40
	maxEpoch     = 1<<(64-tokenSeqBits) - 1
	// busyRetry is the RetryAfter given while a key's write is in flight:
	// its outcome will be known within about one fsync.
	busyRetry = 50 * time.Millisecond
)

// shard is one stripe of the in-memory lease table.
//
// Invariant: every write of a record key happens while that key has a busy
// slot, and slots are created, marked busy and removed only under mu. So a
// reader holding mu that finds no busy slot sees a record value that is
// durable and will not change until mu is released. This is also what keeps
// a concurrent duplicate from replaying a result that Pebble has made
// visible but not yet synced.
type shard struct {
	mu struct {
		sync.Mutex
		slots  map[string]*slot
		reapAt int // reap expired slots when len(slots) reaches this
		// filter, if set, holds every record key of this shard that is
		// stored or being written; nextFilter is the one being built
		// (claimfilter.go).
		filter, nextFilter *bloom.BloomFilter
	}
}

// beginWriteLocked marks s busy before a write of its key.
//
// REQUIRES: sh.mu held; s not busy.
func (sh *shard) beginWriteLocked(s *slot) {
	s.markBusy()
}

// installLocked makes s the slot of k. Every write to k happens under a
// slot, so this is also where k's replay-cache entry is dropped and where k
// joins the shard's claim filters (claimfilter.go).
//
// REQUIRES: sh.mu held.
func (e *Engine) installLocked(sh *shard, k []byte, s *slot) {
	sh.filterAddLocked(k)
	e.filter.noteAdd()
	sh.mu.slots[string(k)] = s
	e.replay.drop(k)
}

// slot is a record held in progress by a holder in this process, or a key
// with a write in flight.
type slot struct {
	rec idemkv.Record // State is StateInProgress
	// busy: a write for this key is in flight. Claims and Gets answer from
	// the state before the write (InProgress); holder operations and
	// resolutions wait for the write to end, then decide.
	busy bool
	// done is closed when the busy write ends (set by markBusy).
	done chan struct{}
	// durable: an in-progress record with rec.Token is on disk (remote mode).
	durable bool
}

const minReapAt = 1024

// markBusy marks s busy. REQUIRES: the shard mutex held; s not busy.
func (s *slot) markBusy() {
	s.busy = true
	s.done = make(chan struct{})
}

// clearBusy ends s's busy write and wakes its waiters. REQUIRES: the
// shard mutex held; s busy.
func (s *slot) clearBusy() {
	s.busy = false
	close(s.done)
}

// waitLocked waits for the busy write on s to end. It releases sh.mu while
// waiting and holds it again on return; the caller must look the key up
// afresh. It fails if ctx ends or the write poisoned the engine.
//
// REQUIRES: sh.mu held; s busy.
func (e *Engine) waitLocked(ctx context.Context, sh *shard, s *slot) error {
	done := s.done
	sh.mu.Unlock()
	if e.testHookWait != nil {
		e.testHookWait()
	}
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	sh.mu.Lock()
	if err == nil {
		if p := e.failed.Load(); p != nil {
			err = fmt.Errorf("%w: %w", idemkv.ErrFailed, *p)
		}
	}
	return err
}

// Open opens (creating if needed) the store in dir. A nil opts means
// defaults.
func Open(dir string, opts *Options) (*Engine, error) {
	o := opts.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	po := o.PebbleOptions()
	po.Logger = failStopLogger{po.Logger}
	c := pebble.NewCache(o.CacheSize)
	po.Cache = c
	db, err := openPebble(dir, po)
	if err != nil {
		c.Unref()
		return nil, fmt.Errorf("engine: open %s: %w", dir, err)
	}
	e := &Engine{opts: o, clock: o.Clock, dir: dir, db: db, cache: c, commits: newCommitter(db), shards: make([]shard, o.Shards)}
	e.yfs, _ = po.FS.(*yieldFS)
	e.gate.drained.L = &e.gate.Mutex
	e.replay = newReplayCache(o.ReplayCacheSize)
	for i := range e.shards {
		e.shards[i].mu.slots = make(map[string]*slot)
		e.shards[i].mu.reapAt = minReapAt
	}
	if err := e.advanceEpoch(); err != nil {
		if !errors.Is(err, errCommitFailed) { // else Pebble may be stuck: see failstop.go
			_ = db.Close()
			c.Unref()
		}
		return nil, err
	}
	if err := e.loadBuckets(); err != nil {
		_ = db.Close()
		c.Unref()
		return nil, err
	}
	if e.sweeper, err = ttl.New(sweepTarget{e}, &o.Sweep); err != nil {
		_ = db.Close()
		c.Unref()
		return nil, err
	}
	e.startSweeper()
	e.startClaimFilter()
	return e, nil
}

// lowOnDisk reports whether the store's filesystem has less free space
// than Options.MinFreeDisk, looking at it at most once a second.
func (e *Engine) lowOnDisk(now time.Time) bool {
	if e.opts.MinFreeDisk < 0 {
		return false
	}
	if now.UnixNano() < e.disk.next.Load() || !e.disk.mu.TryLock() {
		return e.disk.low.Load()
	}
	defer e.disk.mu.Unlock()
	if u, err := e.opts.FS.GetDiskUsage(e.dir); err == nil {
		e.disk.low.Store(u.AvailBytes < uint64(e.opts.MinFreeDisk))
	}
	e.disk.next.Store(now.Add(time.Second).UnixNano())
	return e.disk.low.Load()
}

// openPebble opens the Pebble store, turning a panic inside pebble.Open
// into an error. Pebble panics there on some filesystem errors (a failed
// rename of a format marker while a new store is created, for one) after
// cleaning up; the caller gets an error it can report, and a later Open
// finds the directory as the atomic markers left it.
func openPebble(dir string, po *pebble.Options) (db *pebble.DB, err error) {
	defer func() {
		if r := recover(); r != nil {
			db, err = nil, fmt.Errorf("engine: open: pebble failed: %v", r)
		}
	}()
	return pebble.Open(dir, po)
}

// checkLayout reports whether the store is in the layout this engine
// writes (record.Layout), and whether the marker must be written: a new,
// empty store gets it with its first epoch. A store with records or
// effects but no marker predates the marker (layout 1) and is refused.
func (e *Engine) checkLayout() (write bool, err error) {
	v, closer, err := e.db.Get(layoutKey)
	switch {
	case errors.Is(err, pebble.ErrNotFound):
		it, err := e.db.NewIter(&pebble.IterOptions{LowerBound: recordStart})
		if err != nil {
			return false, fmt.Errorf("engine: read layout: %w", err)
		}
		empty := !it.First()
		if err := it.Close(); err != nil {
			return false, fmt.Errorf("engine: read layout: %w", err)
		}
		if !empty {
			return false, fmt.Errorf("%w: the store has no layout marker, so it was written in layout 1 (effects without stamps); this engine reads layout %d and has no migration", ErrLayout, record.Layout)
		}
		return true, nil
	case err != nil:
		return false, fmt.Errorf("engine: read layout: %w", err)
	}
	defer closer.Close()
	if len(v) != 8 {
		return false, fmt.Errorf("engine: read layout: %w: %d bytes", record.ErrCorrupt, len(v))
	}
	if l := binary.BigEndian.Uint64(v); l != record.Layout {
		return false, fmt.Errorf("%w: the store is in layout %d; this engine reads layout %d", ErrLayout, l, record.Layout)
	}
	return false, nil
}

// advanceEpoch checks the store's layout, reads the stored epoch and,
// unless read-only, durably stores its successor (and the layout marker
// of a new store), so no token of this process's life can equal or
// precede one handed out before.
func (e *Engine) advanceEpoch() error {
	writeLayout, err := e.checkLayout()
	if err != nil {
		return err
	}
	v, closer, err := e.db.Get(epochKey)
	var epoch uint64
	switch {
	case errors.Is(err, pebble.ErrNotFound):
	case err != nil:
		return fmt.Errorf("engine: read epoch: %w", err)
	default:
		if len(v) != 8 {
			closer.Close()
			return fmt.Errorf("engine: read epoch: %w: %d bytes", record.ErrCorrupt, len(v))
		}
		epoch = binary.BigEndian.Uint64(v)
		closer.Close()
	}
	if e.opts.ReadOnly {
		e.epoch = epoch
		return nil
	}
	if epoch >= maxEpoch {
		return fmt.Errorf("engine: epoch space exhausted (%d opens)", epoch)
	}
	epoch++
	b := e.db.NewBatch()
	_ = b.Set(epochKey, binary.BigEndian.AppendUint64(nil, epoch), nil)
	if writeLayout {
		_ = b.Set(layoutKey, binary.BigEndian.AppendUint64(nil, record.Layout), nil)
	}
	err = commitBatch(b, pebble.Sync)
	_ = b.Close()
	if err != nil {
		return fmt.Errorf("engine: write epoch: %w", err)
	}
	e.epoch = epoch
	return nil
}

// Close waits for operations in flight, then closes the store. Leases held
// in memory are dropped: local claims vanish (their effects never
// committed), durable remote claims stay on disk.
func (e *Engine) Close() error {
	e.sweepStop()
	<-e.sweepDone
	e.filter.stop()
	<-e.filter.done
	e.gate.Lock()
	if e.gate.closed {
		e.gate.Unlock()
		return idemkv.ErrClosed
	}
	e.gate.closed = true
	for e.gate.inflight > 0 {
		e.gate.drained.Wait()
	}
	e.gate.Unlock()
	if p := e.commits.failed.Load(); p != nil {
		// Pebble's commit pipeline may be stuck behind the failed batch,
		// and closing it could hang: leave it to the process's exit (see
		// failstop.go).
		return fmt.Errorf("%w: %w", idemkv.ErrFailed, *p)
	}
	err := e.db.Close()
	e.cache.Unref()
	return err
}

// enter admits one operation; every successful enter is paired with exit.
func (e *Engine) enter() error {
	if p := e.failed.Load(); p != nil {
		return fmt.Errorf("%w: %w", idemkv.ErrFailed, *p)
	}
	e.gate.Lock()
	defer e.gate.Unlock()
	if e.gate.closed {
		return idemkv.ErrClosed
	}
	e.gate.inflight++
	return nil
}

// begin admits an operation on behalf of ctx: enter, then fail if ctx is
// already done. A successful begin is paired with exit.
func (e *Engine) begin(ctx context.Context) error {
	if err := e.enter(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		e.exit()
		return err
	}
	return nil
}

func (e *Engine) exit() {
	e.gate.Lock()
	if e.gate.inflight--; e.gate.inflight == 0 && e.gate.closed {
		e.gate.drained.Broadcast()
	}
	e.gate.Unlock()
}

// fail poisons the engine after a durable write ended with an error: the
// write may or may not have reached the disk, so no answer the engine could
// give about that key is safe any more.
func (e *Engine) fail(err error) error {
	e.failed.CompareAndSwap(nil, &err)
	return fmt.Errorf("%w: %w", idemkv.ErrFailed, err)
}

func (e *Engine) shard(k []byte) *shard { return &e.shards[e.shardIndex(k)] }

func (e *Engine) shardIndex(k []byte) int {
	return int(xxhash.Sum64(k) % uint64(len(e.shards)))
}

func (e *Engine) nextToken() uint64 {
	return e.epoch<<tokenSeqBits | e.seq.Add(1)
}

// readLocked reads the record stored for k: the unsettled record under k
// itself, or else a completed record that has not expired at now, in its
// expiry bucket. It uses prefix seeks rather than DB.Get because Get skips
// the bloom filters of L6, where nearly all records live, and nearly every
// probe looks up a key that is not there.
//
// REQUIRES: the key's shard mutex held (see shard).
func (e *Engine) readLocked(k []byte, now time.Time) (idemkv.Record, bool, error) {
	it, err := e.db.NewIter(&pebble.IterOptions{UseL6Filters: true})
	if err != nil {
		return idemkv.Record{}, false, err
	}
	var rec idemkv.Record
	found := it.SeekPrefixGE(k) && bytes.Equal(it.Key(), k)
	if found {
		var v []byte
		if v, err = it.ValueAndErr(); err == nil {
			rec, err = record.Decode(v)
		}
	} else if err = it.Error(); err == nil {
		rec, found, err = e.readBucketsLocked(it, k, now)
	}
	if cerr := it.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return idemkv.Record{}, false, fmt.Errorf("engine: read record: %w", err)
	}
	return rec, found, nil
}

// lookupLocked returns the current record for k: the in-memory slot if one
// exists, else the stored record. A completed record past its retention is
// reported absent.
//
// REQUIRES: sh.mu held.
func (e *Engine) lookupLocked(sh *shard, k []byte, now time.Time) (rec idemkv.Record, s *slot, found bool, err error) {
	if s = sh.mu.slots[string(k)]; s != nil {
		rec = s.rec
		rec.Fingerprint = bytes.Clone(rec.Fingerprint) // the slot's copy is not the caller's
		return rec, s, true, nil
	}
	// The filter first: nearly every claim is of a new key, and a key the
	// filter has never seen is neither stored nor cached (the cache holds
	// only stored records). It costs a few bit tests; a cache lookup
	// hashes the key and takes a segment lock.
	if f := sh.mu.filter; f != nil && !f.Test(k) {
		e.filter.skips.Add(1)
		return rec, nil, false, nil
	}
	if rec, ok := e.replay.get(k); ok {
		e.counters.cacheHits.Add(1)
		return rec, nil, now.Before(rec.Expires), nil
	}
	rec, found, err = e.readLocked(k, now)
	if !found && err == nil && sh.mu.filter != nil {
		e.filter.misses.Add(1)
	}
	if found && rec.State == idemkv.StateCompleted {
		if !now.Before(rec.Expires) {
			found = false
		} else {
			e.replay.put(k, &rec, now)
		}
	}
	return rec, nil, found, err
}

// Claim implements idemkv.Store.
func (e *Engine) Claim(ctx context.Context, req idemkv.ClaimRequest) (idemkv.Claim, error) {
	if err := req.Validate(); err != nil {
		return idemkv.Claim{}, err
	}
	if err := e.begin(ctx); err != nil {
		return idemkv.Claim{}, err
	}
	defer e.exit()
	class, err := e.claimClass(req.Retention)
	if err != nil {
		return idemkv.Claim{}, err
	}
	e.counters.claims.Add(1)
	leaseDur := req.Lease
	if leaseDur == 0 {
		leaseDur = e.opts.Lease
	}
	var opID idemkv.OperationID
	if req.Mode == idemkv.ModeRemote {
		if _, err := io.ReadFull(e.opts.Rand, opID[:]); err != nil {
			return idemkv.Claim{}, fmt.Errorf("engine: operation id: %w", err)
		}
		if opID.IsZero() {
			opID[0] = 1 // the zero id means "none"
		}
	}
	k := appendRecordKey(nil, req.ID)
	sh := e.shard(k)
	now := e.clock.Now()

	sh.mu.Lock()
	cur, s, found, err := e.lookupLocked(sh, k, now)
	if err != nil {
		sh.mu.Unlock()
		return idemkv.Claim{}, err
	}
	cur.ID = req.ID
	if !found {
		rec := idemkv.Record{
			ID: req.ID, State: idemkv.StateInProgress, Mode: req.Mode,
			Fingerprint: bytes.Clone(req.Fingerprint), Token: e.nextToken(), Attempt: 1,
			OperationID: opID, Created: now.Truncate(time.Second), LeaseExpires: now.Add(leaseDur),
			Expires: e.expiresAt(now, class), Class: class,
		}
		return e.acquireLocked(sh, k, rec, now)
	}
	if !bytes.Equal(cur.Fingerprint, req.Fingerprint) {
		sh.mu.Unlock()
		e.counters.mismatches.Add(1)
		cur.Result = idemkv.Result{}
		return idemkv.Claim{Outcome: idemkv.Mismatch, Record: cur}, nil
	}
	switch cur.State {
	case idemkv.StateCompleted:
		sh.mu.Unlock()
		e.counters.replays.Add(1)
		return idemkv.Claim{Outcome: idemkv.Replay, Record: cur}, nil
	case idemkv.StateUncertain:
		sh.mu.Unlock()
		e.counters.reconciling.Add(1)
		return idemkv.Claim{Outcome: idemkv.Reconciling, Record: cur}, nil
	}

	// In progress.
	if s != nil && s.busy {
		sh.mu.Unlock()
		e.counters.inProgress.Add(1)
		return idemkv.Claim{Outcome: idemkv.InProgress, Record: cur, RetryAfter: busyRetry}, nil
	}
	if now.Before(cur.LeaseExpires) {
		sh.mu.Unlock()
		e.counters.inProgress.Add(1)
		return idemkv.Claim{Outcome: idemkv.InProgress, Record: cur, RetryAfter: cur.LeaseExpires.Sub(now)}, nil
	}

	// The lease has expired. Its holder may still be running: an expired
	// lease does not prove that it stopped.
	next := cur
	next.Token = e.nextToken()
	next.Attempt = cur.Attempt + 1
	next.LeaseExpires = now.Add(leaseDur)
	durable := s == nil || s.durable
	if !durable {
		// A local claim: the stale holder's effects can only commit together
		// with its outcome, under its token, which this takeover fences off.
		// Taking over is safe; the new attempt is in effect a fresh one.
		next.Mode = req.Mode
		next.OperationID = opID
		return e.acquireLocked(sh, k, next, now)
	}
	// A durable remote claim: the stale attempt's downstream call may have
	// landed, or may still land. Only a caller whose downstream deduplicates
	// on the operation id may resume it; otherwise the outcome is unknown.
	if req.Mode == idemkv.ModeRemote && req.Resumable {
		next.Mode = idemkv.ModeRemote
		if next.OperationID.IsZero() {
			next.OperationID = opID
		}
		return e.acquireLocked(sh, k, next, now)
	}
	unc := cur
	unc.State = idemkv.StateUncertain
	unc.LeaseExpires = time.Time{}
	unc.Expires = e.expiresAt(now, unc.Class)
	unc.Note = fmt.Sprintf("lease of attempt %d expired before its remote outcome was recorded", cur.Attempt)
	if err := e.writeBusyLocked(sh, k, s, cur, &unc); err != nil {
		return idemkv.Claim{}, err
	}
	e.counters.reconciling.Add(1)
	return idemkv.Claim{Outcome: idemkv.Reconciling, Record: unc}, nil
}

// acquireLocked installs rec as k's in-progress slot and, for a remote
// claim, makes it durable before returning; while the disk is low on
// space it refuses with ErrNoSpace instead. It unlocks sh.mu.
//
// REQUIRES: sh.mu held.
func (e *Engine) acquireLocked(sh *shard, k []byte, rec idemkv.Record, now time.Time) (idemkv.Claim, error) {
	if e.lowOnDisk(now) {
		// New work, or resumed work, would need space the disk lacks.
		sh.mu.Unlock()
		return idemkv.Claim{}, fmt.Errorf("%w (less than %d bytes free)", idemkv.ErrNoSpace, e.opts.MinFreeDisk)
	}
	if rec.Attempt > 1 {
		e.counters.takeovers.Add(1)
	}
	s := &slot{rec: rec}
	e.installLocked(sh, k, s)
	if len(sh.mu.slots) >= sh.mu.reapAt {
		e.reapLocked(sh, now)
	}
	if rec.Mode == idemkv.ModeLocal {
		sh.mu.Unlock()
	} else {
		// The claim precedes a remote call: it must survive a crash, or a
		// retry after a restart would call downstream again blind.
		sh.beginWriteLocked(s)
		sh.mu.Unlock()
		b := e.db.NewBatch()
		_ = b.Set(k, record.Encode(nil, &rec), nil)
		err := e.commits.commit(b)
		_ = b.Close()
		if err != nil {
			err = e.fail(fmt.Errorf("engine: durable claim: %w", err))
			close(s.done) // waiters wake to find the engine failed; s stays busy
			return idemkv.Claim{}, err
		}
		sh.mu.Lock()
		s.durable = true
		s.clearBusy()
		sh.mu.Unlock()
	}
	e.counters.acquired.Add(1)
	return idemkv.Claim{Outcome: idemkv.Acquired, Lease: leaseOf(&rec)}, nil
}

// writeBusyLocked durably replaces k's record with next (or deletes it if
// next is nil), keeping the key busy while the write is in flight, and
// removes the slot afterwards. It unlocks sh.mu.
//
// REQUIRES: sh.mu held; s is k's slot or nil (cur is then the disk record).
func (e *Engine) writeBusyLocked(sh *shard, k []byte, s *slot, cur idemkv.Record, next *idemkv.Record) error {
	return e.writeBusyBatchLocked(sh, k, s, cur, next, e.db.NewBatch())
}

// writeBusyBatchLocked is writeBusyLocked committing b (which may already
// hold effects) together with the record change.
//
// REQUIRES: sh.mu held.
func (e *Engine) writeBusyBatchLocked(sh *shard, k []byte, s *slot, cur idemkv.Record, next *idemkv.Record, b *pebble.Batch) error {
	if s == nil {
		s = &slot{rec: cur, durable: true}
		e.installLocked(sh, k, s)
	}
	if !s.busy {
		sh.beginWriteLocked(s)
	}
	stored := s.durable && cur.State != idemkv.StateCompleted
	sh.mu.Unlock()
	e.putRecord(b, k, stored, next)
	return e.commitBusy(sh, k, s, b, next)
}

// commitBusy commits b durably and then removes k's busy slot s, waking
// its waiters; next is k's record after the write (nil if deleted), which
// the replay cache takes if it is completed. On failure the slot stays
// busy: the engine is poisoned and must not answer for k.
func (e *Engine) commitBusy(sh *shard, k []byte, s *slot, b *pebble.Batch, next *idemkv.Record) error {
	err := e.commits.commit(b)
	_ = b.Close()
	if err != nil {
		err = e.fail(fmt.Errorf("engine: commit: %w", err))
		close(s.done)
		return err
	}
	sh.mu.Lock()
	delete(sh.mu.slots, string(k))
	if next != nil {
		e.replay.put(k, next, e.clock.Now())
	}
	close(s.done)
	sh.mu.Unlock()
	return nil
}

// reapLocked drops slots whose leases have expired and that have no write
// in flight, so that holders that vanished do not grow the table forever.
// A reaped local holder is fenced; a reaped remote holder can still finish
// through its durable record.
//
// REQUIRES: sh.mu held.
func (e *Engine) reapLocked(sh *shard, now time.Time) {
	for k, s := range sh.mu.slots {
		if !s.busy && !now.Before(s.rec.LeaseExpires) {
			delete(sh.mu.slots, k)
		}
	}
	sh.mu.reapAt = max(minReapAt, 2*len(sh.mu.slots))
}

// expiresAt is the end of the retention window of class for a record
// written at now, in whole seconds as the codec stores it, so that a
// record held in memory (a slot, the replay cache) expires exactly when
// its stored copy does.
func (e *Engine) expiresAt(now time.Time, class string) time.Time {
	return record.Seconds(now.Add(e.window(class)))
}

// window is the retention window of class ("" is the default class). A
// class no longer configured (a stored record outliving a configuration
// change) gets the longest window: keeping a record too long costs space,
// dropping it too early could run an operation twice.
func (e *Engine) window(class string) time.Duration {
	if class == "" {
		return e.opts.Retention
	}
	if w, ok := e.opts.RetentionClasses[class]; ok {
		return w
	}
	return e.opts.RetentionClasses.Longest()
}

// claimClass checks that a claim's retention class is configured and
// returns the name to store: "" for the default class.
func (e *Engine) claimClass(name string) (string, error) {
	if name == "" || name == ttl.DefaultClass {
		return "", nil
	}
	if _, err := e.opts.RetentionClasses.Lookup(name); err != nil {
		return "", fmt.Errorf("%w: %w", idemkv.ErrInvalidArgument, err)
	}
	return name, nil
}

func leaseOf(r *idemkv.Record) idemkv.Lease {
	return idemkv.Lease{ID: r.ID, Mode: r.Mode, Token: r.Token, Expires: r.LeaseExpires,
		Attempt: r.Attempt, OperationID: r.OperationID}
}

// holdLocked checks that l is the current holder of k, and marks its slot
// busy so that nothing else changes k until the caller's write is done. A
// remote holder whose slot was reaped is found through its durable record.
// If another write to k is in flight (a takeover turning the record
// uncertain, say), it waits for that write and decides on its outcome, so
// that a holder is never told it is fenced before the change that fences
// it has happened.
//
// REQUIRES: sh.mu held (it may be released and reacquired while waiting).
func (e *Engine) holdLocked(ctx context.Context, sh *shard, k []byte, l idemkv.Lease) (*slot, error) {
	s := sh.mu.slots[string(k)]
	for s != nil && s.busy {
		if err := e.waitLocked(ctx, sh, s); err != nil {
			return nil, err
		}
		s = sh.mu.slots[string(k)]
	}
	if s == nil {
		rec, found, err := e.readLocked(k, e.clock.Now())
		if err != nil {
			return nil, err
		}
		if !found || rec.State != idemkv.StateInProgress || rec.Token != l.Token {
			return nil, e.fenced(l)
		}
		rec.ID = l.ID
		s = &slot{rec: rec, durable: true}
		e.installLocked(sh, k, s)
	} else if s.rec.Token != l.Token {
		return nil, e.fenced(l)
	}
	sh.beginWriteLocked(s)
	return s, nil
}

func (e *Engine) fenced(l idemkv.Lease) error {
	e.counters.fenced.Add(1)
	return fmt.Errorf("%w: token %d for key %q", idemkv.ErrFenced, l.Token, l.ID.Key)
}

func (e *Engine) validateResult(r *idemkv.Result) error {
	switch {
	case r.Status < 0 || r.Status > 65535:
		return fmt.Errorf("%w: status %d outside 0..65535", idemkv.ErrInvalidResult, r.Status)
	case len(r.Pointer) > idemkv.MaxPointerLen:
		return fmt.Errorf("%w: pointer is %d bytes, limit %d", idemkv.ErrInvalidResult, len(r.Pointer), idemkv.MaxPointerLen)
	case len(r.Body) > e.opts.MaxBodySize:
		return fmt.Errorf("%w: body is %d bytes, limit %d", idemkv.ErrInvalidResult, len(r.Body), e.opts.MaxBodySize)
	}
	return nil
}

// Complete implements idemkv.Store. The outcome and the effects commit in
// one Pebble batch with a synced write, so after a crash either both are
// present or neither is. A duplicate claim made while the commit is in
// flight answers InProgress, never a replay of a result not yet durable.
func (e *Engine) Complete(ctx context.Context, l idemkv.Lease, r idemkv.Result, apply func(idemkv.Effects) error) error {
	if err := l.Validate(); err != nil {
		return err
	}
	if err := e.validateResult(&r); err != nil {
		return err
	}
	if err := e.begin(ctx); err != nil {
		return err
	}
	defer e.exit()
	var fx effectBuf
	if apply != nil {
		if err := apply(&fx); err != nil {
			return err
		}
	}
	b := e.db.NewBatch()
	k := appendRecordKey(nil, l.ID)
	sh := e.shard(k)
	now := e.clock.Now()
	sh.mu.Lock()
	s, err := e.holdLocked(ctx, sh, k, l)
	if err != nil {
		sh.mu.Unlock()
		_ = b.Close()
		return err
	}
	done, stored := s.rec, s.durable
	sh.mu.Unlock()

	done.State = idemkv.StateCompleted
	done.LeaseExpires = time.Time{}
	done.Expires = e.expiresAt(now, done.Class)
	done.Result = idemkv.Result{Status: r.Status, Pointer: r.Pointer, Body: r.Body}
	done.Effects = fx.writeTo(b, done.Token, done.Expires)
	e.putRecord(b, k, stored, &done)
	if err := e.commitBusy(sh, k, s, b, &done); err != nil {
		return err
	}
	e.counters.completed.Add(1)
	return nil
}

// Release implements idemkv.Store. A local claim was never written, so
// releasing it writes nothing; a remote claim's record is deleted with a
// synced write, so a released claim does not come back after a crash.
func (e *Engine) Release(ctx context.Context, l idemkv.Lease) error {
	if err := l.Validate(); err != nil {
		return err
	}
	if err := e.begin(ctx); err != nil {
		return err
	}
	defer e.exit()
	k := appendRecordKey(nil, l.ID)
	sh := e.shard(k)
	sh.mu.Lock()
	s, err := e.holdLocked(ctx, sh, k, l)
	if err != nil {
		sh.mu.Unlock()
		return err
	}
	e.counters.released.Add(1)
	if !s.durable {
		delete(sh.mu.slots, string(k))
		s.clearBusy()
		sh.mu.Unlock()
		return nil
	}
	return e.writeBusyLocked(sh, k, s, s.rec, nil)
}

// MarkUncertain implements idemkv.Store. The uncertain record is written
// with a synced write, keeping the token, attempt and operation id, so a
// reconciler can settle it with Resolve.
func (e *Engine) MarkUncertain(ctx context.Context, l idemkv.Lease, note string) error {
	if err := l.Validate(); err != nil {
		return err
	}
	if len(note) > idemkv.MaxNoteLen {
		return fmt.Errorf("%w: note is %d bytes, limit %d", idemkv.ErrInvalidArgument, len(note), idemkv.MaxNoteLen)
	}
	if err := e.begin(ctx); err != nil {
		return err
	}
	defer e.exit()
	k := appendRecordKey(nil, l.ID)
	sh := e.shard(k)
	now := e.clock.Now()
	sh.mu.Lock()
	s, err := e.holdLocked(ctx, sh, k, l)
	if err != nil {
		sh.mu.Unlock()
		return err
	}
	unc := s.rec
	unc.State = idemkv.StateUncertain
	unc.LeaseExpires = time.Time{}
	unc.Expires = e.expiresAt(now, unc.Class)
	unc.Note = note
	e.counters.uncertain.Add(1)
	return e.writeBusyLocked(sh, k, s, s.rec, &unc)
}

// Renew implements idemkv.Store. Renewal is held in memory: the durable
// record of a remote claim keeps the lease it was claimed with, which only
// matters after a crash, when its holder is gone anyway.
func (e *Engine) Renew(ctx context.Context, l idemkv.Lease, d time.Duration) (idemkv.Lease, error) {
	if err := l.Validate(); err != nil {
		return idemkv.Lease{}, err
	}
	if d < 0 {
		return idemkv.Lease{}, fmt.Errorf("%w: negative lease %v", idemkv.ErrInvalidArgument, d)
	}
	if d == 0 {
		d = e.opts.Lease
	}
	if err := e.begin(ctx); err != nil {
		return idemkv.Lease{}, err
	}
	defer e.exit()
	k := appendRecordKey(nil, l.ID)
	sh := e.shard(k)
	now := e.clock.Now()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	s, err := e.holdLocked(ctx, sh, k, l)
	if err != nil {
		return idemkv.Lease{}, err
	}
	s.rec.LeaseExpires = now.Add(d)
	s.clearBusy()
	e.counters.renewed.Add(1)
	return leaseOf(&s.rec), nil
}

// Resolve implements idemkv.Store.
func (e *Engine) Resolve(ctx context.Context, req idemkv.ResolveRequest) error {
	if err := req.ID.Validate(); err != nil {
		return err
	}
	if !req.NoEffect {
		if err := e.validateResult(&req.Result); err != nil {
			return err
		}
	}
	if err := e.begin(ctx); err != nil {
		return err
	}
	defer e.exit()
	var fx effectBuf
	if req.Apply != nil {
		if err := req.Apply(&fx); err != nil {
			return err
		}
	}
	b := e.db.NewBatch()
	k := appendRecordKey(nil, req.ID)
	sh := e.shard(k)
	now := e.clock.Now()
	sh.mu.Lock()
	// Wait out a write in flight (another resolution, say), then decide on
	// the record it leaves.
	for s := sh.mu.slots[string(k)]; s != nil; s = sh.mu.slots[string(k)] {
		if !s.busy {
			sh.mu.Unlock()
			_ = b.Close()
			return fmt.Errorf("%w: %q is in progress", idemkv.ErrWrongState, req.ID.Key)
		}
		if err := e.waitLocked(ctx, sh, s); err != nil {
			sh.mu.Unlock()
			_ = b.Close()
			return err
		}
	}
	cur, found, err := e.readLocked(k, now)
	if found && cur.State == idemkv.StateCompleted && !now.Before(cur.Expires) {
		found = false // past retention: absent to every read
	}
	switch {
	case err != nil:
	case !found:
		err = fmt.Errorf("%w: %q", idemkv.ErrNotFound, req.ID.Key)
	case cur.State != idemkv.StateUncertain:
		err = fmt.Errorf("%w: %q is %s, not uncertain", idemkv.ErrWrongState, req.ID.Key, cur.State)
	case cur.Token != req.Token:
		e.counters.fenced.Add(1)
		err = fmt.Errorf("%w: token %d, record has %d", idemkv.ErrFenced, req.Token, cur.Token)
	}
	if err != nil {
		sh.mu.Unlock()
		_ = b.Close()
		return err
	}
	e.counters.resolved.Add(1)
	if req.NoEffect {
		// The record goes; effects committed with its removal are stamped
		// as ending now, rounded down so that the stamp is already past
		// (AppendStamp rounds up).
		fx.writeTo(b, cur.Token, time.Unix(now.Unix(), 0))
		return e.writeBusyBatchLocked(sh, k, nil, cur, nil, b)
	}
	done := cur
	done.State = idemkv.StateCompleted
	done.Note = ""
	done.Expires = e.expiresAt(now, done.Class)
	done.Result = idemkv.Result{Status: req.Result.Status, Pointer: req.Result.Pointer, Body: req.Result.Body}
	done.Effects = fx.writeTo(b, done.Token, done.Expires)
	return e.writeBusyBatchLocked(sh, k, nil, cur, &done, b)
}

// Get implements idemkv.Store. A record held in progress in memory is
// returned as StateInProgress; a completed record past its retention is
// ErrNotFound.
func (e *Engine) Get(ctx context.Context, id idemkv.ID) (idemkv.Record, error) {
	if err := id.Validate(); err != nil {
		return idemkv.Record{}, err
	}
	if err := e.begin(ctx); err != nil {
		return idemkv.Record{}, err
	}
	defer e.exit()
	k := appendRecordKey(nil, id)
	sh := e.shard(k)
	sh.mu.Lock()
	rec, _, found, err := e.lookupLocked(sh, k, e.clock.Now())
	sh.mu.Unlock()
	if err != nil {
		return idemkv.Record{}, err
	}
	if !found {
		return idemkv.Record{}, fmt.Errorf("%w: %q", idemkv.ErrNotFound, id.Key)
	}
	rec.ID = id
	return rec, nil
}

// GetData reads a value written through Effects. The returned slice is the
// caller's. It returns ErrNotFound if key is absent.
//
// Like any Pebble read, it may observe effects whose Complete is still
// syncing; a crash before that sync ends removes them together with their
// outcome.
func (e *Engine) GetData(key []byte) ([]byte, error) {
	if err := validateEffectKey(key); err != nil {
		return nil, err
	}
	if err := e.enter(); err != nil {
		return nil, err
	}
	defer e.exit()
	v, closer, err := e.db.Get(dataKey(key))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, fmt.Errorf("%w: data key %q", idemkv.ErrNotFound, key)
	}
	if err != nil {
		return nil, fmt.Errorf("engine: read data: %w", err)
	}
	defer closer.Close()
	_, _, val, err := record.SplitStamp(v)
	if err != nil {
		return nil, fmt.Errorf("engine: read data %q: %w", key, err)
	}
	return bytes.Clone(val), nil
}

// effectBuf collects the writes an apply function makes through Effects.
// They go into the commit's batch only once the commit knows the token and
// expiry of the outcome they pair with, which every value is stamped with
// (record.AppendStamp).
type effectBuf struct {
	ops   []effectOp
	arena []byte
	// Inline room for the common apply (a few small writes), so that
	// collecting them allocates nothing beyond the buffer itself.
	opsInline   [4]effectOp
	arenaInline [256]byte
}

// effectOp is one write, as offsets into the arena; a delete has val < 0.
type effectOp struct{ key, keyEnd, val, valEnd int }

func (w *effectBuf) init() {
	if w.ops == nil {
		w.ops, w.arena = w.opsInline[:0], w.arenaInline[:0]
	}
}

func (w *effectBuf) Set(key, value []byte) error {
	if err := validateEffectKey(key); err != nil {
		return err
	}
	w.init()
	op := effectOp{key: len(w.arena)}
	w.arena = append(w.arena, key...)
	op.keyEnd, op.val = len(w.arena), len(w.arena)
	w.arena = append(w.arena, value...)
	op.valEnd = len(w.arena)
	w.ops = append(w.ops, op)
	return nil
}

func (w *effectBuf) Delete(key []byte) error {
	if err := validateEffectKey(key); err != nil {
		return err
	}
	w.init()
	op := effectOp{key: len(w.arena), val: -1}
	w.arena = append(w.arena, key...)
	op.keyEnd = len(w.arena)
	w.ops = append(w.ops, op)
	return nil
}

// writeTo puts the collected writes into b, each value stamped with token
// and expires, and returns how many distinct keys end up set.
func (w *effectBuf) writeTo(b *pebble.Batch, token uint64, expires time.Time) int {
	var stamp [record.StampLen]byte
	record.AppendStamp(stamp[:0], token, expires)
	for _, op := range w.ops {
		key := w.arena[op.key:op.keyEnd]
		// Written in place in the batch: no copy of key or value here.
		var d *pebble.DeferredBatchOp
		if op.val < 0 {
			d = b.DeleteDeferred(1 + len(key))
		} else {
			val := w.arena[op.val:op.valEnd]
			d = b.SetDeferred(1+len(key), len(stamp)+len(val))
			copy(d.Value[copy(d.Value, stamp[:]):], val)
		}
		d.Key[0] = nsData
		copy(d.Key[1:], key)
		_ = d.Finish()
	}
	switch len(w.ops) {
	case 0:
		return 0
	case 1:
		if w.ops[0].val < 0 {
			return 0
		}
		return 1
	}
	last := make(map[string]bool, len(w.ops))
	for _, op := range w.ops {
		last[string(w.arena[op.key:op.keyEnd])] = op.val >= 0
	}
	n := 0
	for _, set := range last {
		if set {
			n++
		}
	}
	return n
}

// ScanData calls fn for each value written through Effects whose key starts
// with prefix, in key order, until fn returns false. The key and value
// passed to fn are valid only during the call. Like GetData, it may
// observe effects whose Complete is still syncing.
func (e *Engine) ScanData(prefix []byte, fn func(key, value []byte) bool) error {
	return e.ScanDataAfter(prefix, nil, fn)
}

// ScanDataAfter is ScanData resuming after the key after, which must start
// with prefix (the last key a previous scan passed to fn, say); a nil
// after starts at the beginning. Keys written meanwhile are seen if they
// sort after it, so pages read this way never repeat a key.
func (e *Engine) ScanDataAfter(prefix, after []byte, fn func(key, value []byte) bool) error {
	switch {
	case len(prefix) > MaxEffectKeyLen:
		return fmt.Errorf("%w: prefix is %d bytes, limit %d", idemkv.ErrInvalidArgument, len(prefix), MaxEffectKeyLen)
	case after != nil && !bytes.HasPrefix(after, prefix):
		return fmt.Errorf("%w: scan resumes after %q, which does not start with the prefix %q", idemkv.ErrInvalidArgument, after, prefix)
	}
	if err := e.enter(); err != nil {
		return err
	}
	defer e.exit()
	first := dataKey(prefix)
	upper := prefixEnd(first)
	lower := first
	if after != nil {
		lower = append(dataKey(after), 0) // the first key after it
	}
	it, err := e.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return fmt.Errorf("engine: scan data: %w", err)
	}
	n := len(first) - len(prefix)
	for valid := it.First(); valid; valid = it.Next() {
		v, err := it.ValueAndErr()
		if err == nil {
			_, _, v, err = record.SplitStamp(v)
		}
		if err != nil {
			it.Close()
			return fmt.Errorf("engine: scan data: %w", err)
		}
		if !fn(it.Key()[n:], v) {
			break
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("engine: scan data: %w", err)
	}
	return nil
}

// prefixEnd returns the smallest key greater than every key with prefix p,
// or nil if there is none (p is all 0xff).
func prefixEnd(p []byte) []byte {
	end := bytes.Clone(p)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] != 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}

// Retention returns how long a record of the retention class named class
// ("" or ttl.DefaultClass: the default class) is kept after it completes.
// It fails with an error wrapping idemkv.ErrInvalidArgument for a class
// the engine is not configured with.
func (e *Engine) Retention(class string) (time.Duration, error) {
	c, err := e.claimClass(class)
	if err != nil {
		return 0, err
	}
	return e.window(c), nil
}
