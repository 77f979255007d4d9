package day

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"text/tabwriter"

	"github.com/idemkv/idemkv/bench"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
)

// Report is what a day run measured.
type Report struct {
	Meta    bench.Meta     `json:"meta"`    // the run and the machine
	Options ReportOptions  `json:"options"` // what the run was asked to do
	Disk    DiskFit        `json:"disk"`    // whether the disk held the run asked for
	Load    LoadFigures    `json:"load"`    // the large store's loading
	Restart RestartFigures `json:"restart"` // the large store's Open, Check, Backup and Close
	// Small and Large are the open-loop phase on each store.
	Small, Large *Phase `json:"-"`
	// Phases holds both in the JSON, small first.
	Phases []*Phase `json:"open_loop"`
	// Closed are the closed-loop points, every round of each.
	Closed []ClosedPoint `json:"closed_loop"`
}

// ReportOptions are the options a report was measured with.
type ReportOptions struct {
	Records         int64   `json:"records"`          // the large store's records
	Small           int64   `json:"small"`            // the small store's records
	Rate            float64 `json:"rate"`             // the open-loop phase's requests per second
	DurationSeconds float64 `json:"duration_seconds"` // the open-loop phase on each store, in seconds
	WindowSeconds   float64 `json:"window_seconds"`   // the span of each of its windows, in seconds
	Clients         []int   `json:"clients"`          // the closed-loop concurrencies
	PointSeconds    float64 `json:"point_seconds"`    // each closed-loop point, in seconds
	Rounds          int     `json:"rounds"`           // the closed-loop rounds
	Retries         float64 `json:"retries"`          // the open-loop share of retries of completed keys
	Duplicates      float64 `json:"duplicates"`       // the open-loop share of requests sent twice at once
	Tenants         int     `json:"tenants"`          // the tenants the records and requests are spread over
	// MemoryLimit is the Go memory limit in effect in the measured phases,
	// in bytes, 0 if there was none: Options.MemoryLimit's, or GOMEMLIMIT's
	// if that was not set. The loads ran under GOMEMLIMIT's, if any.
	MemoryLimit int64 `json:"memory_limit_bytes"`
}

func reportOptions(o *Options) ReportOptions {
	return ReportOptions{Records: o.Records, Small: o.Small, Rate: o.Rate, DurationSeconds: o.Duration.Seconds(),
		WindowSeconds: o.Window.Seconds(), Clients: o.Clients, PointSeconds: o.Point.Seconds(), Rounds: o.Rounds,
		Retries: o.Retries, Duplicates: o.Duplicates, Tenants: o.Tenants}
}

// DiskFit says whether the disk held the large store asked for.
type DiskFit struct {
	Asked      int64  `json:"asked"`       // the records asked for
	Records    int64  `json:"records"`     // the records run: fewer if the disk could not hold them
	NeedBytes  uint64 `json:"need_bytes"`  // the disk the run asked for needs, reckoned
	AvailBytes uint64 `json:"avail_bytes"` // the disk that was free
}

// LoadFigures are the loader's.
type LoadFigures struct {
	Records   int64   `json:"records"`        // the records loaded
	Seconds   float64 `json:"seconds"`        // the wall time of the load, in seconds
	PerSecond float64 `json:"per_second"`     // records loaded a second
	RSSPeak   uint64  `json:"rss_peak_bytes"` // the process's peak resident memory after it
	Reused    bool    `json:"reused"`         // the store was left by an earlier run, which measured the figures
}

// RestartFigures are an Open of the loaded store and what follows.
type RestartFigures struct {
	// OpenSeconds is from Open to the claim filter in use: full speed.
	OpenSeconds float64 `json:"open_seconds"`
	SavedFilter bool    `json:"saved_filter"` // the filter was the one saved, not scanned
	// ScanOpenSeconds is the same without the saved filter (ScanRestart).
	ScanOpenSeconds float64 `json:"scan_open_seconds,omitempty"`
	CheckSeconds    float64 `json:"check_seconds"`          // a full Check, in seconds
	CheckRecords    int     `json:"check_records"`          // the records it found
	BackupSeconds   float64 `json:"backup_seconds"`         // an online Backup, in seconds
	CloseSeconds    float64 `json:"close_seconds"`          // a Close, the filter's save included
	TableBytes      uint64  `json:"table_bytes"`            // the live sstables' bytes
	DiskBytes       uint64  `json:"disk_bytes"`             // all of the store's files
	BytesPerRecord  float64 `json:"table_bytes_per_record"` // TableBytes by the records
	Memory          Memory  `json:"memory"`                 // after the Open
}

// Memory is the process's memory by component, in bytes.
type Memory struct {
	RSS uint64 `json:"rss"` // the resident set, all of it
	// RSSPeak is the resident set's peak (VmHWM) in a phase run in a
	// process of its own (OwnProcess); zero in the harness's process,
	// whose peak is the load's.
	RSSPeak uint64 `json:"rss_peak,omitempty"`
	// OwnProcess says the figures are of a process that ran only the
	// phase (Options.Child), not of the harness.
	OwnProcess bool `json:"own_process"`
	// GoHeap is the heap's spans in use (MemStats.HeapInuse): the live
	// objects, the claim filter and the replay cache among them, and the
	// garbage not collected yet, with the room free in those spans. It is
	// what the heap occupies, which the collector lets grow to about
	// twice GoHeapLive (GOGC=100) unless a memory limit holds it down.
	GoHeap uint64 `json:"go_heap"`
	// GoHeapLive is what the last collection found live
	// (runtime/metrics /gc/heap/live:bytes): what the heap needs, at
	// most GoHeap.
	GoHeapLive  uint64 `json:"go_heap_live"`
	ClaimFilter uint64 `json:"claim_filter"` // its bits
	BlockCache  uint64 `json:"block_cache"`  // its limit, outside the Go heap
	MemTables   uint64 `json:"memtables"`    // Pebble's memtables, outside the Go heap
	ReplayCache uint64 `json:"replay_cache"` // its limit
}

// Phase is the open-loop phase on one store.
type Phase struct {
	Records        int64         `json:"records"`                // the store's size at the start
	Windows        []WindowPoint `json:"windows"`                // the phase, window by window
	Latency        bench.Latency `json:"latency"`                // over the whole phase, from each request's scheduled time
	RecordsAfter   int64         `json:"completed"`              // the requests completed
	WriteAmp       float64       `json:"write_amp"`              // sstable bytes written per byte flushed during the phase
	BytesPerRecord float64       `json:"table_bytes_per_record"` // at the end, by the size at the start
	Sweep          SweepFigures  `json:"sweep"`                  // the sweeper's work during the phase
	Memory         Memory        `json:"memory"`                 // at the end
	GC             GCFigures     `json:"gc"`                     // the collector's work during the phase
}

// GCFigures are the collector's work during a phase, from runtime/metrics.
// The runtime brings its CPU figures up to date at each collection, so
// they cover the phase from the last collection before it began to the
// last before it ended. They are the runtime's estimates, to compare with
// each other, not with the system's CPU time.
type GCFigures struct {
	Cycles     uint64  `json:"cycles"`      // the collections completed (/gc/cycles/total)
	CPUSeconds float64 `json:"cpu_seconds"` // the collector's CPU time (/cpu/classes/gc/total)
	// IdleMarkCPUSeconds is the part of CPUSeconds spent marking on CPU
	// that was otherwise idle (/cpu/classes/gc/mark/idle): not taken from
	// the requests.
	IdleMarkCPUSeconds float64 `json:"idle_mark_cpu_seconds"`
	// BusyCPUSeconds is the CPU time the process's Go code and runtime
	// used, the collector's included (/cpu/classes/total less
	// /cpu/classes/idle).
	BusyCPUSeconds float64 `json:"busy_cpu_seconds"`
	// AvailableCPUSeconds is GOMAXPROCS times the wall time covered
	// (/cpu/classes/total).
	AvailableCPUSeconds float64 `json:"available_cpu_seconds"`
	Share               float64 `json:"share"`           // CPUSeconds by BusyCPUSeconds: the collector's share of the CPU the process used
	AvailableShare      float64 `json:"available_share"` // CPUSeconds by AvailableCPUSeconds: its share of the CPU GOMAXPROCS allowed
}

// SweepFigures are the sweeper's work during a phase.
type SweepFigures struct {
	Passes          int64   `json:"passes"`            // the passes that ended
	Deleted         int64   `json:"deleted"`           // the records they deleted
	LastPassSeconds float64 `json:"last_pass_seconds"` // the wall time of the last pass
	LastPassDeleted int     `json:"last_pass_deleted"` // the records it deleted
	// FinalPassSeconds is a pass run at the end of the phase, its clock
	// past the bucket that ended halfway; FinalPassDeleted what it deleted.
	FinalPassSeconds float64 `json:"final_pass_seconds"`
	// FinalPassDeleted is the records the final pass deleted.
	FinalPassDeleted int `json:"final_pass_deleted"`
}

// lsm sums the phase's windows: the highest of the levels, the sum of
// the counts and times.
func (p *Phase) lsm() LSMPoint {
	var s LSMPoint
	for _, w := range p.Windows {
		l := w.LSM
		s.ReadAmp, s.L0Files, s.CompactionDebt = max(s.ReadAmp, l.ReadAmp), max(s.L0Files, l.L0Files), max(s.CompactionDebt, l.CompactionDebt)
		s.Compactions += l.Compactions
		s.Flushes += l.Flushes
		s.StallSeconds += l.StallSeconds
		s.SyncWait += l.SyncWait
	}
	return s
}

// ClosedPoint is one closed-loop measurement.
type ClosedPoint struct {
	Store   string  `json:"store"`   // "small" or "large"
	Clients int     `json:"clients"` // the concurrent clients
	Round   int     `json:"round"`   // from 0
	Rate    float64 `json:"rate"`    // requests completed a second
}

func (r *Report) addPoint(store string, clients, round int, rate float64) {
	r.Closed = append(r.Closed, ClosedPoint{Store: store, Clients: clients, Round: round, Rate: rate})
}

// meanRate is the geometric mean of the rounds of (store, clients).
func (r *Report) meanRate(store string, clients int) float64 {
	sum, n := 0.0, 0
	for _, p := range r.Closed {
		if p.Store == store && p.Clients == clients && p.Rate > 0 {
			sum += math.Log(p.Rate)
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return math.Exp(sum / float64(n))
}

// WriteTable writes the report as text.
func (r *Report) WriteTable(w io.Writer) error {
	r.Meta.WriteHeader(w, "bench day")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	mb := func(b uint64) string { return fmt.Sprintf("%.0f MB", float64(b)/1e6) }
	peak := func(m Memory) string {
		if !m.OwnProcess {
			return "–" // the harness's peak is its load's
		}
		return mb(m.RSSPeak)
	}
	fmt.Fprintf(w, "\nlarge store: %s records; small store: %s\n", bench.Count(float64(r.Options.Records)), bench.Count(float64(r.Options.Small)))
	if l := r.Options.MemoryLimit; l > 0 {
		fmt.Fprintf(w, "Go memory limit after the loads: %d MiB (%s)\n", l>>20, mb(uint64(l)))
	} else {
		fmt.Fprintln(w, "Go memory limit after the loads: none")
	}
	if d := r.Disk; d.Records != d.Asked {
		fmt.Fprintf(w, "the disk had %d GB free and %s records need about %d GB: ran %s, %.0f%% of the size asked for\n",
			d.AvailBytes>>30, bench.Count(float64(d.Asked)), d.NeedBytes>>30, bench.Count(float64(d.Records)), 100*float64(d.Records)/float64(d.Asked))
	}
	l := r.Load
	fmt.Fprintf(w, "load: %.0f s, %s records a second (peak RSS %s)%s\n", l.Seconds, bench.Count(l.PerSecond), mb(l.RSSPeak), map[bool]string{true: ", from an earlier run"}[l.Reused])
	s := r.Restart
	fmt.Fprintf(w, "open to full speed: %.2f s (saved filter: %v)", s.OpenSeconds, s.SavedFilter)
	if s.ScanOpenSeconds > 0 {
		fmt.Fprintf(w, "; without the saved filter: %.0f s", s.ScanOpenSeconds)
	}
	fmt.Fprintf(w, "\ncheck: %.0f s (%s records); backup: %.2f s; close: %.2f s\n", s.CheckSeconds, bench.Count(float64(s.CheckRecords)), s.BackupSeconds, s.CloseSeconds)
	fmt.Fprintf(w, "disk: %s of sstables, %.1f B a record (the guide's estimate: 200 B)\n", mb(s.TableBytes), s.BytesPerRecord)
	m := s.Memory
	if m.OwnProcess {
		fmt.Fprintf(w, "each measured phase ran in a process of its own: its memory, not the harness's (peak RSS of the restart's, Check and Backup included: %s)\n", mb(m.RSSPeak))
	}
	fmt.Fprintf(w, "memory after Open: RSS %s; Go heap %s in use, %s live (claim filter %s, replay cache up to %s); block cache %s, memtables %s\n",
		mb(m.RSS), mb(m.GoHeap), mb(m.GoHeapLive), mb(m.ClaimFilter), mb(m.ReplayCache), mb(m.BlockCache), mb(m.MemTables))
	fmt.Fprintf(w, "\nopen loop at %s requests/s for %.0f s:\n", bench.Count(r.Options.Rate), r.Options.DurationSeconds)
	fmt.Fprintln(tw, "store\trecords\tp50 µs\tp99 µs\tp99.9 µs\twrite amp\tswept\tlast pass s\tfinal pass\tRSS\tpeak RSS\theap in use\theap live\tGCs\tGC CPU s\tGC share\t")
	for _, p := range []*Phase{r.Small, r.Large} {
		if p == nil {
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.0f\t%.0f\t%.2f\t%s\t%.1f\t%s in %.1f s\t%s\t%s\t%s\t%s\t%d\t%.1f\t%.1f%%\t\n", map[bool]string{true: "large", false: "small"}[p == r.Large],
			bench.Count(float64(p.Records)), p.Latency.P50, p.Latency.P99, p.Latency.P999, p.WriteAmp,
			bench.Count(float64(p.Sweep.Deleted)), p.Sweep.LastPassSeconds, bench.Count(float64(p.Sweep.FinalPassDeleted)),
			p.Sweep.FinalPassSeconds, mb(p.Memory.RSS), peak(p.Memory), mb(p.Memory.GoHeap), mb(p.Memory.GoHeapLive),
			p.GC.Cycles, p.GC.CPUSeconds, 100*p.GC.Share)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if r.Small != nil && r.Large != nil && r.Small.Latency.P99 > 0 {
		fmt.Fprintf(w, "p99, large by small: %.2f× (goal: at most 1.5×)\n", r.Large.Latency.P99/r.Small.Latency.P99)
	}
	for _, p := range []*Phase{r.Small, r.Large} {
		if p != nil {
			l := p.lsm()
			fmt.Fprintf(w, "LSM tree, %s store: read amp up to %d, L0 files up to %d, compaction debt up to %s; %d flushes, %d compactions; writes stopped %.1f s; fsync waits %.0f s\n",
				map[bool]string{true: "large", false: "small"}[p == r.Large], l.ReadAmp, l.L0Files, mb(l.CompactionDebt),
				l.Flushes, l.Compactions, l.StallSeconds, l.SyncWait)
		}
	}
	fmt.Fprintf(w, "\nclosed loop, geometric mean of %d rounds (multiples of the guide's 5,000/s):\n", r.Options.Rounds)
	fmt.Fprintln(tw, "clients\tsmall\tlarge\tlarge by small\t")
	for _, c := range r.Options.Clients {
		sm, lg := r.meanRate("small", c), r.meanRate("large", c)
		ratio := 0.0
		if sm > 0 {
			ratio = lg / sm
		}
		fmt.Fprintf(tw, "%d\t%s (%.1f×)\t%s (%.1f×)\t%.2f\t\n", c, bench.Count(sm), sm/guideRate, bench.Count(lg), lg/guideRate, ratio)
	}
	return tw.Flush()
}

// WriteJSON writes the report as JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	r.Phases = nil
	for _, p := range []*Phase{r.Small, r.Large} {
		if p != nil {
			r.Phases = append(r.Phases, p)
		}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// Plot writes day-latency.png, the p50, p99 and p99.9 of each window of
// the open-loop phase on both stores, into dir.
func (r *Report) Plot(dir string) ([]string, error) {
	p := bench.NewPlot("open loop at the guide's rate", "seconds into the phase", "latency (ms)")
	var args []any
	for _, ph := range []struct {
		name string
		p    *Phase
	}{{"small", r.Small}, {"large", r.Large}} {
		if ph.p == nil {
			continue
		}
		for _, q := range []struct {
			name string
			f    func(bench.Latency) float64
		}{{"p50", func(l bench.Latency) float64 { return l.P50 }}, {"p99", func(l bench.Latency) float64 { return l.P99 }},
			{"p99.9", func(l bench.Latency) float64 { return l.P999 }}} {
			pts := make(plotter.XYs, len(ph.p.Windows))
			for i, wp := range ph.p.Windows {
				pts[i] = plotter.XY{X: wp.Second, Y: q.f(wp.Latency) / 1e3}
			}
			args = append(args, ph.name+" "+q.name, pts)
		}
	}
	if err := plotutil.AddLinePoints(p, args...); err != nil {
		return nil, err
	}
	f, err := bench.SavePlot(p, dir, "day-latency.png")
	if err != nil {
		return nil, err
	}
	return []string{filepath.Clean(f)}, nil
}
