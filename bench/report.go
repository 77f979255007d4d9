package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/idemkv/idemkv/engine"
)

// The guide's sizing estimate the report is set against: 5,000 unsafe
// requests/s, 200 B per key (2,000 B with full responses), two extra
// durable writes per request (10,000/s).
const (
	guideRate                = 5000.0
	guideBytesPerKey         = 200.0
	guideBytesPerKeyWithBody = 2000.0
	guideWritesPerRequest    = 2.0
)

// Report is the result of a run. Its JSON form (WriteJSON) has stable
// snake_case field names, documented in docs/benchmarks.md.
type Report struct {
	Meta  Meta        `json:"meta"`
	Fsync FsyncTiming `json:"fsync"`
	// Points has one entry per workload, concurrency and target.
	Points []Point `json:"points"`
	// Comparisons relate the first target to the second at each point.
	Comparisons []Comparison `json:"comparisons"`
	Sizing      Sizing       `json:"sizing"`
	// Scale has the unique workload over stores of Config.ScaleKeys live
	// keys, when asked for.
	Scale []ScalePoint `json:"scale,omitempty"`
}

// Meta describes the run and the machine.
type Meta struct {
	Date        string     `json:"date"` // start, RFC 3339, UTC
	GoVersion   string     `json:"go_version"`
	GOOS        string     `json:"goos"`
	GOARCH      string     `json:"goarch"`
	CPUModel    string     `json:"cpu_model"`
	NumCPU      int        `json:"num_cpu"`
	GOMAXPROCS  int        `json:"gomaxprocs"`
	Profile     string     `json:"profile"`
	Options     RunOptions `json:"options"`
	WallSeconds float64    `json:"wall_seconds"`
}

// RunOptions is the configuration the run used, defaults applied.
type RunOptions struct {
	Workloads       []string      `json:"workloads"`
	Concurrency     []int         `json:"concurrency"`
	DurationSeconds float64       `json:"duration_seconds"`
	RetryFraction   float64       `json:"retry_fraction"`
	HotDuplicates   int           `json:"hot_duplicates"`
	PreloadKeys     int           `json:"preload_keys"`
	RemoteLatencyUS float64       `json:"remote_latency_us"`
	Tenants         int           `json:"tenants"`
	SizingKeys      int           `json:"sizing_keys"`
	BodyKeys        int           `json:"body_keys"`
	BodyBytes       int           `json:"body_bytes"`
	VerifyKeys      int           `json:"verify_keys"`
	FsyncSamples    int           `json:"fsync_samples"`
	Engine          EngineOptions `json:"engine"`
}

// EngineOptions are the store options both targets were opened with.
type EngineOptions struct {
	CacheBytes            int64   `json:"cache_bytes"`
	MemTableBytes         uint64  `json:"memtable_bytes"`
	BloomBitsPerKey       int     `json:"bloom_bits_per_key"`
	Compression           string  `json:"compression"`
	CompactionConcurrency int     `json:"compaction_concurrency"`
	Shards                int     `json:"shards"`
	ClaimFilterBitsPerKey int     `json:"claim_filter_bits_per_key"`
	CompactionNice        int     `json:"compaction_nice"`
	L0CompactionThreshold int     `json:"l0_compaction_threshold"`
	LeaseSeconds          float64 `json:"lease_seconds"`
	RetentionSeconds      float64 `json:"retention_seconds"`
}

// FsyncTiming is the measured cost of one durable write on the data disk.
type FsyncTiming struct {
	Samples    int     `json:"samples"`
	WriteBytes int     `json:"write_bytes"`
	P50US      float64 `json:"p50_us"`
	P99US      float64 `json:"p99_us"`
	MaxUS      float64 `json:"max_us"`
	MeanUS     float64 `json:"mean_us"`
	// StartP50US and EndP50US are the medians of the samples taken before
	// and after the sweep; far apart, the disk changed speed during the run.
	StartP50US float64 `json:"start_p50_us"`
	EndP50US   float64 `json:"end_p50_us"`
}

// Point is the measurement of one workload at one concurrency on one
// target.
type Point struct {
	Workload    string `json:"workload"`
	Concurrency int    `json:"concurrency"`
	Target      string `json:"target"`
	// DurationSeconds is the measured time, from the start signal until the
	// last worker finished its last request.
	DurationSeconds float64  `json:"duration_seconds"`
	Requests        int64    `json:"requests"`
	RequestsPerSec  float64  `json:"requests_per_sec"`
	Outcomes        Outcomes `json:"outcomes"`
	Latency         Latency  `json:"latency_us"`

	Fsyncs                  int64   `json:"fsyncs"`
	FsyncsPerRequest        float64 `json:"fsyncs_per_request"`
	WALFsyncsPerRequest     float64 `json:"wal_fsyncs_per_request"`
	SyncedBatches           int64   `json:"synced_batches"`
	SyncedBatchesPerRequest float64 `json:"synced_batches_per_request"`
	WALBytesPerRequest      float64 `json:"wal_bytes_per_request"`
	CPUSecondsPerRequest    float64 `json:"cpu_seconds_per_request"`

	// The committer's work over the point (zero for the baseline).
	CommitFigures

	KeysStored      int64   `json:"keys_stored"`
	TableBytes      uint64  `json:"table_bytes"`
	DiskBytesPerKey float64 `json:"disk_bytes_per_key"`
	WriteAmp        float64 `json:"write_amp"`
	VerifiedKeys    int     `json:"verified_keys"`
}

// CommitFigures is the engine committer's work over a measurement, for
// targets that combine writes (the engine; zero for the baseline and the
// bare handler, whose commits are Pebble's own): commits made, writes per
// commit, their mean duration, the share of the measured time one was
// running (near 1: the commit path is the bottleneck), and the share of
// commit time Pebble waited for the WAL fsync (engine.Stats.CommitTime).
type CommitFigures struct {
	Commits             int64   `json:"commits"`
	WritesPerCommit     float64 `json:"writes_per_commit"`
	CommitMeanUS        float64 `json:"commit_mean_us"`
	CommitBusy          float64 `json:"commit_busy"`
	CommitSyncWaitShare float64 `json:"commit_sync_wait_share"`
}

// commitDelta accumulates the growth of the engine's commit counters over
// one or more measured intervals.
type commitDelta struct {
	groups, writes int64
	busy, wait     time.Duration
	elapsed        time.Duration
}

// add adds the growth from c0 to c1 over elapsed.
func (d *commitDelta) add(c0, c1 engine.Stats, elapsed time.Duration) {
	d.groups += c1.CommitGroups - c0.CommitGroups
	d.writes += c1.CommitWrites - c0.CommitWrites
	d.busy += c1.CommitTime - c0.CommitTime
	d.wait += c1.CommitSyncWait - c0.CommitSyncWait
	d.elapsed += elapsed
}

func (d commitDelta) figures() CommitFigures {
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

// Outcomes counts the claim answers of a point's requests.
type Outcomes struct {
	Acquired   int64 `json:"acquired"`
	Replay     int64 `json:"replay"`
	InProgress int64 `json:"in_progress"`
	Mismatch   int64 `json:"mismatch"`
}

func (o *Outcomes) add(p Outcomes) {
	o.Acquired += p.Acquired
	o.Replay += p.Replay
	o.InProgress += p.InProgress
	o.Mismatch += p.Mismatch
}

// Latency is a request latency distribution, in microseconds.
type Latency struct {
	P50  float64 `json:"p50"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p999"`
	Max  float64 `json:"max"`
	Mean float64 `json:"mean"`
}

// Comparison relates one target to a reference at one point.
type Comparison struct {
	Workload                string  `json:"workload"`
	Concurrency             int     `json:"concurrency"`
	Target                  string  `json:"target"`
	Reference               string  `json:"reference"`
	TargetRequestsPerSec    float64 `json:"target_requests_per_sec"`
	ReferenceRequestsPerSec float64 `json:"reference_requests_per_sec"`
	// Ratio is TargetRequestsPerSec / ReferenceRequestsPerSec.
	Ratio          float64 `json:"ratio"`
	TargetP50US    float64 `json:"target_p50_us"`
	ReferenceP50US float64 `json:"reference_p50_us"`
}

// Sizing is the guide's sizing table redone with measured numbers.
type Sizing struct {
	GuideRequestsPerSec      float64        `json:"guide_requests_per_sec"`
	RetentionSeconds         float64        `json:"retention_seconds"`
	KeysPerDay               int64          `json:"keys_per_day"`
	GuideBytesPerKey         float64        `json:"guide_bytes_per_key"`
	GuideBytesPerKeyWithBody float64        `json:"guide_bytes_per_key_with_body"`
	Targets                  []SizingTarget `json:"targets"`
}

// SizingTarget is one target's column of the sizing table.
type SizingTarget struct {
	Target                     string  `json:"target"`
	Keys                       int     `json:"keys"`
	BytesPerKey                float64 `json:"bytes_per_key"`
	StoreBytesPerDay           float64 `json:"store_bytes_per_day"`
	BodyKeys                   int     `json:"body_keys"`
	BodyBytes                  int     `json:"body_bytes"`
	BytesPerKeyWithBody        float64 `json:"bytes_per_key_with_body"`
	StoreBytesPerDayWithBodies float64 `json:"store_bytes_per_day_with_bodies"`
	PeakUniqueRequestsPerSec   float64 `json:"peak_unique_requests_per_sec"`
	PeakUniqueConcurrency      int     `json:"peak_unique_concurrency"`
	Headroom                   float64 `json:"headroom"`
	FsyncsPerRequest           float64 `json:"fsyncs_per_request"`
	SyncedBatchesPerRequest    float64 `json:"synced_batches_per_request"`
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes the report for people: the run, the fsync time, one
// row per point with the target/reference ratio, read-offs against the
// issue's goals, and the sizing table.
func (r *Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	m := &r.Meta
	fmt.Fprintf(&b, "idemkv bench: profile %s, %s, %.0f s\n", m.Profile, m.Date, m.WallSeconds)
	fmt.Fprintf(&b, "%s %s/%s, %s, %d CPUs (GOMAXPROCS %d)\n", m.GoVersion, m.GOOS, m.GOARCH, m.CPUModel, m.NumCPU, m.GOMAXPROCS)
	if f := r.Fsync; f.Samples > 0 {
		fmt.Fprintf(&b, "fsync on the data disk (%d B write + fdatasync, %d samples): p50 %s (%s before the sweep, %s after), p99 %s, mean %s\n",
			f.WriteBytes, f.Samples, us(f.P50US), us(f.StartP50US), us(f.EndP50US), us(f.P99US), us(f.MeanUS))
	}
	b.WriteString("\n")
	ratios := map[[2]any]float64{}
	for _, c := range r.Comparisons {
		ratios[[2]any{c.Workload, c.Concurrency}] = c.Ratio
	}
	first := ""
	if len(r.Comparisons) > 0 {
		first = r.Comparisons[0].Target
	}
	fmt.Fprintf(&b, "%-8s %5s %-9s %10s %9s %9s %9s %9s %9s %9s %9s %7s %6s %7s\n",
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
		fmt.Fprintf(&b, "%-8s %5d %-9s %10s %9s %9s %9s %9s %9.2f %9.2f %9s %7.1f %6.2f %7s\n",
			wl, p.Concurrency, p.Target, count(p.RequestsPerSec),
			us(p.Latency.P50), us(p.Latency.P99), us(p.Latency.P999), us(p.Latency.Max),
			p.FsyncsPerRequest, p.SyncedBatchesPerRequest, us(p.CPUSecondsPerRequest*1e6),
			p.DiskBytesPerKey, p.WriteAmp, ratio)
	}
	r.writeReadOffs(&b)
	r.writeSizing(&b)
	r.writeScale(&b)
	_, err := io.WriteString(w, b.String())
	return err
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

// writeReadOffs prints the figures the goals are stated in.
func (r *Report) writeReadOffs(b *strings.Builder) {
	var lines []string
	for _, c := range r.Comparisons {
		switch {
		case c.Workload == Unique && c.Concurrency == 1 && r.Fsync.P50US > 0:
			lines = append(lines, fmt.Sprintf("unique, concurrency 1: %s p50 %s = %.2f x one fsync (goal <= 1.3)",
				c.Target, us(c.TargetP50US), c.TargetP50US/r.Fsync.P50US))
		}
	}
	for _, c := range r.Comparisons {
		if (c.Workload == Unique || c.Workload == Remote) && (c.Concurrency == 64 || c.Concurrency == 256) {
			goal := "3"
			if c.Workload == Remote {
				goal = "1.5"
			}
			l := fmt.Sprintf("%s, concurrency %d: %s/%s = %.2f x (goal >= %s)",
				c.Workload, c.Concurrency, c.Target, c.Reference, c.Ratio, goal)
			if p := r.point(c.Workload, c.Concurrency, c.Target); p != nil && p.Commits > 0 {
				l += fmt.Sprintf("; commit path busy %.0f%%, %.1f writes a commit, %s each, %.0f%% of it waiting for the fsync",
					100*p.CommitBusy, p.WritesPerCommit, us(p.CommitMeanUS), 100*p.CommitSyncWaitShare)
			}
			lines = append(lines, l)
		}
		if c.Workload == Replay && c.Concurrency == 64 {
			lines = append(lines, fmt.Sprintf("replay, concurrency 64: %s %s req/s (goal >= 300,000)", c.Target, count(c.TargetRequestsPerSec)))
		}
	}
	if len(r.Sizing.Targets) > 0 && r.Sizing.Targets[0].Keys > 0 {
		t := r.Sizing.Targets[0]
		lines = append(lines, fmt.Sprintf("bytes on disk per completed key: %s %.1f B (goal <= 100)", t.Target, t.BytesPerKey))
	}
	if len(lines) == 0 {
		return
	}
	b.WriteString("\nRead-offs against the goals of issue 3:\n")
	for _, l := range lines {
		b.WriteString("  " + l + "\n")
	}
}

func (r *Report) writeSizing(b *strings.Builder) {
	sz := &r.Sizing
	if len(sz.Targets) == 0 {
		return
	}
	fmt.Fprintf(b, "\nSizing against the guide (%s unsafe requests/s, %s retention):\n",
		count(sz.GuideRequestsPerSec), dur(sz.RetentionSeconds))
	row := func(label, guide string, cell func(t SizingTarget) string) {
		fmt.Fprintf(b, "  %-40s %14s", label, guide)
		for _, t := range sz.Targets {
			fmt.Fprintf(b, " %16s", cell(t))
		}
		b.WriteString("\n")
	}
	row("", "guide", func(t SizingTarget) string { return t.Target })
	row("keys/day", count(float64(sz.KeysPerDay)), func(SizingTarget) string { return count(float64(sz.KeysPerDay)) })
	measured := func(t SizingTarget, n int, v float64, f func(float64) string) string {
		if n <= 0 {
			return "-"
		}
		return f(v)
	}
	bpk := func(v float64) string { return fmt.Sprintf("%.1f B", v) }
	row("bytes/key on disk (measured)", bpk(sz.GuideBytesPerKey), func(t SizingTarget) string {
		return measured(t, t.Keys, t.BytesPerKey, bpk)
	})
	row("store size/day, no bodies", byteSize(sz.GuideBytesPerKey*float64(sz.KeysPerDay)), func(t SizingTarget) string {
		return measured(t, t.Keys, t.StoreBytesPerDay, byteSize)
	})
	bodyLabel := "store size/day, with bodies"
	for _, t := range sz.Targets {
		if t.BodyKeys > 0 {
			bodyLabel = fmt.Sprintf("store size/day, %s-byte bodies", count(float64(t.BodyBytes)))
		}
	}
	row(bodyLabel, byteSize(sz.GuideBytesPerKeyWithBody*float64(sz.KeysPerDay)), func(t SizingTarget) string {
		return measured(t, t.BodyKeys, t.StoreBytesPerDayWithBodies, byteSize)
	})
	row("headroom (peak unique req/s / guide rate)", "-", func(t SizingTarget) string {
		if t.PeakUniqueRequestsPerSec == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1fx (c=%d)", t.Headroom, t.PeakUniqueConcurrency)
	})
	row("fsyncs/request (at that peak)", "-", func(t SizingTarget) string {
		return measured(t, t.PeakUniqueConcurrency, t.FsyncsPerRequest, func(v float64) string { return fmt.Sprintf("%.2f", v) })
	})
	row("synced batches/request (at that peak)", fmt.Sprintf("%.0f", guideWritesPerRequest), func(t SizingTarget) string {
		return measured(t, t.PeakUniqueConcurrency, t.SyncedBatchesPerRequest, func(v float64) string { return fmt.Sprintf("%.2f", v) })
	})
	for _, t := range sz.Targets {
		if t.Keys > 0 {
			fmt.Fprintf(b, "  bytes/key: sstable bytes after flush and compaction over %s records (status, 32-byte pointer,\n"+
				"  9-byte fingerprint, UUID key, tenant scope)", count(float64(t.Keys)))
			if t.BodyKeys > 0 {
				fmt.Fprintf(b, "; with bodies: measured the same way on %s records\n  with a %s-byte JSON-like body",
					count(float64(t.BodyKeys)), count(float64(t.BodyBytes)))
			}
			b.WriteString(".\n")
			break
		}
	}
}

// us formats a duration given in microseconds.
func us(v float64) string {
	switch {
	case v <= 0:
		return "-"
	case v < 10:
		return fmt.Sprintf("%.2fµs", v)
	case v < 1000:
		return fmt.Sprintf("%.0fµs", v)
	case v < 1e6:
		return fmt.Sprintf("%.2fms", v/1e3)
	}
	return fmt.Sprintf("%.2fs", v/1e6)
}

// count formats a number with thousands separators, or with M/G past ten
// million.
func count(v float64) string {
	switch {
	case v >= 1e10:
		return fmt.Sprintf("%.1f G", v/1e9)
	case v >= 1e7:
		return fmt.Sprintf("%.1f M", v/1e6)
	}
	s := fmt.Sprintf("%.0f", v)
	for i := len(s) - 3; i > 0 && s[i-1] != '-'; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// byteSize formats a byte count in decimal units, as the guide does.
func byteSize(v float64) string {
	for _, u := range []struct {
		f    float64
		name string
	}{{1e12, "TB"}, {1e9, "GB"}, {1e6, "MB"}, {1e3, "kB"}} {
		if v >= u.f {
			return fmt.Sprintf("%.1f %s", v/u.f, u.name)
		}
	}
	return fmt.Sprintf("%.0f B", v)
}

func dur(seconds float64) string {
	if seconds >= 3600 && int(seconds)%3600 == 0 {
		return fmt.Sprintf("%d h", int(seconds)/3600)
	}
	return fmt.Sprintf("%.0f s", seconds)
}
