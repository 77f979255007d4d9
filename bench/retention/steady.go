package retention

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/bench"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/ttl"
)

// Steady is one steady-state run.
type Steady struct {
	Name           string   `json:"name"`             // "sweeper" or "no-sweeper"
	Samples        []Sample `json:"samples"`          // the store's size over time, one per Options.SampleEvery
	Requests       int64    `json:"requests"`         // the number of requests completed
	RequestsPerSec float64  `json:"requests_per_sec"` // the load as delivered, requests/s
	// Latency is the request latency over the second half of the run, in
	// µs.
	Latency bench.Latency `json:"latency_us"`
	// LatencySweeping is the sweeper run's latency of the requests that
	// started while a pass was under way, in µs.
	LatencySweeping bench.Latency `json:"latency_sweeping_us"`
	// LatencyPaused is the sweeper run's latency of the requests that
	// started while none was, in µs.
	LatencyPaused bench.Latency `json:"latency_paused_us"`
	// SteadyLiveBytes is the mean of the samples' LiveBytes over the
	// second half of the run.
	SteadyLiveBytes float64 `json:"steady_live_bytes"`
	// SteadyTableBytes is the mean of their TableBytes over the second
	// half.
	SteadyTableBytes float64 `json:"steady_table_bytes"`
	// SteadySpread is the largest deviation of a LiveBytes sample of the
	// second half from SteadyLiveBytes, relative: the flatness goal.
	SteadySpread  float64 `json:"steady_spread"`
	PeakDiskBytes uint64  `json:"peak_disk_bytes"` // the largest DiskBytes sampled in the second half
	// LiveKeys is the records within their window at the end: rate ×
	// retention.
	LiveKeys float64 `json:"live_keys"`
	// FlushedTableBytes is the sstable bytes after the run, once the
	// memtable is flushed (no compaction forced): it includes expired
	// records not yet swept and tombstones not yet compacted away.
	FlushedTableBytes    uint64  `json:"flushed_table_bytes"`
	TableBytesPerLiveKey float64 `json:"table_bytes_per_live_key"` // FlushedTableBytes / LiveKeys, in bytes
	WriteAmp             float64 `json:"write_amp"`                // Pebble's write amplification over the run
	Swept                int64   `json:"swept"`                    // the number of records the sweeper deleted
	Passes               int64   `json:"sweep_passes"`             // the number of sweeper passes
	// HeldPastExpiry is the records past their expiry the sweeper had to
	// keep at the end, because their outcome was not settled.
	HeldPastExpiry int `json:"held_past_expiry"`
	// CPUSecondsPerRequest is the process's CPU time over the run per
	// request, in seconds.
	CPUSecondsPerRequest float64 `json:"cpu_seconds_per_request"`
}

// Sample is one point of a run's time series.
type Sample struct {
	Seconds float64 `json:"seconds"` // the time since the run started, in seconds
	// TableBytes is the live sstables' size, tombstones included, in
	// bytes.
	TableBytes uint64 `json:"table_bytes"`
	LiveBytes  uint64 `json:"live_bytes"` // the live sstables' and WAL's size, in bytes
	// DiskBytes is every file's size, in bytes: compaction outputs in
	// progress, files awaiting deletion and recycled WAL files included.
	DiskBytes uint64 `json:"disk_bytes"`
	Completed int64  `json:"completed"` // the records completed since the store opened
	Swept     int64  `json:"swept"`     // the records the sweeper deleted since the store opened
}

// steady is the state of one steady-state run.
type steady struct {
	o     *Options
	e     *engine.Engine
	name  string
	sweep bool // the sweeper run
	// settled is set once the second half of the run begins: latencies
	// count from then on.
	settled  atomic.Bool
	sweeping atomic.Bool // a pass is under way
	requests atomic.Int64
	mu       struct {
		sync.Mutex
		all            *bench.Histogram
		paused, during *bench.Histogram
		err            error
	}
	cancel context.CancelFunc
}

// steadyRun drives Options.Rate new keys per second for Options.Periods
// windows on a fresh store and samples its size. In the run named
// "sweeper" it runs the store's sweeper in alternating slices.
func steadyRun(ctx context.Context, o *Options, run *bench.Run, name string) (Steady, error) {
	eo := *o.Engine
	eo.Retention = o.Retention
	eo.NoBackgroundSweep = true // the harness drives the sweeper run's passes
	eo.Sweep = ttl.Options{Interval: o.SweepInterval, Rate: o.SweepRate, ChunkSize: o.SweepChunk}
	e, err := engine.Open(run.Dir(name), &eo)
	if err != nil {
		return Steady{}, err
	}
	defer e.Close()
	runFor := time.Duration(o.Periods) * o.Retention
	ctx, cancel := context.WithTimeout(ctx, runFor)
	defer cancel()
	s := &steady{o: o, e: e, name: name, sweep: name == "sweeper", cancel: cancel}
	s.mu.all, s.mu.paused, s.mu.during = bench.NewHistogram(), bench.NewHistogram(), bench.NewHistogram()
	var wg sync.WaitGroup
	if s.sweep {
		wg.Go(func() { s.sweeper(ctx) })
	}
	lim := rate.NewLimiter(rate.Limit(o.Rate), o.Clients)
	stream, next := uint64(time.Now().UnixNano()), new(atomic.Uint64)
	cpu0, t0 := bench.CPUTime(), time.Now()
	for range o.Clients {
		wg.Go(func() { s.client(ctx, lim, stream, next) })
	}
	rf := Steady{Name: name}
	rf.Samples, err = s.sample(ctx, run, t0, runFor)
	cancel()
	wg.Wait()
	if err = errors.Join(err, s.mu.err); err != nil {
		return Steady{}, err
	}
	rf.Requests = s.requests.Load()
	rf.RequestsPerSec = float64(rf.Requests) / time.Since(t0).Seconds()
	rf.CPUSecondsPerRequest = (bench.CPUTime() - cpu0).Seconds() / float64(max(1, rf.Requests))
	rf.Latency = s.mu.all.Latency()
	if s.sweep {
		rf.LatencyPaused, rf.LatencySweeping = s.mu.paused.Latency(), s.mu.during.Latency()
	}
	return rf, rf.settle(e, o)
}

// fail records the run's first error and ends it.
func (s *steady) fail(err error) {
	s.mu.Lock()
	if s.mu.err == nil {
		s.mu.err = err
	}
	s.mu.Unlock()
	s.cancel()
}

// sweeper runs passes back to back for Options.SweepOn, then none for
// Options.SweepOff, and again, until ctx ends.
func (s *steady) sweeper(ctx context.Context) {
	for ctx.Err() == nil {
		slice, cancel := context.WithTimeout(ctx, s.o.SweepOn)
		s.sweeping.Store(true)
		for slice.Err() == nil {
			if _, err := s.e.Sweep(slice); err != nil && slice.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
				s.fail(err)
			}
		}
		cancel()
		s.sweeping.Store(false)
		// The off slice is part of the workload's schedule.
		select {
		case <-ctx.Done():
		case <-time.After(s.o.SweepOff):
		}
	}
}

// client sends requests for new keys at the pace lim allows until ctx
// ends, and records the latency of those of the second half.
func (s *steady) client(ctx context.Context, lim *rate.Limiter, stream uint64, next *atomic.Uint64) {
	all, paused, during := bench.NewHistogram(), bench.NewHistogram(), bench.NewHistogram()
	defer func() {
		s.mu.Lock()
		s.mu.all.Merge(all)
		s.mu.paused.Merge(paused)
		s.mu.during.Merge(during)
		s.mu.Unlock()
	}()
	for lim.Wait(ctx) == nil {
		i := next.Add(1)
		sweeping := s.sweeping.Load()
		t0 := time.Now()
		err := request(ctx, s.e, stream, i, s.o.Tenants)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			s.fail(err)
			return
		}
		if s.settled.Load() {
			d := time.Since(t0)
			all.Record(d)
			if sweeping {
				during.Record(d)
			} else {
				paused.Record(d)
			}
		}
		s.requests.Add(1)
	}
}

// request claims and completes request i's new key, with no effect.
func request(ctx context.Context, e *engine.Engine, stream, i uint64, tenants int) error {
	c, err := bench.ClaimNew(ctx, e, stream, i, tenants, idemkv.ModeLocal)
	if err != nil {
		return err
	}
	return e.Complete(ctx, c.Lease, bench.Result(stream, i, nil), nil)
}

// sample samples the store's size every Options.SampleEvery from t0 until
// ctx ends, and marks the second half of runFor.
func (s *steady) sample(ctx context.Context, run *bench.Run, t0 time.Time, runFor time.Duration) ([]Sample, error) {
	var samples []Sample
	tk := time.NewTicker(s.o.SampleEvery)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return samples, nil
		case <-tk.C:
		}
		st, err := s.e.Stats()
		if err != nil {
			return nil, err
		}
		el := time.Since(t0)
		s.settled.Store(el >= runFor/2)
		samples = append(samples, Sample{Seconds: el.Seconds(), TableBytes: st.TableBytes,
			LiveBytes: st.LiveBytes, DiskBytes: st.DiskBytes, Completed: st.Completed, Swept: st.Sweep.Deleted})
		run.Step("ttl " + s.name)
	}
}

// settle fills in the figures of the store at the end of the run: its
// sweeper's work, its size over the second half, and its size at rest.
func (rf *Steady) settle(e *engine.Engine, o *Options) error {
	st, err := e.Stats()
	if err != nil {
		return err
	}
	rf.WriteAmp = st.WriteAmp
	rf.Swept = st.Sweep.Deleted
	rf.Passes = st.Sweep.Passes
	rf.HeldPastExpiry = st.Sweep.HeldPastExpiry()
	rf.SteadyLiveBytes, rf.SteadySpread = steadyOf(rf.Samples, func(s Sample) float64 { return float64(s.LiveBytes) })
	rf.SteadyTableBytes, _ = steadyOf(rf.Samples, func(s Sample) float64 { return float64(s.TableBytes) })
	for _, s := range rf.Samples[len(rf.Samples)/2:] {
		rf.PeakDiskBytes = max(rf.PeakDiskBytes, s.DiskBytes)
	}
	rf.LiveKeys = rf.RequestsPerSec * o.Retention.Seconds()
	// At rest: the memtable flushed, nothing compacted on purpose, so the
	// figure keeps expired records not yet swept and tombstones not yet
	// compacted away.
	if err := e.Flush(); err != nil {
		return err
	}
	if st, err = e.Stats(); err != nil {
		return err
	}
	rf.FlushedTableBytes = st.TableBytes
	rf.TableBytesPerLiveKey = float64(st.TableBytes) / rf.LiveKeys
	return nil
}

// steadyOf returns the mean of f over the second half of samples and the
// largest relative deviation from it.
func steadyOf(samples []Sample, f func(Sample) float64) (mean, spread float64) {
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
