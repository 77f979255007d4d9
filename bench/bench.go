package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
)

// Config configures a run. The zero value of every field means the default
// stated on it; Profile returns the two standard configurations.
type Config struct {
	// Profile names the configuration in the report's metadata. Default:
	// "custom".
	Profile string
	// Workloads to run, by name (see Workloads). Default: all of them.
	Workloads []string
	// Concurrency is the sweep: the number of concurrent clients at each
	// point. Default: 1, 16, 64, 256.
	Concurrency []int
	// Duration is how long each point runs. Default: 1 s.
	Duration time.Duration
	// Dir is where the run's temporary directory is created; it is removed
	// at the end. Default: os.TempDir(). Fsyncs are timed on this disk.
	Dir string
	// Engine configures both targets (the baseline reads the same Pebble
	// settings). Its FS, if set, is wrapped by the sync counter. Default:
	// engine defaults.
	Engine *engine.Options
	// CompactionNice, if positive, runs both targets' compactions at this
	// nice value (package engine/lowprio), unless Engine sets
	// ConfigurePebble. Default: 0, the process's priority.
	CompactionNice int
	// Targets are the stores measured. Default: EngineTarget(Engine),
	// BaselineTarget(Engine). Comparisons relate the first to the second.
	Targets []Target

	// RetryFraction is the share of retry-workload requests that re-send a
	// recent key. Default: 0.25.
	RetryFraction float64
	// HotDuplicates is how many requests the hot workload sends per key.
	// Default: 32.
	HotDuplicates int
	// PreloadKeys is the number of completed keys loaded for the replay and
	// mismatch workloads. Default: 10,000.
	PreloadKeys int
	// RemoteLatency is the simulated downstream call of the remote
	// workload, made between the durable claim and the completion and
	// included in its latency. Default: 0 (no call; measures the store).
	RemoteLatency time.Duration
	// Tenants is the number of tenants keys are spread over. Default: 1,000.
	Tenants int

	// ScaleKeys, if set, adds the scale measurement: for each N, a store is
	// bulk-loaded with N completed records (straight into Pebble, flushed
	// and compacted) and the unique workload measured on the first target
	// at ScaleConcurrency. Default: none.
	ScaleKeys []int
	// ScaleConcurrency is the concurrency of the scale points. Default: 64.
	ScaleConcurrency int
	// ScaleRounds is how many times each scale store is measured. Rounds
	// alternate the sizes, and each point runs on a fresh checkpoint of
	// the loaded store, so that every round starts from the same state
	// and the sizes share the machine's slow and fast minutes. Default: 1.
	ScaleRounds int

	// SizingKeys is the number of completed records (status and 32-byte
	// pointer, no body) loaded into a fresh store of each target to measure
	// bytes per key. Default: 20,000. Negative: no sizing run.
	SizingKeys int
	// BodyKeys is the number of records loaded with a BodyBytes body to
	// measure bytes per key with stored responses. Default: 2,000.
	// Negative: not measured.
	BodyKeys int
	// BodyBytes is the size of the stored response body of the body sizing
	// run. Default: 2,048.
	BodyBytes int
	// VerifyKeys is how many of a point's acknowledged keys are checked
	// afterwards to replay their stored result (and, for local effects, to
	// hold their effect). Default: 1,000. Negative: all of them.
	VerifyKeys int
	// FsyncSamples is the number of 4 KiB write + fdatasync pairs timed to
	// measure the disk, half before the sweep and half after it. Default:
	// 200.
	FsyncSamples int

	// Progress, if set, is called after each step of the run.
	Progress func(Progress)
}

// Progress reports how far a run has come.
type Progress struct {
	Done, Total int
	// Step names the step just finished: "unique c=64 engine".
	Step string
}

// Profile returns a standard configuration:
//
//   - "quick": every workload at concurrency 1, 16, 64 and 256 for 0.75 s
//     per point, 5,000 preloaded keys, sizing on 20,000 keys (2,000 with
//     bodies). About a minute on two cores.
//   - "full": every workload at the same points for 10 s each, 200,000
//     preloaded keys, sizing on 1,000,000 keys (50,000 with bodies). About
//     10 to 15 minutes on two cores with a fast disk.
func Profile(name string) (Config, error) {
	switch name {
	case "quick":
		return Config{Profile: name, Duration: 750 * time.Millisecond, PreloadKeys: 5_000,
			SizingKeys: 20_000, BodyKeys: 2_000}, nil
	case "full":
		return Config{Profile: name, Duration: 10 * time.Second, PreloadKeys: 200_000,
			SizingKeys: 1_000_000, BodyKeys: 50_000}, nil
	}
	return Config{}, fmt.Errorf("bench: unknown profile %q (want quick or full)", name)
}

// Profiles lists the names Profile accepts.
func Profiles() []string { return []string{"quick", "full"} }

// ensureDefaults returns a copy of c with defaults filled in.
func (c Config) ensureDefaults() Config {
	if c.Profile == "" {
		c.Profile = "custom"
	}
	if len(c.Workloads) == 0 {
		c.Workloads = Workloads()
	}
	if len(c.Concurrency) == 0 {
		c.Concurrency = []int{1, 16, 64, 256}
	}
	if c.Duration == 0 {
		c.Duration = time.Second
	}
	if c.Dir == "" {
		c.Dir = os.TempDir()
	}
	c.Engine = c.Engine.EnsureDefaults()
	_ = withCompactionNice(c.Engine, c.CompactionNice) // Validate reports a bad value
	if len(c.Targets) == 0 {
		c.Targets = []Target{EngineTarget(c.Engine), BaselineTarget(c.Engine)}
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.HotDuplicates, 32)
	def(&c.PreloadKeys, 10_000)
	def(&c.Tenants, 1_000)
	def(&c.ScaleConcurrency, 64)
	def(&c.ScaleRounds, 1)
	def(&c.SizingKeys, 20_000)
	def(&c.BodyKeys, 2_000)
	def(&c.BodyBytes, 2_048)
	def(&c.VerifyKeys, 1_000)
	def(&c.FsyncSamples, 200)
	if c.RetryFraction == 0 {
		c.RetryFraction = 0.25
	}
	return c
}

// Validate reports a configuration Run cannot use.
func (c Config) Validate() error {
	var errs []error
	if c.CompactionNice < 0 || c.CompactionNice > 19 {
		errs = append(errs, fmt.Errorf("compaction nice %d outside 0..19", c.CompactionNice))
	}
	for _, name := range c.Workloads {
		if workloadByName(name) == nil {
			errs = append(errs, fmt.Errorf("unknown workload %q (have %v)", name, Workloads()))
		}
	}
	for _, n := range c.Concurrency {
		if n < 1 || n > 1<<16 {
			errs = append(errs, fmt.Errorf("concurrency %d outside 1..65536", n))
		}
	}
	if c.Duration < 0 {
		errs = append(errs, fmt.Errorf("negative duration %v", c.Duration))
	}
	if c.RetryFraction < 0 || c.RetryFraction > 1 {
		errs = append(errs, fmt.Errorf("retry fraction %v outside 0..1", c.RetryFraction))
	}
	if c.HotDuplicates < 0 || c.PreloadKeys < 0 || c.Tenants < 0 || c.BodyBytes < 0 || c.FsyncSamples < 0 {
		errs = append(errs, errors.New("negative count"))
	}
	for _, n := range c.ScaleKeys {
		if n <= 0 {
			errs = append(errs, fmt.Errorf("scale of %d keys", n))
		}
	}
	if c.ScaleRounds < 0 {
		errs = append(errs, fmt.Errorf("negative scale rounds %d", c.ScaleRounds))
	}
	if c.ScaleConcurrency < 0 {
		errs = append(errs, fmt.Errorf("negative scale concurrency %d", c.ScaleConcurrency))
	}
	if c.RemoteLatency < 0 {
		errs = append(errs, fmt.Errorf("negative remote latency %v", c.RemoteLatency))
	}
	if len(c.Targets) == 1 {
		errs = append(errs, errors.New("one target: nothing to compare"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("bench: invalid config: %w", err)
	}
	return nil
}

// Run runs the benchmark c describes and returns its report. It fails if a
// store returns an error or breaks the contract (a new key not acquired, a
// wrong replay, a duplicate acquisition, an acknowledged key that does not
// replay afterwards): figures from a store that is wrong are worthless.
func Run(ctx context.Context, c Config) (*Report, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	c = c.ensureDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	start := time.Now()
	dir, err := os.MkdirTemp(c.Dir, "idemkv-bench-")
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	defer os.RemoveAll(dir)

	r := &runner{cfg: &c, dir: dir}
	r.total = len(c.Workloads) * len(c.Concurrency) * len(c.Targets)
	if c.SizingKeys > 0 {
		r.total += len(c.Targets)
	}
	if c.BodyKeys > 0 {
		r.total += len(c.Targets)
	}
	r.total += (1 + c.ScaleRounds) * len(c.ScaleKeys)
	maxConc := slices.Max(c.Concurrency)
	if len(c.ScaleKeys) > 0 {
		maxConc = max(maxConc, c.ScaleConcurrency)
	}
	r.hists = make([]*hdrhistogram.Histogram, maxConc)
	for i := range r.hists {
		r.hists[i] = newHist()
	}

	rep := &Report{Meta: newMeta(&c, start)}
	probe := newFsyncProbe(dir, c.FsyncSamples)
	if err := probe.run(0); err != nil {
		return nil, err
	}
	for _, name := range c.Workloads {
		pts, err := r.workload(ctx, workloadByName(name))
		if err != nil {
			return nil, err
		}
		rep.Points = append(rep.Points, pts...)
	}
	if rep.Sizing, err = r.sizing(ctx, rep.Points); err != nil {
		return nil, err
	}
	if rep.Scale, err = r.scale(ctx); err != nil {
		return nil, err
	}
	if err := probe.run(1); err != nil {
		return nil, err
	}
	rep.Fsync = probe.timing()
	rep.Comparisons = compare(c.Targets, rep.Points)
	rep.Meta.WallSeconds = time.Since(start).Seconds()
	return rep, nil
}

// runner carries a run's state.
type runner struct {
	cfg         *Config
	dir         string
	seq         int // directories made
	done, total int
	hists       []*hdrhistogram.Histogram // one per worker, reused
	streams     uint64                    // key streams handed out
}

func (r *runner) step(name string) {
	r.done++
	if r.cfg.Progress != nil {
		r.cfg.Progress(Progress{Done: r.done, Total: r.total, Step: name})
	}
}

// newStream returns a fresh key stream base: the point's hot keys use it,
// worker w's new keys base+1+w. Bases are 1<<20 apart, so no two points
// share a key (up to a million workers per point).
func (r *runner) newStream() uint64 {
	r.streams++
	return r.streams << 20
}

// opened is a store under test with its sync counter.
type opened struct {
	Store
	fs  *countingFS
	dir string
}

func (r *runner) open(t Target) (*opened, error) {
	r.seq++
	dir := filepath.Join(r.dir, fmt.Sprintf("%03d-%s", r.seq, t.Name))
	fs := newCountingFS(r.cfg.Engine.FS)
	s, err := t.Open(dir, fs)
	if err != nil {
		return nil, fmt.Errorf("bench: open %s: %w", t.Name, err)
	}
	return &opened{Store: s, fs: fs, dir: dir}, nil
}

func (o *opened) close() error {
	err := o.Close()
	if rerr := os.RemoveAll(o.dir); err == nil {
		err = rerr
	}
	return err
}

// workload measures one workload at every concurrency, on every target.
func (r *runner) workload(ctx context.Context, wl *workload) (pts []Point, err error) {
	// Read-only workloads share one preloaded store per target.
	shared := make([]*opened, len(r.cfg.Targets))
	var preStream uint64
	var sharedDisk []Disk
	defer func() {
		for _, o := range shared {
			if o != nil {
				if cerr := o.close(); err == nil {
					err = cerr
				}
			}
		}
	}()
	if wl.readOnly {
		preStream = r.newStream()
		sharedDisk = make([]Disk, len(shared))
		for ti, t := range r.cfg.Targets {
			if shared[ti], err = r.open(t); err != nil {
				return nil, err
			}
			if err := load(ctx, shared[ti], preStream, r.cfg.PreloadKeys, r.cfg.Tenants, nil); err != nil {
				return nil, fmt.Errorf("bench: preload %s: %w", t.Name, err)
			}
			if err := shared[ti].Settle(ctx); err != nil {
				return nil, err
			}
			if sharedDisk[ti], err = shared[ti].Disk(); err != nil {
				return nil, err
			}
		}
	}
	for _, conc := range r.cfg.Concurrency {
		stream := r.newStream()
		for ti, t := range r.cfg.Targets {
			// Goroutines inherit profiler labels from the goroutine that
			// starts them, so a CPU profile (IDEMKV_CPUPROFILE) can be cut
			// by point: go tool pprof -tagfocus point=unique/256/engine.
			// Pebble relabels its flushes, compactions and WAL syncs
			// (label "pebble"); they are not attributed to a point.
			pprof.SetGoroutineLabels(pprof.WithLabels(ctx, pprof.Labels(
				"point", fmt.Sprintf("%s/%d/%s", wl.name, conc, t.Name))))
			o := shared[ti]
			if o == nil {
				if o, err = r.open(t); err != nil {
					return nil, err
				}
			}
			p := &point{cfg: r.cfg, store: o, stream: stream, preStream: preStream}
			if wl.readOnly {
				p.preloaded = uint64(r.cfg.PreloadKeys)
			}
			pt, err := r.measure(ctx, wl, p, o, conc)
			if err == nil && !wl.readOnly {
				err = r.settle(ctx, o, &pt)
			} else if err == nil {
				pt.KeysStored = int64(r.cfg.PreloadKeys)
				setDisk(&pt, sharedDisk[ti])
			}
			if shared[ti] == nil {
				if cerr := o.close(); err == nil {
					err = cerr
				}
			}
			pprof.SetGoroutineLabels(ctx)
			if err != nil {
				return nil, fmt.Errorf("bench: %s at concurrency %d on %s: %w", wl.name, conc, t.Name, err)
			}
			pt.Target = t.Name
			pts = append(pts, pt)
			r.step(fmt.Sprintf("%s c=%d %s", wl.name, conc, t.Name))
		}
	}
	return pts, nil
}

// settle flushes and compacts a written store and records its size.
func (r *runner) settle(ctx context.Context, o *opened, pt *Point) error {
	if err := o.Settle(ctx); err != nil {
		return err
	}
	d, err := o.Disk()
	if err != nil {
		return err
	}
	setDisk(pt, d)
	return nil
}

func setDisk(pt *Point, d Disk) {
	pt.TableBytes = d.TableBytes
	pt.WriteAmp = d.WriteAmp
	if pt.KeysStored > 0 {
		pt.DiskBytesPerKey = float64(d.TableBytes) / float64(pt.KeysStored)
	}
}

// measure runs wl with conc workers for the configured duration, then
// verifies what they were acknowledged.
func (r *runner) measure(ctx context.Context, wl *workload, p *point, o *opened, conc int) (Point, error) {
	if wl.name == Retry {
		p.recent = make([]atomic.Uint64, max(16, 2*conc))
	}
	workers := make([]*worker, conc)
	for i := range workers {
		workers[i] = &worker{p: p, id: uint64(i), rng: rand.New(rand.NewPCG(p.stream, uint64(i)))}
		r.hists[i].Reset()
	}
	var (
		stop     atomic.Bool
		firstErr error
		errOnce  sync.Once
		wg       sync.WaitGroup
		ready    sync.WaitGroup
		startGun = make(chan struct{})
	)
	ready.Add(conc)
	for i, w := range workers {
		h := r.hists[i]
		wg.Go(func() {
			ready.Done()
			<-startGun
			for !stop.Load() {
				t0 := time.Now()
				err := wl.request(ctx, w)
				if err != nil {
					errOnce.Do(func() { firstErr = err })
					stop.Store(true)
					return
				}
				recordLatency(h, time.Since(t0))
			}
		})
	}
	ready.Wait()
	cs, _ := o.Store.(commitStats)
	var c0 engine.Stats
	if cs != nil {
		var err error
		if c0, err = cs.Stats(); err != nil {
			return Point{}, err
		}
	}
	io0, cpu0 := o.fs.Counts(), cpuTime()
	t0 := time.Now()
	close(startGun)
	timer := time.AfterFunc(r.cfg.Duration, func() { stop.Store(true) })
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			stop.Store(true)
		case <-done:
		}
	}()
	wg.Wait()
	elapsed := time.Since(t0)
	cpu1, io1 := cpuTime(), o.fs.Counts()
	timer.Stop()
	close(done)
	if firstErr != nil {
		return Point{}, firstErr
	}
	if err := ctx.Err(); err != nil {
		return Point{}, err
	}

	pt := Point{Workload: wl.name, Concurrency: conc, DurationSeconds: elapsed.Seconds()}
	all := newHist()
	var fresh uint64
	for i, w := range workers {
		all.Merge(r.hists[i])
		pt.Outcomes.add(w.outcomes)
		fresh += w.fresh
	}
	pt.Requests = all.TotalCount()
	if pt.Requests == 0 {
		return Point{}, errors.New("no request finished")
	}
	n := float64(pt.Requests)
	pt.RequestsPerSec = n / elapsed.Seconds()
	pt.Latency = latencyOf(all)
	io := io1.sub(io0)
	pt.Fsyncs, pt.SyncedBatches = io.Syncs, io.WALRecords
	pt.FsyncsPerRequest = float64(io.Syncs) / n
	pt.WALFsyncsPerRequest = float64(io.WALSyncs) / n
	pt.SyncedBatchesPerRequest = float64(io.WALRecords) / n
	pt.WALBytesPerRequest = float64(io.WALBytes) / n
	if cpu1 >= 0 && cpu0 >= 0 {
		pt.CPUSecondsPerRequest = (cpu1 - cpu0).Seconds() / n
	}
	if cs != nil {
		c1, err := cs.Stats()
		if err != nil {
			return Point{}, err
		}
		var d commitDelta
		d.add(c0, c1, elapsed)
		pt.CommitFigures = d.figures()
	}
	if !wl.readOnly {
		pt.KeysStored = int64(pt.Outcomes.Acquired)
	}
	if wl.name == Hot {
		keys := (p.hotSeq.Load() + uint64(r.cfg.HotDuplicates) - 1) / uint64(r.cfg.HotDuplicates)
		if uint64(pt.Outcomes.Acquired) != keys {
			return Point{}, violation("hot: %d acquisitions of %d keys: every key must be acquired exactly once", pt.Outcomes.Acquired, keys)
		}
	}
	v, err := verify(ctx, wl, p, workers)
	if err != nil {
		return Point{}, err
	}
	pt.VerifiedKeys = v
	return pt, nil
}

// commitStats is implemented by stores whose synced writes go through the
// engine's committer.
type commitStats interface {
	Stats() (engine.Stats, error)
}

// verify checks a sample (or all, by Config.VerifyKeys) of the keys the
// point was acknowledged: each must replay its stored result, and a local
// one must hold its effect. It returns how many it checked.
func verify(ctx context.Context, wl *workload, p *point, workers []*worker) (int, error) {
	type req struct {
		s, i  uint64
		local bool
	}
	var reqs []req
	switch wl.name {
	case Unique, Retry, Remote:
		for _, w := range workers {
			for i := range w.fresh {
				reqs = append(reqs, req{w.stream(), i, wl.name != Remote})
			}
		}
	case Hot:
		keys := (p.hotSeq.Load() + uint64(p.cfg.HotDuplicates) - 1) / uint64(p.cfg.HotDuplicates)
		for i := range keys {
			reqs = append(reqs, req{p.stream, i, true})
		}
	case Replay, Mismatch:
		for i := range p.preloaded {
			reqs = append(reqs, req{p.preStream, i, false})
		}
	}
	if n := p.cfg.VerifyKeys; n >= 0 && n < len(reqs) {
		rng := rand.New(rand.NewPCG(p.stream, 0xfeed))
		rng.Shuffle(len(reqs), func(i, j int) { reqs[i], reqs[j] = reqs[j], reqs[i] })
		reqs = reqs[:n]
	}
	for _, q := range reqs {
		id := keyOf(q.s, q.i, p.cfg.Tenants)
		c, err := p.store.Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: fingerprint(q.s, q.i, false)})
		if err != nil {
			return 0, fmt.Errorf("verify %v: %w", id, err)
		}
		if err := checkReplay(c, q.s, q.i); err != nil {
			return 0, fmt.Errorf("verify: %w", err)
		}
		if q.local {
			ek, ev := effectOf(id, q.s, q.i)
			got, err := p.store.GetData(ek)
			if err != nil || string(got) != string(ev) {
				return 0, violation("verify: effect of %v: %x %v, want %x", id, got, err, ev)
			}
		}
	}
	return len(reqs), nil
}

// load stores n completed records of stream s (status, 32-byte pointer and
// body, no effect) with 64 concurrent clients.
func load(ctx context.Context, s Store, stream uint64, n, tenants int, body []byte) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range 64 {
		wg.Go(func() {
			for {
				i := uint64(next.Add(1) - 1)
				if i >= uint64(n) {
					return
				}
				c, err := s.Claim(ctx, idemkv.ClaimRequest{ID: keyOf(stream, i, tenants), Fingerprint: fingerprint(stream, i, false)})
				if err == nil && c.Outcome != idemkv.Acquired {
					err = violation("preload of new key: %v", c.Outcome)
				}
				if err == nil {
					err = s.Complete(ctx, c.Lease, resultOf(stream, i, body), nil)
				}
				if err != nil {
					errs <- err
					next.Store(int64(n))
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// sizing measures bytes per key on fresh stores of each target, and fills
// in the guide's table from the sweep's points.
func (r *runner) sizing(ctx context.Context, pts []Point) (Sizing, error) {
	sz := Sizing{GuideRequestsPerSec: guideRate, RetentionSeconds: r.cfg.Engine.Retention.Seconds(),
		GuideBytesPerKey: guideBytesPerKey, GuideBytesPerKeyWithBody: guideBytesPerKeyWithBody}
	sz.KeysPerDay = int64(guideRate * r.cfg.Engine.Retention.Seconds())
	for _, t := range r.cfg.Targets {
		st := SizingTarget{Target: t.Name}
		if r.cfg.SizingKeys > 0 {
			b, err := r.bytesPerKey(ctx, t, r.cfg.SizingKeys, nil)
			if err != nil {
				return Sizing{}, err
			}
			st.Keys, st.BytesPerKey = r.cfg.SizingKeys, b
			st.StoreBytesPerDay = b * float64(sz.KeysPerDay)
			r.step("sizing " + t.Name)
		}
		if r.cfg.BodyKeys > 0 {
			b, err := r.bytesPerKey(ctx, t, r.cfg.BodyKeys, sizingBody(r.cfg.BodyBytes))
			if err != nil {
				return Sizing{}, err
			}
			st.BodyKeys, st.BodyBytes, st.BytesPerKeyWithBody = r.cfg.BodyKeys, r.cfg.BodyBytes, b
			st.StoreBytesPerDayWithBodies = b * float64(sz.KeysPerDay)
			r.step("sizing with bodies " + t.Name)
		}
		// Headroom and durable writes from the unique sweep.
		for _, p := range pts {
			if p.Target == t.Name && p.Workload == Unique && p.RequestsPerSec > st.PeakUniqueRequestsPerSec {
				st.PeakUniqueRequestsPerSec = p.RequestsPerSec
				st.PeakUniqueConcurrency = p.Concurrency
				st.FsyncsPerRequest = p.FsyncsPerRequest
				st.SyncedBatchesPerRequest = p.SyncedBatchesPerRequest
			}
		}
		st.Headroom = st.PeakUniqueRequestsPerSec / guideRate
		sz.Targets = append(sz.Targets, st)
	}
	return sz, nil
}

// bytesPerKey loads n records with body into a fresh store of t, settles
// it and returns its sstable bytes per record.
func (r *runner) bytesPerKey(ctx context.Context, t Target, n int, body []byte) (float64, error) {
	o, err := r.open(t)
	if err != nil {
		return 0, err
	}
	err = load(ctx, o, r.newStream(), n, r.cfg.Tenants, body)
	if err == nil {
		err = o.Settle(ctx)
	}
	var d Disk
	if err == nil {
		d, err = o.Disk()
	}
	if cerr := o.close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("bench: sizing %s: %w", t.Name, err)
	}
	return float64(d.TableBytes) / float64(n), nil
}

// sizingBody returns an n-byte JSON response body: line items whose ids,
// amounts and descriptions are random digits (about 40% of the bytes) among
// repeated field names, so that it compresses about as well as a real API
// response.
func sizingBody(n int) []byte {
	rng := rand.New(rand.NewPCG(42, 42))
	const head, tail = `{"object":"payment","status":"succeeded","currency":"usd","items":[`, `],"pad":"`
	if n < len(head)+len(tail)+2 {
		return bytes.Repeat([]byte{'x'}, n)
	}
	b := make([]byte, 0, n)
	b = append(b, head...)
	for {
		item := fmt.Sprintf(`{"id":"it_%016x","amount":%d,"description":"item %08x"}`, rng.Uint64(), rng.IntN(100000), rng.Uint32())
		if len(b)+1+len(item)+len(tail)+2 > n {
			break
		}
		if len(b) > len(head) {
			b = append(b, ',')
		}
		b = append(b, item...)
	}
	b = append(b, tail...)
	for len(b) < n-2 {
		b = append(b, 'x')
	}
	return append(b, `"}`...)
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

// Latency histograms record nanoseconds from 1 ns to a minute with three
// significant digits; slower requests are recorded as a minute.
const histMax = int64(time.Minute)

func newHist() *hdrhistogram.Histogram { return hdrhistogram.New(1, histMax, 3) }

func recordLatency(h *hdrhistogram.Histogram, d time.Duration) {
	_ = h.RecordValue(min(max(int64(d), 1), histMax))
}

func latencyOf(h *hdrhistogram.Histogram) Latency {
	us := func(ns int64) float64 { return float64(ns) / 1e3 }
	return Latency{
		P50: us(h.ValueAtQuantile(50)), P99: us(h.ValueAtQuantile(99)), P999: us(h.ValueAtQuantile(99.9)),
		Max: us(h.Max()), Mean: h.Mean() / 1e3,
	}
}

// engineOptions describes the Pebble-relevant engine options for the
// report.
func engineOptions(o *engine.Options, nice int) EngineOptions {
	comp := "custom"
	if o.Compression != nil {
		comp = o.Compression.Name
	}
	return EngineOptions{
		CacheBytes: o.CacheSize, MemTableBytes: o.MemTableSize, BloomBitsPerKey: o.BloomBitsPerKey,
		Compression: comp, CompactionConcurrency: o.CompactionConcurrency, Shards: o.Shards,
		ClaimFilterBitsPerKey: o.ClaimFilterBitsPerKey, CompactionNice: nice,
		L0CompactionThreshold: o.L0CompactionThreshold,
		LeaseSeconds:          o.Lease.Seconds(), RetentionSeconds: o.Retention.Seconds(),
	}
}

func newMeta(c *Config, start time.Time) Meta {
	return Meta{
		Date: start.UTC().Format(time.RFC3339), GoVersion: runtime.Version(), GOOS: runtime.GOOS,
		GOARCH: runtime.GOARCH, CPUModel: cpuModel(), NumCPU: runtime.NumCPU(),
		GOMAXPROCS: runtime.GOMAXPROCS(0), Profile: c.Profile,
		Options: RunOptions{
			Workloads: c.Workloads, Concurrency: c.Concurrency, DurationSeconds: c.Duration.Seconds(),
			RetryFraction: c.RetryFraction, HotDuplicates: c.HotDuplicates, PreloadKeys: c.PreloadKeys,
			RemoteLatencyUS: float64(c.RemoteLatency) / 1e3, Tenants: c.Tenants, SizingKeys: c.SizingKeys,
			BodyKeys: c.BodyKeys, BodyBytes: c.BodyBytes, VerifyKeys: c.VerifyKeys,
			FsyncSamples: c.FsyncSamples, Engine: engineOptions(c.Engine, c.CompactionNice),
		},
	}
}

// fsyncProbe times appends of 4 KiB, each followed by fdatasync, on a file
// in the data directory: the cost of one durable write on this disk. Half
// the samples are taken before the sweep and half after it, so that a disk
// whose speed changes during the run shows it (StartP50US, EndP50US).
type fsyncProbe struct {
	dir  string
	n    int
	all  *hdrhistogram.Histogram
	half [2]*hdrhistogram.Histogram
}

func newFsyncProbe(dir string, n int) *fsyncProbe {
	return &fsyncProbe{dir: dir, n: n, all: newHist(), half: [2]*hdrhistogram.Histogram{newHist(), newHist()}}
}

// run takes the first (half 0) or second (half 1) half of the samples.
func (p *fsyncProbe) run(half int) error {
	n := p.n / 2
	if half == 1 {
		n = p.n - n
	}
	if n <= 0 {
		return nil
	}
	name := filepath.Join(p.dir, "fsync-probe")
	f, err := vfs.Default.Create(name, vfs.WriteCategoryUnspecified)
	if err != nil {
		return fmt.Errorf("bench: fsync probe: %w", err)
	}
	defer os.Remove(name)
	defer f.Close()
	buf := make([]byte, 4096)
	for i := range n {
		buf[0] = byte(i)
		t0 := time.Now()
		if _, err := f.Write(buf); err != nil {
			return fmt.Errorf("bench: fsync probe: %w", err)
		}
		if err := f.SyncData(); err != nil {
			return fmt.Errorf("bench: fsync probe: %w", err)
		}
		d := time.Since(t0)
		recordLatency(p.all, d)
		recordLatency(p.half[half], d)
	}
	return nil
}

func (p *fsyncProbe) timing() FsyncTiming {
	ft := FsyncTiming{Samples: int(p.all.TotalCount()), WriteBytes: 4096}
	if ft.Samples == 0 {
		return ft
	}
	l := latencyOf(p.all)
	ft.P50US, ft.P99US, ft.MaxUS, ft.MeanUS = l.P50, l.P99, l.Max, l.Mean
	ft.StartP50US, ft.EndP50US = latencyOf(p.half[0]).P50, latencyOf(p.half[1]).P50
	return ft
}
