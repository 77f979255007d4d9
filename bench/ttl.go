package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/ttl"
	"golang.org/x/time/rate"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// TTLConfig configures the retention measurement (RunTTL): a steady load
// of new keys against a short retention window, long enough for several
// windows to pass, once with the sweeper and once without, side by side.
// The zero value of every field means the default stated on it;
// TTLProfile returns the standard configurations.
type TTLConfig struct {
	// Profile names the configuration in the report. Default: "custom".
	Profile string
	// Retention is the records' retention window: the guide's 24 hours,
	// compressed. Default: 60 s.
	Retention time.Duration
	// Periods is how many retention windows each run lasts. Default: 6.
	Periods int
	// Rate is the constant request rate, requests per second (each a new
	// key, claimed and completed, no effect). Default: 5,000, the guide's.
	Rate float64
	// Clients is the number of concurrent clients sharing the rate.
	// Default: 64.
	Clients int
	// SampleEvery is the interval between disk samples. Default: 1 s.
	SampleEvery time.Duration
	// SweepInterval is the sweeper's interval in the measured run. Default:
	// Retention / 144, the ratio of the engine's default interval (10 min)
	// to the guide's 24 h: the run compresses every time constant alike.
	SweepInterval time.Duration
	// SweepRate is the sweeper's rate limit, records examined per second.
	// Default: the engine's default.
	SweepRate float64
	// SweepChunk is the sweeper's chunk size. Default: the engine's.
	SweepChunk int
	// SweepOn and SweepOff are the lengths of the sweeper run's alternating
	// slices, with passes back to back and with none. Default: 5 s each.
	// Each on-slice deletes what expired during the off-slice too, so the
	// sweeper deletes at (on+off)/on times the steady rate while it works:
	// twice with the defaults.
	SweepOn, SweepOff time.Duration
	// NoCompare skips the run without the sweeper (which measures what the
	// sweeper costs the foreground).
	NoCompare bool
	// CostKeys is the number of records the sweeper-cost measurement
	// expires and sweeps. Default: 200,000.
	CostKeys int
	// Tenants is the number of tenants keys are spread over. Default: 1,000.
	Tenants int
	// MemTableSize is the engine's memtable size, unless Engine sets one.
	// Default: the engine's default (8 MiB). Keep it well below the
	// window's live set (rate × retention × about 100 B), so that
	// records, tombstones and compactions go through the LSM as they do at
	// full scale, where the live set dwarfs any memtable; both profiles
	// use 2 MiB (a 5 MB and a 30 MB live set).
	MemTableSize uint64
	// Dir is where the run's temporary directory is created; it is removed
	// at the end. Default: os.TempDir().
	Dir string
	// Engine configures the engine; Retention, the sweep options and the
	// clock are set by the run. Default: engine defaults.
	Engine *engine.Options
	// Progress, if set, is called after each sample.
	Progress func(Progress)
}

// TTLProfile returns a standard configuration: "quick" (10 s windows, 6 of
// them, about 2.5 minutes) or "full" (60 s windows, 6 of them, about 13
// minutes), both with 2 MiB memtables.
func TTLProfile(name string) (TTLConfig, error) {
	switch name {
	case "quick":
		return TTLConfig{Profile: name, Retention: 10 * time.Second, CostKeys: 50_000, MemTableSize: 2 << 20}, nil
	case "full":
		return TTLConfig{Profile: name, Retention: time.Minute, CostKeys: 500_000, MemTableSize: 2 << 20}, nil
	}
	return TTLConfig{}, fmt.Errorf("bench: unknown profile %q (want quick or full)", name)
}

func (c TTLConfig) ensureDefaults() TTLConfig {
	if c.Profile == "" {
		c.Profile = "custom"
	}
	if c.Retention == 0 {
		c.Retention = time.Minute
	}
	if c.Periods == 0 {
		c.Periods = 6
	}
	if c.Rate == 0 {
		c.Rate = 5000
	}
	if c.Clients == 0 {
		c.Clients = 64
	}
	if c.SampleEvery == 0 {
		c.SampleEvery = time.Second
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = max(10*time.Millisecond, c.Retention/144)
	}
	if c.SweepOn == 0 {
		c.SweepOn = sweepSlice
	}
	if c.SweepOff == 0 {
		c.SweepOff = sweepSlice
	}
	if c.CostKeys == 0 {
		c.CostKeys = 200_000
	}
	if c.Tenants == 0 {
		c.Tenants = 1000
	}
	if c.Dir == "" {
		c.Dir = os.TempDir()
	}
	return c
}

// Validate reports a configuration RunTTL cannot run.
func (c TTLConfig) Validate() error {
	d := c.ensureDefaults()
	switch {
	case d.Retention < time.Second:
		return fmt.Errorf("bench: ttl: retention %v under a second (records keep whole seconds)", d.Retention)
	case d.Periods < 2:
		return fmt.Errorf("bench: ttl: %d periods; the steady state needs at least 2", d.Periods)
	case d.Rate <= 0 || d.Clients < 1 || d.SampleEvery <= 0 || d.CostKeys < 1 || d.SweepOn < 0 || d.SweepOff < 0:
		return fmt.Errorf("bench: ttl: rate, clients, sample interval, cost keys and sweep slices must be positive")
	}
	return nil
}

// TTLReport is the result of RunTTL. JSON field names are stable and
// documented in docs/benchmarks.md.
type TTLReport struct {
	Meta TTLMeta `json:"meta"`
	// Runs: "sweeper" first, then "no-sweeper" unless NoCompare.
	Runs []TTLRun `json:"runs"`
	// Cost is the sweeper's cost per record, measured apart.
	Cost SweepCost `json:"cost"`
	// Guide extrapolates to the guide's scale.
	Guide TTLGuide `json:"guide"`
}

// TTLMeta describes the run.
type TTLMeta struct {
	Date             string  `json:"date"`
	GoVersion        string  `json:"go_version"`
	CPUModel         string  `json:"cpu_model"`
	NumCPU           int     `json:"num_cpu"`
	Profile          string  `json:"profile"`
	RetentionSeconds float64 `json:"retention_seconds"`
	Periods          int     `json:"periods"`
	Rate             float64 `json:"rate"`
	Clients          int     `json:"clients"`
	SweepIntervalSec float64 `json:"sweep_interval_seconds"`
	SweepRate        float64 `json:"sweep_rate"`
	SweepOnSeconds   float64 `json:"sweep_on_seconds"`
	SweepOffSeconds  float64 `json:"sweep_off_seconds"`
	WallSeconds      float64 `json:"wall_seconds"`
}

// TTLSample is one point of a run's time series.
type TTLSample struct {
	Seconds    float64 `json:"seconds"`
	TableBytes uint64  `json:"table_bytes"` // live sstables, tombstones included
	LiveBytes  uint64  `json:"live_bytes"`  // live sstables and WAL
	DiskBytes  uint64  `json:"disk_bytes"`  // every file, transients included
	Completed  int64   `json:"completed"`
	Swept      int64   `json:"swept"`
}

// TTLRun is one steady-state run.
type TTLRun struct {
	Name           string      `json:"name"` // "sweeper" or "no-sweeper"
	Samples        []TTLSample `json:"samples"`
	Requests       int64       `json:"requests"`
	RequestsPerSec float64     `json:"requests_per_sec"`
	// Latency is over the second half of the run, in µs. In the sweeper
	// run, LatencySweeping and LatencyPaused split it by whether a pass was
	// under way when the request started (alternating slices, sweepSlice
	// long).
	Latency         Latency `json:"latency_us"`
	LatencySweeping Latency `json:"latency_sweeping_us"`
	LatencyPaused   Latency `json:"latency_paused_us"`
	// Steady is the second half of the run: the mean of the live bytes
	// (live sstables and WAL) and of the sstable bytes, the largest
	// deviation of a live-bytes sample from its mean, relative, and the
	// largest disk usage sampled (every file, compaction transients and
	// files awaiting deletion included).
	SteadyLiveBytes  float64 `json:"steady_live_bytes"`
	SteadyTableBytes float64 `json:"steady_table_bytes"`
	SteadySpread     float64 `json:"steady_spread"`
	PeakDiskBytes    uint64  `json:"peak_disk_bytes"`
	// LiveKeys is the records within their window at the end (rate ×
	// retention). FlushedTableBytes is the sstable bytes after the run,
	// once the memtable is flushed (no compaction forced), and
	// TableBytesPerLiveKey divides it by LiveKeys: it includes expired
	// records not yet swept and tombstones not yet compacted away.
	LiveKeys             float64 `json:"live_keys"`
	FlushedTableBytes    uint64  `json:"flushed_table_bytes"`
	TableBytesPerLiveKey float64 `json:"table_bytes_per_live_key"`
	WriteAmp             float64 `json:"write_amp"`
	Swept                int64   `json:"swept"`
	Passes               int64   `json:"sweep_passes"`
	HeldPastExpiry       int     `json:"held_past_expiry"`
	CPUSecondsPerRequest float64 `json:"cpu_seconds_per_request"`
}

// SweepCost is the sweeper's cost, measured on its own: a store of CostKeys
// records is swept once while none has expired (a pass that only reads)
// and once after all have (a pass that deletes them all), at no rate
// limit; then the store is compacted to turn the tombstones into free
// space.
type SweepCost struct {
	Keys int `json:"keys"`
	// IdlePassCPUSeconds is the CPU time of a pass with nothing expired,
	// which reads no record (it seeks past the buckets that have not
	// ended); CPUPerMillionDeleted is the CPU per million records deleted
	// by a pass, its reads of them included.
	IdlePassCPUSeconds   float64 `json:"idle_pass_cpu_seconds"`
	CPUPerMillionDeleted float64 `json:"cpu_seconds_per_million_deleted"`
	// DeletedPerSec is the unlimited deleting pass's rate.
	DeletedPerSec float64 `json:"deleted_per_sec"`
	// TableBytesBefore/After: sstable bytes before the deleting pass and
	// after the compaction that follows it.
	TableBytesBefore uint64 `json:"table_bytes_before"`
	TableBytesAfter  uint64 `json:"table_bytes_after"`
	// CompactionBytesPerDeletedByte is what reclaiming the space wrote:
	// sstable bytes written by the compaction per byte of records deleted.
	CompactionBytesPerDeletedByte float64 `json:"compaction_bytes_per_deleted_byte"`
}

// TTLGuide extrapolates to the guide's scale: 5,000 requests/s, 24 h.
type TTLGuide struct {
	KeysPerDay float64 `json:"keys_per_day"`
	// BytesPerLiveKey is the measured steady sstable bytes per live key.
	BytesPerLiveKey float64 `json:"bytes_per_live_key"`
	// SweepLagFraction is the share of records expired but not yet swept
	// at the engine's default sweeper settings: (interval + pass) / 24 h.
	SweepLagFraction float64 `json:"sweep_lag_fraction"`
	StoreBytes       float64 `json:"store_bytes"`
	// SweeperCores is the sweeper's share of the machine, in cores: the
	// day's deletes plus its passes' reads, at the measured costs.
	SweeperCores float64 `json:"sweeper_cores"`
	PassSeconds  float64 `json:"pass_seconds"`
}

// RunTTL runs the retention measurement.
func RunTTL(ctx context.Context, c TTLConfig) (*TTLReport, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	c = c.ensureDefaults()
	start := time.Now()
	dir, err := os.MkdirTemp(c.Dir, "idemkv-ttl-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	base := engine.Options{}
	if c.Engine != nil {
		base = *c.Engine
	}
	if base.MemTableSize == 0 {
		base.MemTableSize = c.MemTableSize
	}
	rep := &TTLReport{Meta: TTLMeta{
		Date: start.UTC().Format(time.RFC3339), GoVersion: runtime.Version(), CPUModel: cpuModel(),
		NumCPU: runtime.NumCPU(), Profile: c.Profile, RetentionSeconds: c.Retention.Seconds(),
		Periods: c.Periods, Rate: c.Rate, Clients: c.Clients, SweepIntervalSec: c.SweepInterval.Seconds(),
		SweepRate:      (&ttl.Options{Rate: c.SweepRate}).EnsureDefaults().Rate,
		SweepOnSeconds: c.SweepOn.Seconds(), SweepOffSeconds: c.SweepOff.Seconds(),
	}}
	names := []string{"sweeper"}
	if !c.NoCompare {
		names = append(names, "no-sweeper")
	}
	total := len(names) * int(time.Duration(c.Periods)*c.Retention/c.SampleEvery)
	done := 0
	for i, name := range names {
		o := base
		o.Retention = c.Retention
		if o.Lease == 0 || o.Lease > c.Retention {
			o.Lease = min(30*time.Second, c.Retention/2)
		}
		// The bench drives the sweeper run's passes itself, alternating
		// slices with and without a pass under way (see steadyRun).
		o.NoBackgroundSweep = true
		o.Sweep = ttl.Options{Interval: c.SweepInterval, Rate: c.SweepRate, ChunkSize: c.SweepChunk}
		run, err := steadyRun(ctx, c, filepath.Join(dir, name), &o, name == "sweeper", func() {
			done++
			if c.Progress != nil {
				c.Progress(Progress{Done: done, Total: total, Step: "ttl " + names[i]})
			}
		})
		if err != nil {
			return nil, fmt.Errorf("bench: ttl %s: %w", name, err)
		}
		run.Name = name
		rep.Runs = append(rep.Runs, run)
	}
	if rep.Cost, err = sweepCost(ctx, c, filepath.Join(dir, "cost"), base); err != nil {
		return nil, fmt.Errorf("bench: ttl cost: %w", err)
	}
	rep.Guide = guideTTL(rep.Runs[0], rep.Cost, base.EnsureDefaults())
	rep.Meta.WallSeconds = time.Since(start).Seconds()
	return rep, nil
}

// sweepSlice is the length of the alternating slices of the sweeper run:
// passes run back to back during one slice and not at all during the
// next, so that latency with and without the sweeper at work is measured
// on the same store over the same stretch of time.
const sweepSlice = 5 * time.Second

// steadyRun drives Rate new keys per second for Periods windows and samples
// the disk. If sweep, it runs the store's sweeper in alternating slices.
func steadyRun(ctx context.Context, c TTLConfig, dir string, o *engine.Options, sweep bool, tick func()) (TTLRun, error) {
	e, err := engine.Open(dir, o)
	if err != nil {
		return TTLRun{}, err
	}
	defer e.Close()
	runFor := time.Duration(c.Periods) * c.Retention
	ctx, cancel := context.WithTimeout(ctx, runFor)
	defer cancel()
	lim := rate.NewLimiter(rate.Limit(c.Rate), c.Clients)
	var (
		wg       sync.WaitGroup
		next     atomic.Uint64
		requests atomic.Int64
		steady   atomic.Bool
		mu       sync.Mutex
		hist     = newHist()
		hists    = [2]*hdrhistogram.Histogram{newHist(), newHist()} // paused, sweeping
		sweeping atomic.Bool
		runErr   error
		errOnce  sync.Once
	)
	if sweep {
		wg.Go(func() {
			for ctx.Err() == nil {
				slice, cancel := context.WithTimeout(ctx, c.SweepOn)
				sweeping.Store(true)
				for slice.Err() == nil {
					if _, err := e.Sweep(slice); err != nil && slice.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
						errOnce.Do(func() { runErr = err })
					}
				}
				cancel()
				sweeping.Store(false)
				// The off slice is part of the workload's schedule.
				select {
				case <-ctx.Done():
				case <-time.After(c.SweepOff):
				}
			}
		})
	}
	stream := uint64(time.Now().UnixNano())
	cpu0 := cpuTime()
	for range c.Clients {
		wg.Go(func() {
			h := newHist()
			hs := [2]*hdrhistogram.Histogram{newHist(), newHist()}
			defer func() {
				mu.Lock()
				hist.Merge(h)
				hists[0].Merge(hs[0])
				hists[1].Merge(hs[1])
				mu.Unlock()
			}()
			for lim.Wait(ctx) == nil {
				i := next.Add(1)
				during := sweeping.Load()
				t0 := time.Now()
				err := ttlRequest(ctx, e, stream, i, c.Tenants)
				if ctx.Err() != nil {
					return
				}
				if err != nil {
					errOnce.Do(func() { runErr = err })
					return
				}
				if steady.Load() {
					d := time.Since(t0)
					recordLatency(h, d)
					if sweep {
						recordLatency(hs[b2i(during)], d)
					}
				}
				requests.Add(1)
			}
		})
	}
	var run TTLRun
	t0 := time.Now()
	tk := time.NewTicker(c.SampleEvery)
	defer tk.Stop()
sample:
	for {
		select {
		case <-ctx.Done():
			break sample
		case <-tk.C:
		}
		st, err := e.Stats()
		if err != nil {
			return TTLRun{}, err
		}
		el := time.Since(t0)
		steady.Store(el >= runFor/2)
		run.Samples = append(run.Samples, TTLSample{Seconds: el.Seconds(), TableBytes: st.TableBytes,
			LiveBytes: st.LiveBytes, DiskBytes: st.DiskBytes, Completed: st.Completed, Swept: st.Sweep.Deleted})
		tick()
	}
	wg.Wait()
	if runErr != nil {
		return TTLRun{}, runErr
	}
	el := time.Since(t0)
	st, err := e.Stats()
	if err != nil {
		return TTLRun{}, err
	}
	run.Requests = requests.Load()
	run.RequestsPerSec = float64(run.Requests) / el.Seconds()
	run.CPUSecondsPerRequest = (cpuTime() - cpu0).Seconds() / float64(max(1, run.Requests))
	run.Latency = latencyOf(hist)
	if sweep {
		run.LatencyPaused, run.LatencySweeping = latencyOf(hists[0]), latencyOf(hists[1])
	}
	run.WriteAmp = st.WriteAmp
	run.Swept = st.Sweep.Deleted
	run.Passes = st.Sweep.Passes
	run.HeldPastExpiry = st.Sweep.HeldPastExpiry()
	run.SteadyLiveBytes, run.SteadySpread = steadyOf(run.Samples, func(s TTLSample) float64 { return float64(s.LiveBytes) })
	for _, s := range run.Samples[len(run.Samples)/2:] {
		run.PeakDiskBytes = max(run.PeakDiskBytes, s.DiskBytes)
	}
	run.SteadyTableBytes, _ = steadyOf(run.Samples, func(s TTLSample) float64 { return float64(s.TableBytes) })
	run.LiveKeys = run.RequestsPerSec * c.Retention.Seconds()
	// At rest: the memtable flushed, nothing compacted on purpose, so the
	// figure keeps expired records not yet swept and tombstones not yet
	// compacted away.
	if err := e.Flush(); err != nil {
		return TTLRun{}, err
	}
	if st, err = e.Stats(); err != nil {
		return TTLRun{}, err
	}
	run.FlushedTableBytes = st.TableBytes
	run.TableBytesPerLiveKey = float64(st.TableBytes) / run.LiveKeys
	return run, nil
}

// ttlRequest claims and completes request i's new key, with no effect.
func ttlRequest(ctx context.Context, e *engine.Engine, stream, i uint64, tenants int) error {
	id := keyOf(stream, i, tenants)
	cl, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: fingerprint(stream, i, false)})
	if err != nil {
		return err
	}
	if cl.Outcome != idemkv.Acquired {
		return violation("claim of new key %v: %v", id, cl.Outcome)
	}
	return e.Complete(ctx, cl.Lease, resultOf(stream, i, nil), nil)
}

// steadyOf returns the mean of f over the second half of samples and the
// largest relative deviation from it.
func steadyOf(samples []TTLSample, f func(TTLSample) float64) (mean, spread float64) {
	half := samples[len(samples)/2:]
	if len(half) == 0 {
		return 0, 0
	}
	for _, s := range half {
		mean += f(s)
	}
	mean /= float64(len(half))
	if mean == 0 {
		return 0, 0
	}
	for _, s := range half {
		spread = math.Max(spread, math.Abs(f(s)-mean)/mean)
	}
	return mean, spread
}

// sweepCost measures the sweeper on its own, on a store whose clock the
// run moves.
func sweepCost(ctx context.Context, c TTLConfig, dir string, o engine.Options) (SweepCost, error) {
	clock := fakeclock.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	o.Clock = clock
	o.Retention = time.Hour
	o.NoBackgroundSweep = true
	o.Sweep = ttl.Options{Rate: -1}
	e, err := engine.Open(dir, &o)
	if err != nil {
		return SweepCost{}, err
	}
	defer e.Close()
	stream := uint64(time.Now().UnixNano())
	var wg sync.WaitGroup
	var next atomic.Uint64
	errs := make(chan error, c.Clients)
	for range c.Clients {
		wg.Go(func() {
			for i := next.Add(1); i <= uint64(c.CostKeys); i = next.Add(1) {
				if err := ttlRequest(ctx, e, stream, i, c.Tenants); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return SweepCost{}, err
	}
	if err := e.Flush(); err != nil {
		return SweepCost{}, err
	}
	if err := e.Compact(ctx); err != nil {
		return SweepCost{}, err
	}
	pass := func() (ttl.Pass, float64, float64, error) {
		cpu, t := cpuTime(), time.Now()
		p, err := e.Sweep(ctx)
		return p, (cpuTime() - cpu).Seconds(), time.Since(t).Seconds(), err
	}
	res := SweepCost{Keys: c.CostKeys}
	_, cpu, _, err := pass() // nothing expired: a pass that skips every bucket
	if err != nil {
		return SweepCost{}, err
	}
	res.IdlePassCPUSeconds = cpu
	before, err := e.Stats()
	if err != nil {
		return SweepCost{}, err
	}
	res.TableBytesBefore = before.TableBytes
	clock.Advance(2 * time.Hour)
	p, cpu, wall, err := pass()
	if err != nil {
		return SweepCost{}, err
	}
	if p.Deleted != c.CostKeys {
		return SweepCost{}, fmt.Errorf("the pass deleted %d of %d expired records", p.Deleted, c.CostKeys)
	}
	res.CPUPerMillionDeleted = cpu / float64(p.Deleted) * 1e6
	res.DeletedPerSec = float64(p.Deleted) / wall
	if err := e.Flush(); err != nil {
		return SweepCost{}, err
	}
	if err := e.Compact(ctx); err != nil {
		return SweepCost{}, err
	}
	after, err := e.Stats()
	if err != nil {
		return SweepCost{}, err
	}
	res.TableBytesAfter = after.TableBytes
	res.CompactionBytesPerDeletedByte = float64(after.TableBytesWritten-before.TableBytesWritten) / float64(max(1, p.DeletedBytes))
	return res, nil
}

// guideTTL extrapolates the measured run to the guide's 5,000 requests/s
// and 24 h, with the engine's default sweeper settings o.
func guideTTL(run TTLRun, cost SweepCost, o *engine.Options) TTLGuide {
	const rate, day = 5000.0, 86400.0
	g := TTLGuide{KeysPerDay: rate * day}
	// The run's bytes per live key include its own sweep lag (its interval
	// and pass time against a short window, a larger share than the
	// defaults' against 24 h), so the store size below is conservative.
	g.BytesPerLiveKey = run.TableBytesPerLiveKey
	// A pass reads the records whose buckets ended since the last one:
	// an interval's worth of the day's keys. A record is swept at most a
	// bucket's width, an interval and a pass after it expires.
	so := o.Sweep.EnsureDefaults()
	if so.Rate > 0 {
		g.PassSeconds = g.KeysPerDay * so.Interval.Seconds() / day / so.Rate
	}
	width := day / float64(engine.BucketsPerWindow)
	g.SweepLagFraction = (width + so.Interval.Seconds() + g.PassSeconds) / day
	g.StoreBytes = g.KeysPerDay * g.BytesPerLiveKey
	passesPerDay := day / math.Max(so.Interval.Seconds(), g.PassSeconds)
	g.SweeperCores = (passesPerDay*cost.IdlePassCPUSeconds)/day + rate*cost.CPUPerMillionDeleted/1e6
	return g
}

// WriteJSON writes the report as indented JSON.
func (r *TTLReport) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes the report for people.
func (r *TTLReport) WriteTable(w io.Writer) error {
	var b strings.Builder
	m := r.Meta
	fmt.Fprintf(&b, "idemkv bench ttl, profile %s, %s, %s, %d CPUs, %s\n", m.Profile, m.Date, m.CPUModel, m.NumCPU, m.GoVersion)
	fmt.Fprintf(&b, "retention %v, %d periods, %.0f requests/s from %d clients, sweeper every %v at %.0f records/s\n\n",
		time.Duration(m.RetentionSeconds*float64(time.Second)), m.Periods, m.Rate, m.Clients,
		time.Duration(m.SweepIntervalSec*float64(time.Second)), m.SweepRate)
	fmt.Fprintf(&b, "%-11s %9s %11s %7s %10s %10s %11s %10s %10s %9s %9s %7s\n", "run", "req/s", "steady live", "spread", "peak disk", "steady sst", "B/live key", "p50", "p99", "writeamp", "swept", "held")
	for _, run := range r.Runs {
		fmt.Fprintf(&b, "%-11s %9.0f %11s %6.1f%% %10s %10s %11.1f %10s %10s %9.2f %9d %7d\n", run.Name, run.RequestsPerSec,
			byteSize(run.SteadyLiveBytes), 100*run.SteadySpread, byteSize(float64(run.PeakDiskBytes)), byteSize(run.SteadyTableBytes), run.TableBytesPerLiveKey,
			us(run.Latency.P50), us(run.Latency.P99), run.WriteAmp, run.Swept, run.HeldPastExpiry)
	}
	if sw := r.Runs[0]; sw.LatencyPaused.P99 > 0 {
		fmt.Fprintf(&b, "\nforeground latency while a pass runs: p50 %s, p99 %s; while none does: p50 %s, p99 %s; p99 ratio %.2f×\n",
			us(sw.LatencySweeping.P50), us(sw.LatencySweeping.P99), us(sw.LatencyPaused.P50), us(sw.LatencyPaused.P99),
			sw.LatencySweeping.P99/sw.LatencyPaused.P99)
	}
	cst := r.Cost
	fmt.Fprintf(&b, "\nsweeper cost (%d records, no rate limit): %.2f CPU ms for a pass with nothing expired, %.2f CPU s per million deleted (%s/s)\n",
		cst.Keys, 1e3*cst.IdlePassCPUSeconds, cst.CPUPerMillionDeleted, count(cst.DeletedPerSec))
	fmt.Fprintf(&b, "space: %s of sstables before, %s after the deleting pass and a compaction, which wrote %.2f bytes per byte deleted\n",
		byteSize(float64(cst.TableBytesBefore)), byteSize(float64(cst.TableBytesAfter)), cst.CompactionBytesPerDeletedByte)
	g := r.Guide
	fmt.Fprintf(&b, "\nat the guide's scale (5,000/s, 24 h, default sweeper): %s keys, %.1f B/key, sweep lag %.1f%%, store %s, sweeper %.3f cores (pass %s)\n",
		count(g.KeysPerDay), g.BytesPerLiveKey, 100*g.SweepLagFraction, byteSize(g.StoreBytes), g.SweeperCores, dur(g.PassSeconds))
	_, err := io.WriteString(w, b.String())
	return err
}

// Plot writes ttl-disk.png into dir: the live bytes (live sstables and
// WAL) and the whole disk usage over time, two lines per run. It returns the file written.
func (r *TTLReport) Plot(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("bench: plot: %w", err)
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("store size on disk, %.0f req/s, %v retention", r.Meta.Rate, time.Duration(r.Meta.RetentionSeconds*float64(time.Second)))
	p.X.Label.Text = "seconds"
	p.Y.Label.Text = "MB"
	var lines []any
	for _, run := range r.Runs {
		live := make(plotter.XYs, len(run.Samples))
		disk := make(plotter.XYs, len(run.Samples))
		for i, s := range run.Samples {
			live[i] = plotter.XY{X: s.Seconds, Y: float64(s.LiveBytes) / 1e6}
			disk[i] = plotter.XY{X: s.Seconds, Y: float64(s.DiskBytes) / 1e6}
		}
		lines = append(lines, run.Name+" live", live, run.Name+" all files", disk)
	}
	if err := plotutil.AddLines(p, lines...); err != nil {
		return "", fmt.Errorf("bench: plot: %w", err)
	}
	p.Legend.Top, p.Legend.Left = true, true
	f := filepath.Join(dir, "ttl-disk.png")
	if err := p.Save(16*vg.Centimeter, 10*vg.Centimeter, f); err != nil {
		return "", fmt.Errorf("bench: plot: %w", err)
	}
	return f, nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
