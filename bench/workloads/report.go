package workloads

import (
	"fmt"
	"io"
	"strings"

	"github.com/idemkv/idemkv/bench"
)

// Report is the result of a run. Its JSON form (WriteJSON) has stable
// snake_case field names; durations are in µs (_us) or seconds (_seconds),
// sizes in bytes.
type Report struct {
	Meta        Meta         `json:"meta"`        // the run, the machine and the options
	Fsync       FsyncTiming  `json:"fsync"`       // the disk's cost of one durable write, measured in the run
	Points      []Point      `json:"points"`      // one per workload, concurrency and target
	Comparisons []Comparison `json:"comparisons"` // the first target against the second, at each point
	Sizing      Sizing       `json:"sizing"`      // the guide's sizing table redone with measured numbers
	// Scale has the unique workload over stores of Options.ScaleKeys live
	// keys, when asked for.
	Scale []ScalePoint `json:"scale,omitempty"`
}

// Meta describes the run: the harness's fields and the options.
type Meta struct {
	bench.Meta
	Options RunOptions `json:"options"` // the configuration the run used, defaults applied
}

// RunOptions is the configuration a run used, defaults applied (Options).
type RunOptions struct {
	Workloads       []string      `json:"workloads"`         // the workloads run, in order
	Concurrency     []int         `json:"concurrency"`       // the sweep: concurrent clients at each point
	DurationSeconds float64       `json:"duration_seconds"`  // how long each point ran, in seconds
	RetryFraction   float64       `json:"retry_fraction"`    // the share of retry requests that re-send a key
	HotDuplicates   int           `json:"hot_duplicates"`    // the number of requests per hot key
	PreloadKeys     int           `json:"preload_keys"`      // the number of keys preloaded for replay and mismatch
	RemoteLatencyUS float64       `json:"remote_latency_us"` // the simulated downstream call of remote, in µs
	Tenants         int           `json:"tenants"`           // the number of tenants keys are spread over
	SizingKeys      int           `json:"sizing_keys"`       // the number of records of the sizing run
	BodyKeys        int           `json:"body_keys"`         // the number of records of the sizing run with bodies
	BodyBytes       int           `json:"body_bytes"`        // the size of their bodies, in bytes
	VerifyKeys      int           `json:"verify_keys"`       // the number of keys re-checked per point (-1: all)
	FsyncSamples    int           `json:"fsync_samples"`     // the number of appends the fsync probe timed
	Engine          EngineOptions `json:"engine"`            // the store options both targets were opened with
}

// EngineOptions are the store options both targets were opened with
// (engine.Options, defaults applied).
type EngineOptions struct {
	CacheBytes            int64  `json:"cache_bytes"`            // the block cache, in bytes
	MemTableBytes         uint64 `json:"memtable_bytes"`         // the size of one memtable, in bytes
	BloomBitsPerKey       int    `json:"bloom_bits_per_key"`     // the bits per key of the sstables' bloom filters
	Compression           string `json:"compression"`            // the name of the sstable compression profile
	CompactionConcurrency int    `json:"compaction_concurrency"` // the most compactions Pebble runs at once
	Shards                int    `json:"shards"`                 // the number of lock stripes
	// ClaimFilterBitsPerKey sizes the engine's claim filter (0 or
	// negative: off).
	ClaimFilterBitsPerKey int `json:"claim_filter_bits_per_key"`
	// CompactionNice is the nice value of compactions (package
	// engine/lowprio; --background-nice), 0 for none, on both targets.
	CompactionNice        int     `json:"compaction_nice"`
	L0CompactionThreshold int     `json:"l0_compaction_threshold"` // the engine's L0CompactionThreshold
	LeaseSeconds          float64 `json:"lease_seconds"`           // the default lease, in seconds
	RetentionSeconds      float64 `json:"retention_seconds"`       // the default retention, in seconds
}

// describe returns the options as the report states them.
func (o *Options) describe() RunOptions {
	e := o.Engine
	comp := "custom"
	if e.Compression != nil {
		comp = e.Compression.Name
	}
	return RunOptions{
		Workloads: o.Workloads, Concurrency: o.Concurrency, DurationSeconds: o.Duration.Seconds(),
		RetryFraction: o.RetryFraction, HotDuplicates: o.HotDuplicates, PreloadKeys: o.PreloadKeys,
		RemoteLatencyUS: float64(o.RemoteLatency) / 1e3, Tenants: o.Tenants, SizingKeys: o.SizingKeys,
		BodyKeys: o.BodyKeys, BodyBytes: o.BodyBytes, VerifyKeys: o.VerifyKeys, FsyncSamples: o.FsyncSamples,
		Engine: EngineOptions{
			CacheBytes: e.CacheSize, MemTableBytes: e.MemTableSize, BloomBitsPerKey: e.BloomBitsPerKey,
			Compression: comp, CompactionConcurrency: e.CompactionConcurrency, Shards: e.Shards,
			ClaimFilterBitsPerKey: e.ClaimFilterBitsPerKey, CompactionNice: o.CompactionNice,
			L0CompactionThreshold: e.L0CompactionThreshold, LeaseSeconds: e.Lease.Seconds(),
			RetentionSeconds: e.Retention.Seconds(),
		},
	}
}

// Point is the measurement of one workload at one concurrency on one
// target.
type Point struct {
	Workload    string `json:"workload"`    // the workload's name
	Concurrency int    `json:"concurrency"` // the number of concurrent clients
	Target      string `json:"target"`      // the target's name: engine, baseline or pgstore
	// External: the target works in another process, and the fsync,
	// batch, CPU and write-amplification figures are not its (zero).
	External bool `json:"external,omitempty"`
	// DurationSeconds is the measured time, from the start signal until the
	// last client finished its last request, in seconds.
	DurationSeconds float64       `json:"duration_seconds"`
	Requests        int64         `json:"requests"`         // the number of requests finished
	RequestsPerSec  float64       `json:"requests_per_sec"` // Requests / DurationSeconds
	Outcomes        Outcomes      `json:"outcomes"`         // the claim answers; they sum to Requests
	Latency         bench.Latency `json:"latency_us"`       // the request latency, in µs

	// Fsyncs is the durable syncs during the point, counted by the
	// filesystem wrapper: Sync, SyncData, and SyncTo when it reports a full
	// sync, on every file (WAL, sstables, manifest, directories).
	Fsyncs              int64   `json:"fsyncs"`
	FsyncsPerRequest    float64 `json:"fsyncs_per_request"`     // Fsyncs / Requests
	WALFsyncsPerRequest float64 `json:"wal_fsyncs_per_request"` // the WAL's share of FsyncsPerRequest
	// SyncedBatches is the Pebble batches committed during the point,
	// counted as records appended to the WAL; both targets commit every
	// batch with pebble.Sync, so these are synced batches.
	SyncedBatches int64 `json:"synced_batches"`
	// SyncedBatchesPerRequest is SyncedBatches / Requests: below 1 when
	// concurrent requests share a batch.
	SyncedBatchesPerRequest float64 `json:"synced_batches_per_request"`
	WALBytesPerRequest      float64 `json:"wal_bytes_per_request"` // the bytes written to the WAL per request
	// CPUSecondsPerRequest is the process's user + system CPU time over the
	// point / Requests, in seconds; it includes the harness and Pebble's
	// background work.
	CPUSecondsPerRequest float64 `json:"cpu_seconds_per_request"`

	// The committer's work over the point (zero for the baseline).
	bench.CommitFigures

	// KeysStored is the records in the store: keys acquired and completed
	// in the point, or the preloaded keys for replay and mismatch.
	KeysStored int64 `json:"keys_stored"`
	// TableBytes is the live sstable bytes after the point, once flushed
	// and compacted.
	TableBytes uint64 `json:"table_bytes"`
	// DiskBytesPerKey is TableBytes / KeysStored, in bytes; for local
	// workloads it includes the effect rows (Sizing measures records
	// alone).
	DiskBytesPerKey float64 `json:"disk_bytes_per_key"`
	// WriteAmp is Pebble's write amplification over the point's store
	// since it was opened: sstable bytes written by flushes and
	// compactions per byte flushed. 0 for replay and mismatch, which write
	// nothing to their seeded store.
	WriteAmp float64 `json:"write_amp"`
	// VerifiedKeys is the acknowledged keys re-claimed after the point and
	// found replaying their stored result (and holding their effect).
	VerifiedKeys int `json:"verified_keys"`
}

// Outcomes counts the claim answers of a point's requests.
type Outcomes struct {
	Acquired   int64 `json:"acquired"`    // claims that acquired their key
	Replay     int64 `json:"replay"`      // claims answered with the stored result
	InProgress int64 `json:"in_progress"` // claims of a key whose first request was running
	Mismatch   int64 `json:"mismatch"`    // claims whose fingerprint differed from the stored one
}

func (o *Outcomes) add(p Outcomes) {
	o.Acquired += p.Acquired
	o.Replay += p.Replay
	o.InProgress += p.InProgress
	o.Mismatch += p.Mismatch
}

// Comparison relates one target to a reference at one point.
type Comparison struct {
	Workload             string  `json:"workload"`                // the workload's name
	Concurrency          int     `json:"concurrency"`             // the number of concurrent clients
	Target               string  `json:"target"`                  // the first target's name (the engine)
	Reference            string  `json:"reference"`               // the second target's name (the baseline)
	TargetRequestsPerSec float64 `json:"target_requests_per_sec"` // the target's throughput, in requests/s
	// ReferenceRequestsPerSec is the reference's throughput, in
	// requests/s.
	ReferenceRequestsPerSec float64 `json:"reference_requests_per_sec"`
	Ratio                   float64 `json:"ratio"`            // TargetRequestsPerSec / ReferenceRequestsPerSec
	TargetP50US             float64 `json:"target_p50_us"`    // the target's median latency, in µs
	ReferenceP50US          float64 `json:"reference_p50_us"` // the reference's median latency, in µs
}

// compare pairs each point of the first target with the second's.
func compare(targets []Target, pts []Point) []Comparison {
	if len(targets) < 2 {
		return nil
	}
	a, b := targets[0].Name, targets[1].Name
	var out []Comparison
	for _, p := range pts {
		if p.Target != a {
			continue
		}
		for _, q := range pts {
			if q.Target == b && q.Workload == p.Workload && q.Concurrency == p.Concurrency {
				c := Comparison{Workload: p.Workload, Concurrency: p.Concurrency, Target: a, Reference: b,
					TargetRequestsPerSec: p.RequestsPerSec, ReferenceRequestsPerSec: q.RequestsPerSec,
					TargetP50US: p.Latency.P50, ReferenceP50US: q.Latency.P50}
				if q.RequestsPerSec > 0 {
					c.Ratio = p.RequestsPerSec / q.RequestsPerSec
				}
				out = append(out, c)
			}
		}
	}
	return out
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error { return bench.WriteJSON(w, r) }

// WriteTable writes the report for people: the run, the fsync time, one
// row per point with the target/reference ratio, read-offs against the
// issue's goals, and the sizing table.
func (r *Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	r.Meta.WriteHeader(&b, "bench")
	if f := r.Fsync; f.Samples > 0 {
		fmt.Fprintf(&b, "fsync on the data disk (%d B write + fdatasync, %d samples): p50 %s (%s before the sweep, %s after), p99 %s, mean %s\n",
			f.WriteBytes, f.Samples, bench.Micros(f.P50US), bench.Micros(f.StartP50US), bench.Micros(f.EndP50US),
			bench.Micros(f.P99US), bench.Micros(f.MeanUS))
	}
	ratios := map[[2]any]float64{}
	first := ""
	for _, c := range r.Comparisons {
		ratios[[2]any{c.Workload, c.Concurrency}] = c.Ratio
		first = c.Target
	}
	fmt.Fprintf(&b, "\n%-8s %5s %-9s %10s %9s %9s %9s %9s %9s %9s %9s %7s %6s %7s\n",
		"workload", "conc", "target", "req/s", "p50", "p99", "p99.9", "max",
		"fsync/req", "batch/req", "cpu/req", "B/key", "w-amp", "ratio")
	prev := ""
	for _, p := range r.Points {
		wl := p.Workload
		if wl == prev {
			wl = ""
		}
		prev = p.Workload
		ratio := ""
		if x, ok := ratios[[2]any{p.Workload, p.Concurrency}]; ok && p.Target == first {
			ratio = fmt.Sprintf("%.2fx", x)
		}
		fsyncs, batches, cpu, wamp := fmt.Sprintf("%.2f", p.FsyncsPerRequest), fmt.Sprintf("%.2f", p.SyncedBatchesPerRequest),
			bench.Micros(p.CPUSecondsPerRequest*1e6), fmt.Sprintf("%.2f", p.WriteAmp)
		if p.External {
			fsyncs, batches, cpu, wamp = "-", "-", "-", "-"
		}
		fmt.Fprintf(&b, "%-8s %5d %-9s %10s %9s %9s %9s %9s %9s %9s %9s %7.1f %6s %7s\n",
			wl, p.Concurrency, p.Target, bench.Count(p.RequestsPerSec),
			bench.Micros(p.Latency.P50), bench.Micros(p.Latency.P99), bench.Micros(p.Latency.P999), bench.Micros(p.Latency.Max),
			fsyncs, batches, cpu, p.DiskBytesPerKey, wamp, ratio)
	}
	r.writeReadOffs(&b)
	r.Sizing.write(&b)
	r.writeScale(&b)
	_, err := io.WriteString(w, b.String())
	return err
}

// writeReadOffs writes the figures the engine's performance goals are
// stated in, each beside its goal.
func (r *Report) writeReadOffs(w io.Writer) {
	var lines []string
	for _, c := range r.Comparisons {
		if c.Workload == unique && c.Concurrency == 1 && r.Fsync.P50US > 0 {
			lines = append(lines, fmt.Sprintf("unique, concurrency 1: %s p50 %s = %.2f x one fsync (goal <= 1.3)",
				c.Target, bench.Micros(c.TargetP50US), c.TargetP50US/r.Fsync.P50US))
		}
	}
	for _, c := range r.Comparisons {
		if (c.Workload == unique || c.Workload == remote) && (c.Concurrency == 64 || c.Concurrency == 256) {
			goal := "3"
			if c.Workload == remote {
				goal = "1.5"
			}
			l := fmt.Sprintf("%s, concurrency %d: %s/%s = %.2f x (goal >= %s)",
				c.Workload, c.Concurrency, c.Target, c.Reference, c.Ratio, goal)
			if p := r.point(c.Workload, c.Concurrency, c.Target); p != nil && p.Commits > 0 {
				l += "; " + p.CommitFigures.String()
			}
			lines = append(lines, l)
		}
		if c.Workload == replay && c.Concurrency == 64 {
			lines = append(lines, fmt.Sprintf("replay, concurrency 64: %s %s req/s (goal >= 300,000)", c.Target, bench.Count(c.TargetRequestsPerSec)))
		}
	}
	if len(r.Sizing.Targets) > 0 && r.Sizing.Targets[0].Keys > 0 {
		t := r.Sizing.Targets[0]
		lines = append(lines, fmt.Sprintf("bytes on disk per completed key: %s %.1f B (goal <= 100)", t.Target, t.BytesPerKey))
	}
	if len(lines) == 0 {
		return
	}
	fmt.Fprintf(w, "\nRead-offs against the performance goals:\n")
	for _, l := range lines {
		fmt.Fprintf(w, "  %s\n", l)
	}
}

// point returns the point of target at workload and concurrency, if any.
func (r *Report) point(workload string, concurrency int, target string) *Point {
	for i := range r.Points {
		if p := &r.Points[i]; p.Workload == workload && p.Concurrency == concurrency && p.Target == target {
			return p
		}
	}
	return nil
}
