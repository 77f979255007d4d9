package payments

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkv/idemkv/engine"
)

// engineCollector exports a few of engine.Stats at scrape time.
type engineCollector struct {
	e     *engine.Engine
	descs map[string]*prometheus.Desc
}

var engineMetrics = []struct {
	name, help string
	counter    bool
	value      func(engine.Stats) float64
}{
	{"idemkv_engine_claims_total", "Claims that passed validation.", true, func(s engine.Stats) float64 { return float64(s.Claims) }},
	{"idemkv_engine_takeovers_total", "Acquisitions that took over an expired lease.", true, func(s engine.Stats) float64 { return float64(s.Takeovers) }},
	{"idemkv_engine_fenced_total", "Operations refused because their lease was no longer current.", true, func(s engine.Stats) float64 { return float64(s.Fenced) }},
	{"idemkv_engine_held_leases", "Leases held in this process.", false, func(s engine.Stats) float64 { return float64(s.HeldLocal + s.HeldRemote) }},
	{"idemkv_engine_swept_total", "Expired records deleted by the sweeper.", true, func(s engine.Stats) float64 { return float64(s.Sweep.Deleted) }},
	{"idemkv_engine_held_past_expiry", "Records past their expiry the sweeper had to keep (unsettled or held).", false, func(s engine.Stats) float64 { return float64(s.Sweep.HeldPastExpiry()) }},
	{"idemkv_engine_claim_filter_skips_total", "Lookups the claim filter answered absent without reading the store.", true, func(s engine.Stats) float64 { return float64(s.ClaimFilterSkips) }},
	{"idemkv_engine_claim_filter_misses_total", "Lookups the claim filter let through that found no record.", true, func(s engine.Stats) float64 { return float64(s.ClaimFilterMisses) }},
	{"idemkv_engine_claim_filter_keys", "Records the claim filter in use is sized for (0 until its first build after start).", false, func(s engine.Stats) float64 { return float64(s.ClaimFilterKeys) }},
	{"idemkv_engine_commits_total", "Commits of combined synced writes (one batch, one fsync each).", true, func(s engine.Stats) float64 { return float64(s.CommitGroups) }},
	{"idemkv_engine_commit_writes_total", "Synced writes carried by those commits.", true, func(s engine.Stats) float64 { return float64(s.CommitWrites) }},
	{"idemkv_engine_commit_seconds_total", "Time spent committing; its rate is how busy the commit path is (near 1: saturated).", true, func(s engine.Stats) float64 { return s.CommitTime.Seconds() }},
	{"idemkv_engine_commit_sync_wait_seconds_total", "The part of the commit time spent waiting for the WAL fsync.", true, func(s engine.Stats) float64 { return s.CommitSyncWait.Seconds() }},
	{"idemkv_engine_disk_bytes", "Bytes of every file of the store.", false, func(s engine.Stats) float64 { return float64(s.DiskBytes) }},
	{"idemkv_engine_read_amp", "Sublevels a read may visit.", false, func(s engine.Stats) float64 { return float64(s.ReadAmp) }},
	{"idemkv_engine_l0_files", "Files in level 0; growing without bound means compactions are behind the writes.", false, func(s engine.Stats) float64 { return float64(s.L0Files) }},
	{"idemkv_engine_compaction_debt_bytes", "Bytes compactions must still rewrite; growing without bound means compactions are behind the writes.", false, func(s engine.Stats) float64 { return float64(s.CompactionDebt) }},
	{"idemkv_engine_low_priority_tables_total", "Sstables compactions wrote at the lowered priority of --background-nice.", true, func(s engine.Stats) float64 { return float64(s.LowPriorityTables) }},
}

func newEngineCollector(e *engine.Engine) *engineCollector {
	c := &engineCollector{e: e, descs: make(map[string]*prometheus.Desc)}
	for _, m := range engineMetrics {
		c.descs[m.name] = prometheus.NewDesc(m.name, m.help, nil, nil)
	}
	return c
}

func (c *engineCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *engineCollector) Collect(ch chan<- prometheus.Metric) {
	s, err := c.e.Stats()
	if err != nil {
		return // a closed store exports nothing
	}
	for _, m := range engineMetrics {
		t := prometheus.GaugeValue
		if m.counter {
			t = prometheus.CounterValue
		}
		ch <- prometheus.MustNewConstMetric(c.descs[m.name], t, m.value(s))
	}
}
