package workloads

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkv/idemkv/bench"
	"github.com/idemkv/idemkv/engine"
)

// Run runs the workloads o describes (nil: defaults) and returns the
// report. It fails if a store returns an error or breaks the contract (a
// new key not acquired, a wrong replay, a duplicate acquisition, an
// acknowledged key that does not replay afterwards): figures from a store
// that is wrong are worthless.
func Run(ctx context.Context, opts *Options) (*Report, error) {
	o := opts.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	run, err := bench.Start(&o.Options, "bench", o.steps())
	if err != nil {
		return nil, err
	}
	defer run.Close()
	maxConc := slices.Max(o.Concurrency)
	if len(o.ScaleKeys) > 0 {
		maxConc = max(maxConc, o.ScaleConcurrency)
	}
	r := &runner{o: o, run: run, hists: make([]*bench.Histogram, maxConc)}
	for i := range r.hists {
		r.hists[i] = bench.NewHistogram()
	}

	rep := &Report{}
	probe := newFsyncProbe(run.Dir("fsync-probe"), o.FsyncSamples)
	if err := probe.run(0); err != nil {
		return nil, err
	}
	for _, name := range o.Workloads {
		pts, err := r.sweep(ctx, workloadByName(name))
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
	rep.Comparisons = compare(o.Targets, rep.Points)
	rep.Meta = Meta{Meta: run.Meta(), Options: o.describe()}
	return rep, nil
}

// runner carries a run's state.
type runner struct {
	o       *Options
	run     *bench.Run
	hists   []*bench.Histogram // one per worker, reused
	streams uint64             // key streams handed out
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
	// disk is the store's size when last settled.
	disk disk
}

// open opens t on dir with a sync counter.
func (r *runner) open(t Target, dir string) (*opened, error) {
	fs := newCountingFS(r.o.Engine.FS)
	s, err := t.Open(dir, fs)
	if err != nil {
		return nil, fmt.Errorf("bench: open %s: %w", t.Name, err)
	}
	return &opened{Store: s, fs: fs, dir: dir}, nil
}

// seeded opens a fresh store of t seeded (Target.Seed) with n completed
// records of stream, each with body, flushed and compacted.
func (r *runner) seeded(ctx context.Context, t Target, stream uint64, n int, body []byte) (*opened, error) {
	dir := r.run.Dir(t.Name)
	if err := t.Seed(ctx, dir, stream, n, r.o.Tenants, body); err != nil {
		return nil, errors.Join(fmt.Errorf("bench: seed %s: %w", t.Name, err), os.RemoveAll(dir))
	}
	o, err := r.open(t, dir)
	if err != nil {
		return nil, errors.Join(err, os.RemoveAll(dir))
	}
	if o.disk, err = o.Settle(ctx); err != nil {
		return nil, errors.Join(err, o.close())
	}
	return o, nil
}

func (o *opened) close() error {
	err := o.Close()
	if rerr := os.RemoveAll(o.dir); err == nil {
		err = rerr
	}
	return err
}

// sweep measures one workload at every concurrency, on every target.
func (r *runner) sweep(ctx context.Context, wl *workload) (pts []Point, err error) {
	// Read-only workloads share one preloaded store per target.
	var shared []*opened
	var preStream uint64
	defer func() {
		for _, o := range shared {
			if cerr := o.close(); err == nil {
				err = cerr
			}
		}
	}()
	if wl.readOnly {
		preStream = r.newStream()
		for _, t := range r.o.Targets {
			o, err := r.seeded(ctx, t, preStream, r.o.PreloadKeys, nil)
			if err != nil {
				return nil, fmt.Errorf("bench: preload %s: %w", t.Name, err)
			}
			shared = append(shared, o)
		}
	}
	for _, conc := range r.o.Concurrency {
		stream := r.newStream()
		for ti, t := range r.o.Targets {
			p := &point{o: r.o, stream: stream, preStream: preStream}
			var o *opened
			if wl.readOnly {
				o, p.preloaded = shared[ti], uint64(r.o.PreloadKeys)
			}
			pt, err := r.point(ctx, wl, t, o, p, conc)
			if err != nil {
				return nil, fmt.Errorf("bench: %s at concurrency %d on %s: %w", wl.name, conc, t.Name, err)
			}
			pts = append(pts, pt)
			r.run.Step(fmt.Sprintf("%s c=%d %s", wl.name, conc, t.Name))
		}
	}
	return pts, nil
}

// point measures wl at concurrency conc on t: on shared, a preloaded
// store, or else on a fresh store that it settles and closes afterwards.
func (r *runner) point(ctx context.Context, wl *workload, t Target, shared *opened, p *point, conc int) (pt Point, err error) {
	o := shared
	if o == nil {
		if o, err = r.open(t, r.run.Dir(t.Name)); err != nil {
			return Point{}, err
		}
		defer func() {
			if cerr := o.close(); err == nil {
				err = cerr
			}
		}()
	}
	p.store = o
	// Goroutines inherit profiler labels from the goroutine that starts
	// them, so a CPU profile (IDEMKV_CPUPROFILE) can be cut by point: go
	// tool pprof -tagfocus point=unique/256/engine. Pebble relabels its
	// flushes, compactions and WAL syncs (label "pebble"); they are not
	// attributed to a point.
	pprof.SetGoroutineLabels(pprof.WithLabels(ctx, pprof.Labels("point", fmt.Sprintf("%s/%d/%s", wl.name, conc, t.Name))))
	defer pprof.SetGoroutineLabels(ctx)
	if pt, err = r.measure(ctx, wl, p, o, conc); err != nil {
		return Point{}, err
	}
	pt.Target = t.Name
	if t.External {
		pt.External = true
		pt.FsyncsPerRequest, pt.WALFsyncsPerRequest, pt.SyncedBatchesPerRequest, pt.WALBytesPerRequest = 0, 0, 0, 0
		pt.Fsyncs, pt.SyncedBatches, pt.CPUSecondsPerRequest = 0, 0, 0
	}
	if shared == nil {
		o.disk, err = o.Settle(ctx)
		pt.WriteAmp = o.disk.WriteAmp
	} else {
		// A seeded store's write amplification is its seeding's, and
		// Pebble counts it only from Open: not the point's.
		pt.KeysStored = int64(p.preloaded)
	}
	pt.TableBytes = o.disk.TableBytes
	if pt.KeysStored > 0 {
		pt.DiskBytesPerKey = float64(o.disk.TableBytes) / float64(pt.KeysStored)
	}
	return pt, err
}

// measure runs wl with conc workers for the configured duration, then
// verifies what they were acknowledged.
func (r *runner) measure(ctx context.Context, wl *workload, p *point, o *opened, conc int) (Point, error) {
	if wl.name == retry {
		p.recent = make([]atomic.Uint64, max(16, 2*conc))
	}
	workers := make([]*worker, conc)
	for i := range workers {
		r.hists[i].Reset()
		workers[i] = &worker{p: p, id: uint64(i), rng: rand.New(rand.NewPCG(p.stream, uint64(i))), hist: r.hists[i]}
	}
	s0, s1, elapsed, err := r.drive(ctx, wl, o, workers)
	if err != nil {
		return Point{}, err
	}
	pt := Point{Workload: wl.name, Concurrency: conc}
	if err := pt.fill(workers, s0, s1, elapsed); err != nil {
		return Point{}, err
	}
	if !wl.readOnly {
		pt.KeysStored = pt.Outcomes.Acquired
	}
	if wl.name == hot && uint64(pt.Outcomes.Acquired) != p.hotKeys() {
		return Point{}, bench.Violation("hot: %d acquisitions of %d keys: every key must be acquired exactly once", pt.Outcomes.Acquired, p.hotKeys())
	}
	if pt.VerifiedKeys, err = verify(ctx, wl, p, workers); err != nil {
		return Point{}, err
	}
	return pt, nil
}

// sample is what a point reads of its store and the process before and
// after it runs.
type sample struct {
	io    ioCounts
	cpu   time.Duration
	stats *engine.Stats // nil for a store without the engine's committer
}

func (o *opened) sample() (sample, error) {
	s := sample{io: o.fs.Counts(), cpu: bench.CPUTime()}
	if cs, ok := o.Store.(interface{ Stats() (engine.Stats, error) }); ok {
		st, err := cs.Stats()
		if err != nil {
			return sample{}, err
		}
		s.stats = &st
	}
	return s, nil
}

// drive runs wl on workers, every one started at once, until the
// configured duration has passed. It returns the samples taken just
// before the start and just after the last request, and the time from the
// start until the last worker finished its last request.
func (r *runner) drive(ctx context.Context, wl *workload, o *opened, workers []*worker) (s0, s1 sample, elapsed time.Duration, err error) {
	var (
		stop     atomic.Bool
		firstErr error
		errOnce  sync.Once
		wg       sync.WaitGroup
		ready    sync.WaitGroup
		startGun = make(chan struct{})
	)
	ready.Add(len(workers))
	for _, w := range workers {
		wg.Go(func() {
			ready.Done()
			<-startGun
			for !stop.Load() {
				t0 := time.Now()
				if err := wl.request(ctx, w); err != nil {
					errOnce.Do(func() { firstErr = err })
					stop.Store(true)
					return
				}
				w.hist.Record(time.Since(t0))
			}
		})
	}
	ready.Wait()
	s0, err = o.sample()
	if err != nil {
		stop.Store(true)
	}
	t0 := time.Now()
	close(startGun)
	timer := time.AfterFunc(r.o.Duration, func() { stop.Store(true) })
	defer timer.Stop()
	unwatch := context.AfterFunc(ctx, func() { stop.Store(true) })
	defer unwatch()
	wg.Wait()
	elapsed = time.Since(t0)
	if err == nil {
		s1, err = o.sample()
	}
	if err == nil {
		err = firstErr
	}
	if err == nil {
		err = ctx.Err()
	}
	return s0, s1, elapsed, err
}

// fill sets the point's figures from its workers and the samples taken
// around their run of elapsed.
func (pt *Point) fill(workers []*worker, s0, s1 sample, elapsed time.Duration) error {
	pt.DurationSeconds = elapsed.Seconds()
	all := bench.NewHistogram()
	for _, w := range workers {
		all.Merge(w.hist)
		pt.Outcomes.add(w.outcomes)
	}
	pt.Requests = all.Count()
	if pt.Requests == 0 {
		return errors.New("no request finished")
	}
	n := float64(pt.Requests)
	pt.RequestsPerSec = n / elapsed.Seconds()
	pt.Latency = all.Latency()
	io := s1.io.sub(s0.io)
	pt.Fsyncs, pt.SyncedBatches = io.Syncs, io.WALRecords
	pt.FsyncsPerRequest = float64(io.Syncs) / n
	pt.WALFsyncsPerRequest = float64(io.WALSyncs) / n
	pt.SyncedBatchesPerRequest = float64(io.WALRecords) / n
	pt.WALBytesPerRequest = float64(io.WALBytes) / n
	if s0.cpu >= 0 && s1.cpu >= 0 {
		pt.CPUSecondsPerRequest = (s1.cpu - s0.cpu).Seconds() / n
	}
	if s0.stats != nil && s1.stats != nil {
		var d bench.CommitDelta
		d.Add(*s0.stats, *s1.stats, elapsed)
		pt.CommitFigures = d.Figures()
	}
	return nil
}

// verify checks a sample (or all, by Options.VerifyKeys) of the keys the
// point was acknowledged: each must replay its stored result, and a local
// one must hold its effect. It returns how many it checked.
func verify(ctx context.Context, wl *workload, p *point, workers []*worker) (int, error) {
	type req struct {
		s, i  uint64
		local bool
	}
	var reqs []req
	switch wl.name {
	case unique, retry, remote:
		for _, w := range workers {
			for i := range w.fresh {
				reqs = append(reqs, req{w.stream(), i, wl.name != remote})
			}
		}
	case hot:
		for i := range p.hotKeys() {
			reqs = append(reqs, req{p.stream, i, true})
		}
	case replay, mismatch:
		for i := range p.preloaded {
			reqs = append(reqs, req{p.preStream, i, false})
		}
	}
	if n := p.o.VerifyKeys; n >= 0 && n < len(reqs) {
		rng := rand.New(rand.NewPCG(p.stream, 0xfeed))
		rng.Shuffle(len(reqs), func(i, j int) { reqs[i], reqs[j] = reqs[j], reqs[i] })
		reqs = reqs[:n]
	}
	for _, q := range reqs {
		c, err := p.claim(ctx, q.s, q.i, false)
		if err != nil {
			return 0, fmt.Errorf("verify %v: %w", bench.Key(q.s, q.i, p.o.Tenants), err)
		}
		if err := checkReplay(c, q.s, q.i); err != nil {
			return 0, fmt.Errorf("verify: %w", err)
		}
		if q.local {
			id := bench.Key(q.s, q.i, p.o.Tenants)
			ek, ev := bench.Effect(id, q.s, q.i)
			if got, err := p.store.GetData(ctx, ek); err != nil || string(got) != string(ev) {
				return 0, bench.Violation("verify: effect of %v: %x %v, want %x", id, got, err, ev)
			}
		}
	}
	return len(reqs), nil
}
