package engine

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine/internal/record"
	"github.com/idemkv/idemkv/ttl"
)

type counters struct {
	claims, acquired, takeovers, replays, inProgress, mismatches, reconciling atomic.Int64
	completed, released, uncertain, renewed, resolved, escalated, fenced      atomic.Int64
	conflicts                                                                 atomic.Int64
	cacheHits, swept                                                          atomic.Int64
	diskRefusals                                                              atomic.Int64 // claims refused by the disk guard
}

// count counts a claim answered o.
func (c *counters) count(o idemkv.Outcome) {
	switch o {
	case idemkv.Acquired:
		c.acquired.Add(1)
	case idemkv.InProgress:
		c.inProgress.Add(1)
	case idemkv.Replay:
		c.replays.Add(1)
	case idemkv.Mismatch:
		c.mismatches.Add(1)
	case idemkv.Reconciling:
		c.reconciling.Add(1)
	}
}

// Stats is a cheap snapshot of the engine: what it holds in memory, what it
// has done since Open, and the Pebble figures worth watching. It does not
// scan the store; see Census for counts of stored records.
type Stats struct {
	// Held leases in this process, by mode, and how many keys have a write
	// in flight.
	HeldLocal, HeldRemote, Busy int

	// Operations since Open: what every store counts (Counts), and more.
	idemkv.Counts
	Takeovers   int64 // acquisitions that took over an expired lease
	Reconciling int64 // claims answered Reconciling
	Released    int64
	Uncertain   int64 // MarkUncertain calls that succeeded
	Renewed     int64
	Resolved    int64
	Escalations int64 // Escalate calls that succeeded
	// ReplayCacheHits counts lookups answered from the replay cache;
	// ReplayCached is how many records it holds now.
	ReplayCacheHits int64
	ReplayCached    int

	// The claim filter (Options.ClaimFilterBitsPerKey). ClaimFilterSkips
	// counts lookups it answered absent without reading Pebble;
	// ClaimFilterMisses those it let through that found nothing (false
	// positives, and keys deleted since the filter was built).
	// ClaimFilterKeys is the record count the filter in use is sized for
	// (0 until the first build after Open ends), ClaimFilterStored the
	// records its last build found, ClaimFilterBuilds the builds since Open
	// and ClaimFilterFailures those that failed (each is retried with
	// backoff, and logged). ClaimFilterSaved reports that the filter in use
	// since Open was read from the file the last Close saved, rather than
	// built by scanning the store (claimfilter_save.go); it counts as a build.
	ClaimFilterSkips, ClaimFilterMisses    int64
	ClaimFilterKeys, ClaimFilterStored     int64
	ClaimFilterBuilds, ClaimFilterFailures int64
	ClaimFilterSaved                       bool

	// The committer, which combines concurrent synced writes into one
	// Pebble commit and one fsync (docs/design.md, "Concurrency inside the
	// engine"):
	// CommitGroups commits since Open carried CommitWrites writes.
	// CommitTime is the time they took; groups commit one at a time, so
	// its growth divided by the wall-clock time between two snapshots is
	// how busy the commit path was. Near 1, it is saturated: synced writes
	// queue for it, and the disk's fsync latency bounds the engine's write
	// rate (docs/operations.md, "What to watch").
	// CommitSyncWait is the part of CommitTime that Pebble waited for the
	// WAL fsync; the rest is its WAL write and memtable insert.
	CommitGroups, CommitWrites int64
	CommitTime, CommitSyncWait time.Duration

	// The records that need settling, as the pending index holds them
	// (docs/design.md, "Settling uncertain outcomes"): UncertainRecords
	// counts the uncertain records awaiting reconciliation,
	// EscalatedRecords those given up on and left for an operator, and
	// RemoteRecords the remote records in progress on disk, live or
	// abandoned. OldestUnsettled is the age of the oldest record awaiting
	// reconciliation (uncertain, or remote and past its lease), by its
	// creation; 0 if there is none. Reading it seeks into the index.
	UncertainRecords, EscalatedRecords, RemoteRecords int64
	OldestUnsettled                                   time.Duration

	// Sweep is the sweeper's totals: passes, records examined and deleted,
	// the last pass and the one running. Sweep.HeldPastExpiry() is how many
	// records past their expiry the sweeper had to keep, because their
	// outcome is not settled or a holder is at work on them.
	Sweep ttl.Stats

	// BackgroundErrors counts Pebble's failed flushes and compactions since
	// Open; UnhealthySince is when the current run of them began, zero
	// while the store is healthy (Health).
	BackgroundErrors int64
	UnhealthySince   time.Time

	// DiskRefusals counts the claims the disk guard refused with
	// idemkv.ErrNoSpace since Open: free space was below
	// Options.MinFreeDisk (disk.go).
	DiskRefusals int64

	// WriteStalls counts the times since Open that Pebble stopped writes
	// until a flush or compaction caught up: memtables queued faster than
	// they flushed, or level 0 reached three times
	// Options.L0CompactionThreshold sublevels. WriteStallTime is the time
	// writes spent stopped, the stall in progress included (stall.go).
	WriteStalls    int64
	WriteStallTime time.Duration

	// ClockSteps counts the steps of Options.Clock beyond ClockTolerance
	// seen since Open, and ClockOffset is how far the clock is from engine
	// time now (positive: ahead), zero while the engine follows it
	// (clock.go).
	ClockSteps  int64
	ClockOffset time.Duration

	// Pebble.
	DiskBytes uint64 // all files of the store: sstables, WAL, manifest
	// LiveBytes is the live sstables and WAL: DiskBytes without files
	// awaiting deletion, recycled WAL files, sstables kept only for open
	// iterators and the output of compactions in progress.
	LiveBytes      uint64
	ReadAmp        int // sublevels a read may visit
	L0Files        int64
	CompactionDebt uint64 // bytes compaction must still rewrite
	Flushes        int64
	Compactions    int64
	// CompactionsRunning is how many compactions are in progress now
	// (Compactions counts them when they end).
	CompactionsRunning int64
	WALBytesIn         uint64 // logical bytes written to the WAL
	WALBytesWritten    uint64 // physical bytes, including padding
	BlockCacheHits     int64
	BlockCacheMisses   int64
	FilterHits         int64 // lookups a bloom filter answered "absent"
	MemTableBytes      uint64
	// TableBytes is the size of all live sstables; WriteAmp is the bytes
	// Pebble wrote to sstables (flushes and compactions) per byte that
	// entered through flushes, since Open (Pebble counts from its own
	// Open; the two byte counts below likewise).
	TableBytes        uint64
	TableBytesFlush   uint64 // bytes written by flushes since Open
	TableBytesWritten uint64 // bytes written by flushes and compactions since Open
	WriteAmp          float64
}

// Counts implements idemkv.DataStore: Stats' operation counts, read
// without the store's other figures.
func (e *Engine) Counts() idemkv.Counts {
	c := &e.counters
	return idemkv.Counts{Claims: c.claims.Load(), Acquired: c.acquired.Load(), Replays: c.replays.Load(),
		Mismatches: c.mismatches.Load(), InProgress: c.inProgress.Load(),
		Completed: c.completed.Load(), Conflicts: c.conflicts.Load(), Fenced: c.fenced.Load()}
}

// Stats returns a snapshot of the engine's counters and Pebble metrics.
func (e *Engine) Stats() (Stats, error) {
	if err := e.gate.enter(); err != nil {
		return Stats{}, err
	}
	defer e.gate.exit()
	var st Stats
	e.table.eachSlot(func(s *slot) {
		switch {
		case s.busy:
			st.Busy++
		case s.rec.Mode == idemkv.ModeRemote:
			st.HeldRemote++
		default:
			st.HeldLocal++
		}
	})
	st.ReplayCached = e.table.replay.len()
	st.Counts = e.Counts()
	c := &e.counters
	st.Takeovers = c.takeovers.Load()
	st.Reconciling, st.Released = c.reconciling.Load(), c.released.Load()
	st.Uncertain, st.Renewed, st.Resolved = c.uncertain.Load(), c.renewed.Load(), c.resolved.Load()
	st.ReplayCacheHits = c.cacheHits.Load()
	st.Escalations = c.escalated.Load()
	st.UncertainRecords, st.EscalatedRecords = e.pending.uncertain.Load(), e.pending.escalated.Load()
	st.RemoteRecords = e.pending.remote.Load()
	oldest, err := e.oldestAwaiting(e.clock.Now())
	if err != nil {
		return Stats{}, fmt.Errorf("engine: stats: %w", err)
	}
	st.OldestUnsettled = oldest
	f := &e.filter
	st.ClaimFilterSkips, st.ClaimFilterMisses = f.skips.Load(), f.misses.Load()
	st.ClaimFilterKeys, st.ClaimFilterStored, st.ClaimFilterBuilds = f.capacity.Load(), f.stored.Load(), f.builds.Load()
	st.ClaimFilterFailures = f.failures.Load()
	st.ClaimFilterSaved = f.loaded.Load()
	st.Sweep = e.sweeper.s.Stats()
	st.BackgroundErrors, st.UnhealthySince = e.health.counts()
	st.ClockSteps, st.ClockOffset = e.clock.steps.Load(), e.clock.offset()
	st.DiskRefusals = c.diskRefusals.Load()
	st.WriteStalls, st.WriteStallTime = e.stalls.counts()
	cm := e.commits
	st.CommitGroups, st.CommitWrites = cm.groups.Load(), cm.writes.Load()
	st.CommitTime, st.CommitSyncWait = time.Duration(cm.busy.Load()), time.Duration(cm.syncWait.Load())

	m := e.db.Metrics()
	st.DiskBytes = m.DiskSpaceUsage()
	st.LiveBytes = m.WAL.PhysicalSize + m.Table.Local.LiveSize + m.BlobFiles.Local.LiveSize
	st.ReadAmp = m.ReadAmp()
	st.L0Files = m.Levels[0].TablesCount
	st.CompactionDebt = m.Compact.EstimatedDebt
	st.Flushes = m.Flush.Count
	st.Compactions = m.Compact.Count
	st.CompactionsRunning = m.Compact.NumInProgress
	st.WALBytesIn = m.WAL.BytesIn
	st.WALBytesWritten = m.WAL.BytesWritten
	st.BlockCacheHits = m.BlockCache.Hits
	st.BlockCacheMisses = m.BlockCache.Misses
	st.FilterHits = m.Filter.Hits
	st.MemTableBytes = m.MemTable.Size
	total := m.Total()
	st.TableBytes = uint64(total.TablesSize)
	st.TableBytesFlush = total.TableBytesFlushed
	st.TableBytesWritten = total.TableBytesFlushed + total.TableBytesCompacted
	st.WriteAmp = total.WriteAmp()
	return st, nil
}

// Flush writes the memtable out to an sstable. Stores flush on their own;
// this is for measurements and maintenance.
func (e *Engine) Flush() error {
	if err := e.gate.enter(); err != nil {
		return err
	}
	defer e.gate.exit()
	return e.db.Flush()
}

// Compact compacts the whole key space down to the bottom level. It can
// take long on a large store and competes with requests for I/O; it is for
// measurements and maintenance, never needed for correctness.
func (e *Engine) Compact(ctx context.Context) error {
	if err := e.gate.enter(); err != nil {
		return err
	}
	defer e.gate.exit()
	return e.db.Compact(ctx, []byte{0}, []byte{0xff}, true)
}

// Census counts the stored records by state. Unlike Stats it scans every
// record, so it costs time in proportion to the store's size: use it for
// inspection and tests, not on a request path.
type Census struct {
	InProgress int // durable in-progress (remote) records plus local leases held in memory
	Uncertain  int
	Completed  int // completed and within retention
	Expired    int // completed, past retention, not yet removed
}

// Census scans the store and counts records by state.
func (e *Engine) Census(ctx context.Context) (Census, error) {
	if err := e.gate.enter(); err != nil {
		return Census{}, err
	}
	defer e.gate.exit()
	now := e.clock.Now()
	var c Census
	// Local leases live only in memory.
	e.table.eachSlot(func(s *slot) {
		if !s.durable && !s.busy {
			c.InProgress++
		}
	})
	for _, span := range [][2][]byte{{recordStart, recordEnd}, {expiryStart, expiryEnd}} {
		if err := e.censusSpan(ctx, &c, span[0], span[1], now); err != nil {
			return Census{}, err
		}
	}
	return c, nil
}

// censusSpan counts the records in [lower, upper) into c.
func (e *Engine) censusSpan(ctx context.Context, c *Census, lower, upper []byte, now time.Time) error {
	it, err := e.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return err
	}
	defer it.Close()
	n := 0
	for valid := it.First(); valid; valid = it.Next() {
		if n++; n%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return err
		}
		rec, err := record.Decode(v)
		if err != nil {
			return fmt.Errorf("engine: census: record %x: %w", it.Key(), err)
		}
		switch rec.State {
		case idemkv.StateInProgress:
			c.InProgress++
		case idemkv.StateUncertain:
			c.Uncertain++
		case idemkv.StateCompleted:
			if now.Before(rec.Expires) {
				c.Completed++
			} else {
				c.Expired++
			}
		}
	}
	return it.Error()
}
