package engine

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// maxGroupBytes bounds one combined batch. Pebble treats a batch larger
// than half a memtable specially (as a flushable batch); staying well below
// keeps every group on the ordinary path.
const maxGroupBytes = 1 << 20

// maxRunning is how many groups may be in Pebble's commit pipeline at once.
// With more than one, a group's WAL write and memtable apply overlap the
// previous group's fsync; with one, groups are larger and fewer, and one
// measured faster than two or four (docs/design.md).
//
// It must stay one: after a failed commit no other may be in Pebble's
// pipeline (failstop.go). The array below fails to compile otherwise.
const maxRunning = 1

var _ = [1]struct{}{}[maxRunning-1]

// committer combines concurrent synced writes into one Pebble batch, one
// commit and one fsync (write combining on top of Pebble's own group
// commit, which merges fsyncs but still runs every batch through its commit
// pipeline).
//
// At most maxRunning groups are being committed at a time; writers that
// arrive meanwhile join the open group, which the first of them commits as
// soon as a running group is done. A lone writer commits at once, so a
// request at concurrency 1 pays one commit and one fsync, as before.
//
// A writer returns only after the group holding its batch is durable. The
// caller's batch is copied; the caller still owns it.
type committer struct {
	db *pebble.DB
	mu struct {
		sync.Mutex
		// open groups, oldest first: open[0] is the next to commit. A group
		// stops taking members when it reaches maxGroupBytes.
		open []*commitGroup
		// running is the number of groups being committed.
		running int
		// pending holds the data and outbox keys that groups not yet
		// committed write, with the versions they write (txn.go).
		pending map[string]pendingWrite
		// outboxSeq is the sequence of the last event enqueued, and
		// outboxCommitted of the last committed.
		outboxSeq, outboxCommitted uint64
	}
	// outboxReady receives a value after a group with events commits.
	outboxReady chan struct{}
	// entities caches committed entity sequences; eventEpoch counts the
	// groups with events committed (entityseq.go).
	entities   entityCache
	eventEpoch atomic.Uint64
	// entityFilter holds the entities that exist (entityseq.go).
	entityFilter *entityFilter
	// groups and writes count commits and the batches they carried.
	groups, writes atomic.Int64
	// busy and syncWait sum, in nanoseconds, the time groups spent being
	// committed and the part of it Pebble waited for the WAL fsync
	// (Stats.CommitTime, Stats.CommitSyncWait).
	busy, syncWait atomic.Int64
	// failed is set once a commit has failed: no commit is tried after it.
	failed atomic.Pointer[error]
	// stamp, if set, may add a write to a synced group before it commits
	// (the engine's clock mark, clock.go).
	stamp func(*pebble.Batch)
}

type commitGroup struct {
	b    *pebble.Batch
	n    int           // writers in the group
	sync bool          // whether any member needs its writes synced
	lead chan struct{} // closed when the group's first writer must commit it
	done chan struct{} // closed when the commit has ended; err is then set
	err  error
	// keys are the pending keys the group writes; events counts its
	// outbox events (txn.go).
	keys   []string
	events int
	// lastEvent is the sequence of its last event.
	lastEvent uint64
}

func newCommitter(db *pebble.DB) *committer {
	return &committer{db: db, outboxReady: make(chan struct{}, 1)}
}

// commit makes b's writes durable, together with other writers' batches.
func (c *committer) commit(b *pebble.Batch) error { return c.commitTxn(b, nil) }

// commitTxn is commit for a batch whose reads t (if not nil) must still
// hold, and whose events t numbers; errConflict if they do not hold,
// and then nothing is written.
func (c *committer) commitTxn(b *pebble.Batch, t *txn) error {
	if t != nil {
		if err := c.prefetchEntities(t); err != nil {
			return err
		}
	}
	g, first, err := c.enqueue(b, true, t)
	if err != nil && !first {
		return err
	}
	if werr := c.wait(g, first); err == nil {
		err = werr
	}
	return err
}

// enqueue puts b's writes into the newest open group with room for them,
// or into a new group, which the caller then leads (first). From then on
// they are ordered: after every write enqueued before them, before every
// write enqueued after. sync says whether they must be synced before wait
// returns; without it they commit with the group, synced if any other
// member needs it. If first, the caller must call wait(g, first), even
// on error, so that the turn passes on. If t's reads no longer hold, it
// fails with errConflict before joining any group (g nil), as it fails if
// its events' entity sequences cannot be read.
func (c *committer) enqueue(b *pebble.Batch, sync bool, t *txn) (g *commitGroup, first bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var seqs []uint64
	if t != nil {
		if err := c.checkReadsLocked(t); err != nil {
			return nil, false, err
		}
		// Numbered before anything joins a group: a read that fails
		// must not leave a group with the writes and some of the events.
		if seqs, err = c.entitySeqsLocked(t); err != nil {
			return nil, false, err
		}
	}
	if n := len(c.mu.open); n > 0 && int(c.mu.open[n-1].b.Len())+len(b.Repr()) <= maxGroupBytes {
		g = c.mu.open[n-1]
	}
	first = g == nil
	if first {
		g = &commitGroup{b: c.db.NewBatch(), lead: make(chan struct{}), done: make(chan struct{})}
		c.mu.open = append(c.mu.open, g)
	}
	// A writer is counted even if Apply fails (only on a malformed batch,
	// which the engine never builds), so that a group it opened is
	// committed, empty of its writes, and the turn passes on.
	g.n++
	g.sync = g.sync || sync
	if err := g.b.Apply(b, nil); err != nil || t == nil {
		return g, first, err
	}
	return g, first, c.addLocked(g, t, seqs)
}

// wait waits for the commit of g, leading it if first, and returns its
// error.
func (c *committer) wait(g *commitGroup, first bool) error {
	if first {
		c.lead(g)
	} else {
		<-g.done
	}
	return g.err
}

// startLocked starts the oldest open groups while fewer than maxRunning
// are running: each is closed to newcomers and its first writer told to
// commit it. REQUIRES: c.mu held.
func (c *committer) startLocked() {
	for c.mu.running < maxRunning && len(c.mu.open) > 0 {
		g := c.mu.open[0]
		c.mu.open = c.mu.open[1:]
		c.mu.running++
		close(g.lead)
	}
}

// lead waits for g's turn, commits it, and hands the turn to the next open
// group.
func (c *committer) lead(g *commitGroup) {
	c.mu.Lock()
	c.startLocked()
	c.mu.Unlock()
	<-g.lead
	defer func() {
		// A panic here (out of the clock's stamp, say) must not tell the
		// group's other writers that their writes are durable: it is a
		// failed commit, for all of them.
		if r := recover(); r != nil {
			g.err = fmt.Errorf("%w: panic while committing: %v", errCommitFailed, r)
			c.failed.CompareAndSwap(nil, &g.err)
		}
		close(g.done)
		c.mu.Lock()
		c.committedLocked(g)
		c.mu.running--
		c.startLocked()
		c.mu.Unlock()
	}()

	start := time.Now()
	// g is closed to newcomers now: g.sync is final.
	wo := pebble.NoSync
	if g.sync {
		wo = pebble.Sync
		if c.stamp != nil {
			c.stamp(g.b)
		}
	}
	if p := c.failed.Load(); p != nil {
		// Pebble's pipeline may be stuck behind the failed batch: a
		// commit now could hang (see failstop.go).
		g.err = *p
	} else if g.err = commitBatch(g.b, wo); g.err != nil {
		// Whatever the error, the commit's fate is unknown and Pebble's
		// pipeline may be stuck: no commit follows a failed one.
		c.failed.CompareAndSwap(nil, &g.err)
	}
	c.busy.Add(int64(time.Since(start)))
	c.syncWait.Add(int64(g.b.CommitStats().CommitWaitDuration))
	_ = g.b.Close()
	c.groups.Add(1)
	c.writes.Add(int64(g.n))
}
