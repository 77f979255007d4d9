package engineprom

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkv/idemkv/engine"
)

// ErrNoRegistry is returned by Register when it is given no registry: the
// collector never falls back to prometheus.DefaultRegisterer.
var ErrNoRegistry = errors.New("engineprom: no registry given")

// A metric is one family the collector exports, read from one Stats
// snapshot. Counters count since the engine's Open and restart from zero
// with the process, which Prometheus's rate() and increase() expect.
type metric struct {
	name, help string
	counter    bool
	value      func(engine.Stats) float64
}

// metrics are the families exported, in the order Describe lists them.
// Their names are stable: dashboards, alerts and tests read them.
var metrics = []metric{
	// Every Claim that passed validation (Stats.Claims): new requests,
	// replays, duplicates and mismatches alike; the engine's request rate.
	{"idemkv_engine_claims_total", "Claims that passed validation.", true,
		func(s engine.Stats) float64 { return float64(s.Claims) }},
	// Acquisitions of a key whose holder's lease had run out
	// (Stats.Takeovers). Steady growth means handlers slower than their
	// lease, or holders that crash.
	{"idemkv_engine_takeovers_total", "Acquisitions that took over an expired lease.", true,
		func(s engine.Stats) float64 { return float64(s.Takeovers) }},
	// Completions and other writes refused with idemkv.ErrFenced
	// (Stats.Fenced): a holder that outlived its lease and lost the key to
	// a takeover. Each one is a second attempt the store stopped.
	{"idemkv_engine_fenced_total", "Operations refused because their lease was no longer current.", true,
		func(s engine.Stats) float64 { return float64(s.Fenced) }},
	// Leases held in this process now, local and remote: requests whose
	// handler is running.
	{"idemkv_engine_held_leases", "Leases held in this process.", false,
		func(s engine.Stats) float64 { return float64(s.HeldLocal + s.HeldRemote) }},
	// Expired records the sweeper deleted (Stats.Sweep.Deleted).
	{"idemkv_engine_swept_total", "Expired records deleted by the sweeper.", true,
		func(s engine.Stats) float64 { return float64(s.Sweep.Deleted) }},
	// Sweeper passes that failed (Stats.Sweep.Failures). The sweeper
	// retries with backoff; a count that keeps rising means it is not
	// deleting, and the store grows (Stats.Sweep.LastError says why).
	{"idemkv_engine_sweep_failures_total", "Sweeper passes that ended with an error.", true,
		func(s engine.Stats) float64 { return float64(s.Sweep.Failures) }},
	// 1 while the sweeper's latest pass failed, 0 once one succeeds
	// (Stats.Sweep.FailingSince).
	{"idemkv_engine_sweep_failing", "1 while the sweeper's latest pass failed.", false,
		func(s engine.Stats) float64 { return b2f(!s.Sweep.FailingSince.IsZero()) }},
	// Pebble's failed flushes and compactions (Stats.BackgroundErrors):
	// out of disk space or file descriptors, or an I/O error.
	{"idemkv_engine_background_errors_total", "Failed Pebble flushes and compactions.", true,
		func(s engine.Stats) float64 { return float64(s.BackgroundErrors) }},
	// 1 while the latest of them failed and new claims are refused
	// (Engine.Health, Stats.UnhealthySince).
	{"idemkv_engine_unhealthy", "1 while Pebble's latest flush or compaction failed and new claims are refused.", false,
		func(s engine.Stats) float64 { return b2f(!s.UnhealthySince.IsZero()) }},
	// Claims the disk guard refused with idemkv.ErrNoSpace
	// (Stats.DiskRefusals): free space below Options.MinFreeDisk. New work
	// is refused while replays and work in progress go on.
	{"idemkv_engine_disk_refusals_total", "Claims refused because free disk space was below the engine's minimum.", true,
		func(s engine.Stats) float64 { return float64(s.DiskRefusals) }},
	// Times Pebble stopped writes until a flush or compaction caught up
	// (Stats.WriteStalls), and the time writes spent stopped, the stall
	// in progress included (Stats.WriteStallTime): every synced write
	// waits meanwhile, so the seconds' rate is the share of time the
	// store took no writes.
	{"idemkv_engine_write_stalls_total", "Times Pebble stopped writes until flushes or compactions caught up.", true,
		func(s engine.Stats) float64 { return float64(s.WriteStalls) }},
	{"idemkv_engine_write_stall_seconds_total", "Time writes spent stopped by Pebble, the stall in progress included.", true,
		func(s engine.Stats) float64 { return s.WriteStallTime.Seconds() }},
	// Steps of the wall clock beyond Options.ClockTolerance
	// (Stats.ClockSteps), and how far it is from engine time now: while
	// the offset is not zero, engine time runs on elapsed time alone.
	{"idemkv_engine_clock_steps_total", "Steps of the wall clock beyond the engine's clock tolerance.", true,
		func(s engine.Stats) float64 { return float64(s.ClockSteps) }},
	{"idemkv_engine_clock_offset_seconds", "How far the wall clock is from engine time (positive: ahead); 0 while the engine follows it.", false,
		func(s engine.Stats) float64 { return s.ClockOffset.Seconds() }},
	// Records past their expiry that the last sweep had to keep because
	// they are uncertain, in progress or held (Stats.Sweep.HeldPastExpiry).
	// A number that only grows is work nobody settles: uncertain payments
	// waiting for a reconciler, say.
	{"idemkv_engine_held_past_expiry", "Records past their expiry the sweeper had to keep (unsettled or held).", false,
		func(s engine.Stats) float64 { return float64(s.Sweep.HeldPastExpiry()) }},
	// Records awaiting reconciliation (Stats.UncertainRecords) and the age
	// of the oldest of them, abandoned remote records included
	// (Stats.OldestUnsettled): alert on the age, which grows while nothing
	// settles them.
	{"idemkv_engine_uncertain_records", "Uncertain records awaiting reconciliation.", false,
		func(s engine.Stats) float64 { return float64(s.UncertainRecords) }},
	{"idemkv_engine_oldest_unsettled_seconds", "Age of the oldest record awaiting reconciliation (uncertain, or remote past its lease); 0 if none.", false,
		func(s engine.Stats) float64 { return s.OldestUnsettled.Seconds() }},
	// Records reconciliation gave up on, left for an operator
	// (Stats.EscalatedRecords), and escalations since start
	// (Stats.Escalations). Each one needs a person: idemkv resolve.
	{"idemkv_engine_escalated_records", "Escalated records waiting for an operator.", false,
		func(s engine.Stats) float64 { return float64(s.EscalatedRecords) }},
	{"idemkv_engine_escalations_total", "Records escalated to an operator.", true,
		func(s engine.Stats) float64 { return float64(s.Escalations) }},
	// Claims of keys the in-memory claim filter answered absent without a
	// Pebble read (Stats.ClaimFilterSkips).
	{"idemkv_engine_claim_filter_skips_total", "Lookups the claim filter answered absent without reading the store.", true,
		func(s engine.Stats) float64 { return float64(s.ClaimFilterSkips) }},
	// Claims the filter let through that found no record: its false
	// positives, and keys deleted since its build (Stats.ClaimFilterMisses).
	{"idemkv_engine_claim_filter_misses_total", "Lookups the claim filter let through that found no record.", true,
		func(s engine.Stats) float64 { return float64(s.ClaimFilterMisses) }},
	// Builds of the filter that failed, each retried with backoff
	// (Stats.ClaimFilterFailures); until one succeeds, claims read Pebble.
	{"idemkv_engine_claim_filter_failures_total", "Claim filter builds that failed (retried with backoff).", true,
		func(s engine.Stats) float64 { return float64(s.ClaimFilterFailures) }},
	// The record count the filter in use is sized for; 0 until the first
	// build after Open ends, during which every claim reads Pebble.
	{"idemkv_engine_claim_filter_keys", "Records the claim filter in use is sized for (0 until its first build after start).", false,
		func(s engine.Stats) float64 { return float64(s.ClaimFilterKeys) }},
	// Commits of the committer, each one Pebble batch and one WAL fsync
	// carrying one or more synced writes (Stats.CommitGroups).
	{"idemkv_engine_commits_total", "Commits of combined synced writes (one batch, one fsync each).", true,
		func(s engine.Stats) float64 { return float64(s.CommitGroups) }},
	// Synced writes those commits carried (Stats.CommitWrites); divided by
	// commits_total, how many writes share an fsync.
	{"idemkv_engine_commit_writes_total", "Synced writes carried by those commits.", true,
		func(s engine.Stats) float64 { return float64(s.CommitWrites) }},
	// Time spent committing (Stats.CommitTime). Commits run one at a time,
	// so its rate is the commit path's utilization: near 1, synced writes
	// queue and the disk's fsync latency bounds the write rate.
	{"idemkv_engine_commit_seconds_total", "Time spent committing; its rate is how busy the commit path is (near 1: saturated).", true,
		func(s engine.Stats) float64 { return s.CommitTime.Seconds() }},
	// The part of the commit time spent waiting for the WAL fsync
	// (Stats.CommitSyncWait); the rest is the WAL write and memtable insert.
	{"idemkv_engine_commit_sync_wait_seconds_total", "The part of the commit time spent waiting for the WAL fsync.", true,
		func(s engine.Stats) float64 { return s.CommitSyncWait.Seconds() }},
	// Every file of the store: sstables, WAL, manifest (Stats.DiskBytes).
	{"idemkv_engine_disk_bytes", "Bytes of every file of the store.", false,
		func(s engine.Stats) float64 { return float64(s.DiskBytes) }},
	// Sublevels a read may visit (Stats.ReadAmp).
	{"idemkv_engine_read_amp", "Sublevels a read may visit.", false,
		func(s engine.Stats) float64 { return float64(s.ReadAmp) }},
	// Files in Pebble's level 0 (Stats.L0Files). Growing without bound:
	// compactions are behind the writes, and Pebble will stall them.
	{"idemkv_engine_l0_files", "Files in level 0; growing without bound means compactions are behind the writes.", false,
		func(s engine.Stats) float64 { return float64(s.L0Files) }},
	// Bytes compactions must still rewrite (Stats.CompactionDebt); read
	// with l0_files.
	{"idemkv_engine_compaction_debt_bytes", "Bytes compactions must still rewrite; growing without bound means compactions are behind the writes.", false,
		func(s engine.Stats) float64 { return float64(s.CompactionDebt) }},
}

// collector exports metrics from one engine's Stats at scrape time.
type collector struct {
	e     *engine.Engine
	descs []*prometheus.Desc // descs[i] describes metrics[i]
}

// NewCollector returns a collector that reads e.Stats at every scrape
// and exports the families listed in this package's documentation. It
// holds e but does not own it: closing e is the caller's job, and a
// closed engine exports nothing.
func NewCollector(e *engine.Engine) prometheus.Collector {
	c := &collector{e: e, descs: make([]*prometheus.Desc, len(metrics))}
	for i, m := range metrics {
		c.descs[i] = prometheus.NewDesc(m.name, m.help, nil, nil)
	}
	return c
}

// Register registers NewCollector(e) on reg, and only on reg. It returns
// ErrNoRegistry if reg is nil, and reg's own error otherwise: a
// prometheus.AlreadyRegisteredError if reg already exports these families
// (from this engine or another).
func Register(reg prometheus.Registerer, e *engine.Engine) error {
	if reg == nil {
		return ErrNoRegistry
	}
	return reg.Register(NewCollector(e))
}

// Describe sends the descriptors of every family, so that a registry can
// refuse a second collector of the same names.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

// Collect sends one sample of each family from a single Stats snapshot.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s, err := c.e.Stats()
	if err != nil {
		return // a closed store exports nothing
	}
	for i, m := range metrics {
		t := prometheus.GaugeValue
		if m.counter {
			t = prometheus.CounterValue
		}
		ch <- prometheus.MustNewConstMetric(c.descs[i], t, m.value(s))
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
