package engine

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/ttl"
)

// Engine is an embedded idempotency store on Pebble. It implements
// idemkv.Store. All methods are safe for concurrent use.
//
// Its parts, each in a file of its own: the lease table of keys in play
// (leasetable.go), the claim decision (decide.go), claims (claim.go), the
// holder's and the reconciler's writes (settle.go), reads (read.go), the
// business data written through Effects (effects.go), the committer that
// groups synced writes (commit.go), the expiry buckets and the sweeper
// (expiry.go, sweep.go), the claim filter (claimfilter.go), the replay
// cache (cache.go), the admission gate (gate.go), the disk-space guard
// (disk.go), the health of Pebble's background work (health.go), its
// write stalls (stall.go) and the engine's time, checked against a steady
// clock (clock.go).
type Engine struct {
	opts *Options
	// clock is the engine's time (clock.go), never Options.Clock directly.
	clock *engineClock
	dir   string
	db    *pebble.DB
	popts *pebble.Options // what db was opened with
	cache interface{ Unref() }

	gate gate
	disk diskGuard
	// health is the state of Pebble's background work (health.go).
	health *health
	// stalls counts Pebble's write stalls (stall.go).
	stalls *writeStalls
	table  leaseTable
	// commits combines concurrent synced writes (commit.go).
	commits *committer
	// filter keeps claims of new keys out of Pebble (claimfilter.go).
	filter claimFilter
	// buckets are the expiry buckets lookups probe (expiry.go).
	buckets bucketSet
	// sweeper deletes expired records (sweep.go).
	sweeper sweepState

	// epoch is advanced (durably) by every read-write Open; fencing tokens
	// are epoch<<tokenSeqBits | seq, so tokens grow across restarts.
	epoch uint64
	seq   atomic.Uint64
	// layout is the store's layout: record.Layout once a read-write Open
	// has written it; a read-only Open may read layout 4 as it is.
	layout uint64
	// secret keys the operation ids of new remote records
	// (record.SecretKey); nil only on a read-only store that has none.
	secret []byte
	opIDs  *idemkv.OperationIDs // derives under secret

	counters counters
	// backupMu runs one Backup at a time (backup.go).
	backupMu sync.Mutex
	// pending counts the pending index by kind (pending.go).
	pending pendingCounts
	// outbox is the outbox's acknowledged cursor (outbox.go).
	outbox outboxState

	// testHookWait, if set, is called when an operation starts waiting for
	// a write in flight (tests use it to order events without sleeping).
	testHookWait func()
	// testHookSweepChecked, if set, is called by a sweep chunk just before
	// it commits.
	testHookSweepChecked func()
	// testHookWrite and testHookLookup, if set, are called as a write
	// that marked its slot busy begins to build its batch, and as a
	// lookup begins under its stripe mutex (tests panic in them).
	testHookWrite, testHookLookup func()
}

var (
	_ idemkv.Store       = (*Engine)(nil)
	_ idemkv.OffsetClock = (*Engine)(nil)
)

const (
	tokenSeqBits = 40
	maxEpoch     = 1<<(64-tokenSeqBits) - 1
)

// Open opens (creating if needed) the store in dir. A nil opts means
// defaults.
func Open(dir string, opts *Options) (*Engine, error) {
	o := opts.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	h := &health{logf: o.Logger.Errorf, now: o.Clock.Now}
	stalls := &writeStalls{now: time.Now}
	el := pebble.TeeEventListener(h.listener(), stalls.listener())
	po := o.pebbleOptions(&el)
	po.Logger = failStopLogger{po.Logger}
	c := pebble.NewCache(o.CacheSize)
	po.Cache = c
	db, err := openPebble(dir, po)
	if err != nil {
		c.Unref()
		return nil, fmt.Errorf("engine: open %s: %w", dir, err)
	}
	mark, err := readClockMark(db)
	if err != nil {
		_ = db.Close()
		c.Unref()
		return nil, err
	}
	e := &Engine{opts: o, dir: dir, db: db, popts: po, cache: c, commits: newCommitter(db), health: h, stalls: stalls}
	e.clock = newEngineClock(o.Clock, o.ClockTolerance, mark, o.Logger.Errorf)
	e.commits.stamp = e.clock.stamp
	e.gate.init()
	e.disk = diskGuard{fs: o.FS, dir: dir, min: o.MinFreeDisk}
	e.table.init(o.Shards, newReplayCache(o.ReplayCacheSize), &e.filter)
	closeDB := func() {
		_ = db.Close()
		c.Unref()
	}
	if err := e.advanceEpoch(); err != nil {
		if !errors.Is(err, errCommitFailed) { // else Pebble may be stuck: see failstop.go
			closeDB()
		}
		return nil, err
	}
	e.opIDs = idemkv.NewOperationIDs(e.secret)
	if err := e.loadBuckets(); err != nil {
		closeDB()
		return nil, err
	}
	if err := e.loadOutbox(); err != nil {
		closeDB()
		return nil, fmt.Errorf("engine: read outbox: %w", err)
	}
	if err := e.countPending(); err != nil {
		closeDB()
		return nil, fmt.Errorf("engine: read pending index: %w", err)
	}
	if e.sweeper.s, err = ttl.New(sweepTarget{e}, e.sweepOptions()); err != nil {
		closeDB()
		return nil, err
	}
	e.startSweeper()
	e.startClaimFilter()
	return e, nil
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
	db, err = pebble.Open(dir, po)
	if err != nil && lockHeld(err) {
		err = fmt.Errorf("%w: %s (%w)", ErrLocked, dir, err)
	}
	return db, err
}

// ErrLocked is returned (wrapped) by Open and StoredLayout when another
// process, or another Open in this one, holds the store: one process at a
// time may open it, even read-only. Stop the other (`serve`, say), or ask
// it through its admin API.
var ErrLocked = errors.New("engine: the store is open in another process")

// lockHeld reports whether err is Pebble's refusal of a directory lock
// held elsewhere: the lock's fcntl fails with a bare EAGAIN or EACCES
// when another process holds it (a failure to create the lock file is a
// path error instead), and Pebble refuses a second lock in its own
// process with an error of its own, known only by its text.
func lockHeld(err error) bool {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return false
	}
	return errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EACCES) ||
		strings.Contains(err.Error(), "lock held by current process")
}

// Close waits for operations in flight, then closes the store. Leases held
// in memory are dropped: local claims vanish (their effects never
// committed), durable remote claims stay on disk. A store that failed is
// closed all the same, and Close returns its ErrFailed.
func (e *Engine) Close() error {
	e.sweeper.stop()
	<-e.sweeper.done
	e.filter.stop()
	<-e.filter.done
	if !e.gate.close() {
		return idemkv.ErrClosed
	}
	if p := e.commits.failed.Load(); p != nil {
		// Pebble's commit pipeline may be stuck behind the failed batch,
		// and closing it could hang: leave it to the process's exit (see
		// failstop.go).
		return fmt.Errorf("%w: %w", idemkv.ErrFailed, *p)
	}
	// A failed engine still closes Pebble, and says it had failed.
	err := e.gate.err()
	if err == nil && !e.opts.ReadOnly {
		err = e.clock.writeMark(e.db)
		if serr := e.saveClaimFilter(); serr != nil {
			// Only the next Open's speed depends on it: it scans.
			e.opts.Logger.Errorf("idemkv: save claim filter: %v", serr)
		}
	}
	err = errors.Join(err, e.db.Close())
	e.cache.Unref()
	return err
}

// fail poisons the engine after a durable write ended with an error: the
// write may or may not have reached the disk, so no answer the engine could
// give about that key is safe any more.
func (e *Engine) fail(err error) error { return e.gate.fail(err) }

// ErrReadOnly is returned by every call that would change a store opened
// with Options.ReadOnly. It is also an idemkv.ErrInvalidArgument.
var ErrReadOnly = fmt.Errorf("%w: store opened read-only", idemkv.ErrInvalidArgument)

// writable refuses a state-changing call on a read-only store: a claim it
// acquired could never be completed.
func (e *Engine) writable() error {
	if e.opts.ReadOnly {
		return ErrReadOnly
	}
	return nil
}

// maxSeq is the last sequence number of an epoch.
const maxSeq = 1<<tokenSeqBits - 1

// nextToken returns a new token of this Open's epoch. Once the epoch's
// 2^40 sequence numbers are used, a token would spill into the epoch's
// bits and repeat an earlier one, so the engine fails instead (ErrFailed,
// and /healthz says so): reopening it advances the epoch.
func (e *Engine) nextToken() (uint64, error) {
	s := e.seq.Add(1)
	if s > maxSeq {
		return 0, e.fail(errors.New("every token of this Open's epoch has been issued; reopen the store to advance it"))
	}
	return e.epoch<<tokenSeqBits | s, nil
}
