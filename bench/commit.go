package bench

import (
	"fmt"
	"time"

	"github.com/idemkv/idemkv/engine"
)

// CommitFigures is the engine committer's work over a measurement
// (engine.Stats' commit counters), for stores that combine writes: zero
// for the baseline and the bare handler, whose commits are Pebble's own.
type CommitFigures struct {
	// Commits is the number of commits the committer made
	// (engine.Stats.CommitGroups).
	Commits int64 `json:"commits"`
	// WritesPerCommit is the writes those commits carried, per commit: how
	// many requests shared one batch and one fsync.
	WritesPerCommit float64 `json:"writes_per_commit"`
	// CommitMeanUS is the mean duration of one commit, from its turn to
	// its end, in µs.
	CommitMeanUS float64 `json:"commit_mean_us"`
	// CommitBusy is the share of the measured time a commit was running.
	// Commits run one at a time, so near 1 the commit path is the
	// bottleneck: requests queue for it and the fsync latency bounds
	// throughput.
	CommitBusy float64 `json:"commit_busy"`
	// CommitSyncWaitShare is the share of commit time Pebble waited for the
	// WAL fsync (engine.Stats.CommitSyncWait); the rest is its WAL write
	// and memtable insert.
	CommitSyncWaitShare float64 `json:"commit_sync_wait_share"`
}

// CommitDelta accumulates the growth of the engine's commit counters over
// one or more measured intervals.
type CommitDelta struct {
	groups, writes int64
	busy, wait     time.Duration
	elapsed        time.Duration
}

// Add adds the growth from s0 to s1, read elapsed apart.
func (d *CommitDelta) Add(s0, s1 engine.Stats, elapsed time.Duration) {
	d.groups += s1.CommitGroups - s0.CommitGroups
	d.writes += s1.CommitWrites - s0.CommitWrites
	d.busy += s1.CommitTime - s0.CommitTime
	d.wait += s1.CommitSyncWait - s0.CommitSyncWait
	d.elapsed += elapsed
}

// Figures returns the figures of the intervals added.
func (d *CommitDelta) Figures() CommitFigures {
	if d.groups <= 0 || d.elapsed <= 0 {
		return CommitFigures{}
	}
	f := CommitFigures{
		Commits:         d.groups,
		WritesPerCommit: float64(d.writes) / float64(d.groups),
		CommitMeanUS:    float64(d.busy.Microseconds()) / float64(d.groups),
		CommitBusy:      d.busy.Seconds() / d.elapsed.Seconds(),
	}
	if d.busy > 0 {
		f.CommitSyncWaitShare = d.wait.Seconds() / d.busy.Seconds()
	}
	return f
}

// String describes the figures for a report's table, or returns "" if
// there are none.
func (f CommitFigures) String() string {
	if f.Commits == 0 {
		return ""
	}
	return fmt.Sprintf("commit path busy %.0f%%, %.1f writes a commit, %s each, %.0f%% of it waiting for the fsync",
		100*f.CommitBusy, f.WritesPerCommit, Micros(f.CommitMeanUS), 100*f.CommitSyncWaitShare)
}
