package day

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/idemkv/idemkv/bench"
	"github.com/idemkv/idemkv/engine"
)

// dayStart is the day's end as the stores see it when the run begins:
// half the open-loop phase before an hour, so that the oldest bucket ends,
// and the sweeper drops it, halfway through the phase.
func dayStart(o *Options) time.Time {
	return time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC).Add(-o.Duration / 2)
}

// markerFile, in a kept store's directory, says what was loaded into it.
const markerFile = "idemkv-day.json"

type marker struct {
	Records int64     `json:"records"`      // the records loaded
	Now     time.Time `json:"now"`          // the day's end they were loaded for
	Seconds float64   `json:"load_seconds"` // the load's wall time
	// Runs counts the runs that sent traffic to the store: each run's
	// new keys come from streams of its own, or a later run's "new" keys
	// would be an earlier run's, stored and replayed.
	Runs int `json:"runs,omitempty"`
	// Clock is the store's time when the last run ended.
	Clock time.Time `json:"clock,omitzero"`
}

// Run measures a day: it builds (or reuses) the large store and builds
// the small one, measures a restart, Check, Backup and the size of the
// large one, then the open-loop phase on each and the closed-loop points,
// alternating stores.
func Run(ctx context.Context, opts *Options) (*Report, error) {
	o := opts.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	run, err := bench.Start(&o.Options, "bench day", 4+2*len(o.Clients)*o.Rounds)
	if err != nil {
		return nil, err
	}
	defer run.Close()
	logf := func(format string, args ...any) {
		if o.Log != nil {
			o.Log(fmt.Sprintf(format, args...))
		}
	}
	rep := &Report{Options: reportOptions(o)}
	large := &store{name: "large", records: o.Records, dir: o.Store}
	if large.dir == "" {
		large.dir = run.Dir("large")
	}
	if rep.Disk, err = fitDisk(o, large.dir); err != nil {
		return nil, err
	}
	if rep.Disk.Records != o.Records {
		logf("the disk holds %d GB, and %d records need about %d GB: running %d records",
			rep.Disk.AvailBytes>>30, o.Records, rep.Disk.NeedBytes>>30, rep.Disk.Records)
		large.records = rep.Disk.Records
		rep.Options.Records = large.records
	}
	small := &store{name: "small", records: o.Small, dir: run.Dir("small")}
	for _, s := range []*store{large, small} {
		if err := s.build(ctx, o, logf); err != nil {
			return nil, err
		}
		run.Step("load " + s.name)
	}
	rep.Load = large.load
	// The measured phases run under the memory limit asked for; the loads
	// did not (Options.MemoryLimit).
	defer applyMemoryLimit(o.MemoryLimit)()
	rep.Options.MemoryLimit = memoryLimit()
	// What the loads left on the heap is the harness's, not the store's:
	// give it back before memory is measured.
	debug.FreeOSMemory()
	base, err := large.startRun()
	if err != nil {
		return nil, err
	}
	res, err := large.phase(ctx, o, phaseRequest{Kind: phaseRestart, Backup: run.Dir("backup")}, logf)
	if err != nil {
		return nil, err
	}
	rep.Restart = *res.Restart
	run.Step("restart, check and backup")
	for i, s := range []*store{small, large} {
		logf("open loop on the %s store: %v at %.0f requests/s", s.name, o.Duration, o.Rate)
		res, err := s.phase(ctx, o, phaseRequest{Kind: phaseOpen, Stream: base + uint64(100+i)}, logf)
		if err != nil {
			return nil, fmt.Errorf("open loop, %s store: %w", s.name, err)
		}
		if s == large {
			rep.Large = res.Phase
		} else {
			rep.Small = res.Phase
		}
		run.Step("open loop " + s.name)
	}
	stream := base + 1000
	for round := range o.Rounds {
		for _, c := range o.Clients {
			for _, s := range []*store{small, large} {
				stream++
				res, err := s.phase(ctx, o, phaseRequest{Kind: phaseClosed, Clients: c, Stream: stream}, logf)
				if err != nil {
					return nil, fmt.Errorf("closed loop, %s store, %d clients: %w", s.name, c, err)
				}
				rep.addPoint(s.name, c, round, res.Rate)
				logf("closed loop, round %d, %d clients, %s store: %.0f requests/s", round+1, c, s.name, res.Rate)
				run.Step(fmt.Sprintf("closed loop %d %s", c, s.name))
			}
		}
	}
	rep.Meta = run.Meta()
	return rep, nil
}

// diskPerRecord is what a day's record is reckoned to take on disk while
// it is loaded and run, with room: 57 B measured at rest, the WAL, the
// memtables flushed during the run and compactions' transient copies.
const diskPerRecord = 100

// minRecords is the fewest records a run reduced to fit the disk may
// hold: below that it would say too little about the guide's size.
const minRecords = 200_000_000

// fitDisk checks that the disk under dir holds both stores, or reduces
// the large one to what fits (never below minRecords) and says so.
func fitDisk(o *Options, dir string) (DiskFit, error) {
	fit := DiskFit{Asked: o.Records, Records: o.Records}
	if b, err := os.ReadFile(filepath.Join(dir, markerFile)); err == nil && len(b) > 0 {
		return fit, nil // a store an earlier run left: it fits already
	}
	parent := dir
	for {
		if _, err := os.Stat(parent); err == nil || parent == filepath.Dir(parent) {
			break
		}
		parent = filepath.Dir(parent)
	}
	u, err := vfs.Default.GetDiskUsage(parent)
	if err != nil {
		return fit, nil // cannot tell: try
	}
	fit.AvailBytes = u.AvailBytes
	fit.NeedBytes = uint64(o.Records+o.Small) * diskPerRecord
	if fit.NeedBytes <= fit.AvailBytes {
		return fit, nil
	}
	fit.Records = int64(fit.AvailBytes/diskPerRecord) - o.Small
	if fit.Records < min(minRecords, o.Records) {
		return fit, fmt.Errorf("the disk under %s has %d GB free, and the run needs about %d GB (%d B a record)",
			parent, fit.AvailBytes>>30, fit.NeedBytes>>30, diskPerRecord)
	}
	return fit, nil
}

// store is one of the run's two stores.
type store struct {
	name    string
	records int64
	dir     string
	clock   runClock
	load    LoadFigures
	marker  marker // what the store's marker file says (the large store)
}

// streamsPerRun spaces the traffic streams of the runs on one kept store.
const streamsPerRun = 10_000

// startRun counts a run of traffic in the store's marker file, before the
// run sends any, and returns the first of the run's streams.
func (s *store) startRun() (uint64, error) {
	first := uint64(s.marker.Runs) * streamsPerRun
	s.marker.Runs++
	b, _ := json.Marshal(s.marker)
	return first, os.WriteFile(filepath.Join(s.dir, markerFile), b, 0o644)
}

// endRun keeps the store's time in its marker file, for the next run (a
// store without one, the small store, keeps nothing).
func (s *store) endRun() error {
	if s.marker.Records == 0 {
		return nil
	}
	s.marker.Clock = s.clock.Now()
	b, _ := json.Marshal(s.marker)
	return os.WriteFile(filepath.Join(s.dir, markerFile), b, 0o644)
}

func (s *store) engineOptions(o *Options) *engine.Options {
	var e engine.Options
	if o.Engine != nil {
		e = *o.Engine
	}
	e.Clock = &s.clock
	e.Retention = 24 * time.Hour
	e.Sweep.Interval = o.SweepInterval
	return &e
}

// build loads the store, or finds the one a previous run left.
func (s *store) build(ctx context.Context, o *Options, logf func(string, ...any)) error {
	now := dayStart(o)
	s.clock.base = now
	if b, err := os.ReadFile(filepath.Join(s.dir, markerFile)); err == nil {
		var m marker
		if err := json.Unmarshal(b, &m); err == nil && m.Records == s.records && m.Now.Equal(now) {
			logf("using the %s store of %d records in %s (%d runs of traffic before)", s.name, s.records, s.dir, m.Runs)
			s.marker = m
			if m.Clock.After(now) {
				s.clock.base = m.Clock
			}
			s.load = LoadFigures{Records: m.Records, Seconds: m.Seconds, PerSecond: float64(m.Records) / m.Seconds, Reused: true}
			return nil
		}
		return fmt.Errorf("%s holds another run's store: remove it first", s.dir)
	}
	logf("loading %d records into the %s store (%s)", s.records, s.name, s.dir)
	shape := shape{Records: s.records, Now: now, Retention: 24 * time.Hour, Tenants: o.Tenants, Unsettled: 0.0001, Seed: 1}
	start := time.Now()
	last := start
	_, err := engine.Load(ctx, s.dir, s.engineOptions(o), Records(shape), &engine.LoadOptions{Records: s.records,
		Progress: func(n int) {
			if time.Since(last) >= 30*time.Second {
				last = time.Now()
				el := time.Since(start)
				logf("  %d of %d records, %.0f a second, %v", n, s.records, float64(n)/el.Seconds(), el.Round(time.Second))
			}
		}})
	if err != nil {
		return err
	}
	secs := time.Since(start).Seconds()
	s.load = LoadFigures{Records: s.records, Seconds: secs, PerSecond: float64(s.records) / secs, RSSPeak: peakRSS()}
	s.marker = marker{Records: s.records, Now: now, Seconds: secs}
	b, _ := json.Marshal(s.marker)
	return os.WriteFile(filepath.Join(s.dir, markerFile), b, 0o644)
}

// restart measures an Open (to the claim filter in use), Check, Backup and
// a Close, and with ScanRestart an Open that must scan.
func (s *store) restart(ctx context.Context, o *Options, backup string, logf func(string, ...any)) (RestartFigures, error) {
	var f RestartFigures
	logf("restart of the %s store", s.name)
	start := time.Now()
	e, err := engine.Open(s.dir, s.engineOptions(o))
	if err != nil {
		return f, err
	}
	defer func() {
		if e != nil {
			_ = e.Close()
		}
	}()
	<-e.ClaimFilterBuilt()
	f.OpenSeconds = time.Since(start).Seconds()
	st, err := e.Stats()
	if err != nil {
		return f, err
	}
	f.SavedFilter = st.ClaimFilterSaved
	f.TableBytes, f.DiskBytes = st.TableBytes, st.DiskBytes
	f.BytesPerRecord = float64(st.TableBytes) / float64(s.records)
	f.Memory = memory(o, st)
	logf("check of the %s store", s.name)
	start = time.Now()
	cr, err := e.Check(ctx)
	if err != nil {
		return f, err
	}
	if cr.ProblemCount > 0 {
		return f, fmt.Errorf("%w: check found %d problems: %v", bench.ErrViolation, cr.ProblemCount, cr.Problems)
	}
	f.CheckSeconds, f.CheckRecords = time.Since(start).Seconds(), cr.Records
	start = time.Now()
	if err := e.Backup(ctx, backup); err != nil {
		return f, err
	}
	f.BackupSeconds = time.Since(start).Seconds()
	_ = os.RemoveAll(backup)
	start = time.Now()
	err = e.Close()
	e = nil
	if err != nil {
		return f, err
	}
	f.CloseSeconds = time.Since(start).Seconds()
	if o.ScanRestart {
		logf("restart of the %s store without its saved claim filter", s.name)
		if err := os.Remove(filepath.Join(s.dir, "idemkv-claimfilter")); err != nil {
			return f, err
		}
		start = time.Now()
		if e, err = engine.Open(s.dir, s.engineOptions(o)); err != nil {
			return f, err
		}
		<-e.ClaimFilterBuilt()
		f.ScanOpenSeconds = time.Since(start).Seconds()
	}
	return f, nil
}

// openLoop runs the open-loop phase on the store, its clock running.
func (s *store) openLoop(ctx context.Context, o *Options, stream uint64) (*Phase, error) {
	e, err := engine.Open(s.dir, s.engineOptions(o))
	if err != nil {
		return nil, err
	}
	defer e.Close()
	<-e.ClaimFilterBuilt()
	before, err := e.Stats()
	if err != nil {
		return nil, err
	}
	s.clock.run()
	defer s.clock.stop()
	q := &requester{e: e, stream: stream, tenants: o.Tenants}
	gcBefore := readGC()
	points, lat, err := q.openLoop(ctx, o, o.Duration)
	if err != nil {
		return nil, err
	}
	gc := readGC().since(gcBefore)
	after, err := e.Stats()
	if err != nil {
		return nil, err
	}
	ph := &Phase{Records: s.records, Windows: points, Latency: lat, Memory: memory(o, after), GC: gc}
	ph.RecordsAfter = after.Completed - before.Completed
	if flushed := after.TableBytesFlush - before.TableBytesFlush; flushed > 0 {
		ph.WriteAmp = float64(after.TableBytesWritten-before.TableBytesWritten) / float64(flushed)
	}
	ph.Sweep = SweepFigures{Passes: after.Sweep.Passes - before.Sweep.Passes, Deleted: after.Sweep.Deleted - before.Sweep.Deleted}
	if p := after.Sweep.Last; !p.Ended.IsZero() {
		ph.Sweep.LastPassSeconds, ph.Sweep.LastPassDeleted = p.Ended.Sub(p.Started).Seconds(), p.Deleted
	}
	// One more pass, now that the clock is past the bucket that ended
	// halfway: whatever the background passes left of it, this one drops.
	start := time.Now()
	pass, err := e.Sweep(ctx)
	if err != nil {
		return nil, err
	}
	ph.Sweep.FinalPassSeconds, ph.Sweep.FinalPassDeleted = time.Since(start).Seconds(), pass.Deleted
	ph.BytesPerRecord = float64(after.TableBytes) / float64(s.records)
	return ph, nil
}

// closedLoop measures the highest rate clients reach on the store.
func (s *store) closedLoop(ctx context.Context, o *Options, clients int, stream uint64) (float64, error) {
	e, err := engine.Open(s.dir, s.engineOptions(o))
	if err != nil {
		return 0, err
	}
	defer e.Close()
	<-e.ClaimFilterBuilt()
	s.clock.run()
	defer s.clock.stop()
	q := &requester{e: e, stream: stream, tenants: o.Tenants}
	return q.closedLoop(ctx, clients, o.Point)
}

// memory is the process's memory by component, as of now.
func memory(o *Options, st engine.Stats) Memory {
	// One read, so that the heap's figures are of the same moment. Objects
	// and unused together are MemStats.HeapInuse.
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/memory/classes/heap/unused:bytes"},
		{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	eo := (&engine.Options{}).EnsureDefaults()
	if o.Engine != nil {
		eo = o.Engine.EnsureDefaults()
	}
	bits := int64(eo.ClaimFilterBitsPerKey)
	return Memory{RSS: rss(), GoHeap: uint64Sample(s[0]) + uint64Sample(s[1]), GoHeapLive: uint64Sample(s[2]),
		ClaimFilter: uint64(st.ClaimFilterKeys * max(0, bits) / 8), BlockCache: uint64(eo.CacheSize),
		MemTables: st.MemTableBytes, ReplayCache: uint64(max(0, eo.ReplayCacheSize))}
}

// applyMemoryLimit sets the Go memory limit as Options.MemoryLimit says
// and returns what puts back the one it found.
func applyMemoryLimit(limit int64) (restore func()) {
	if limit == 0 {
		return func() {}
	}
	if limit < 0 {
		limit = math.MaxInt64 // none
	}
	prev := debug.SetMemoryLimit(limit)
	return func() { debug.SetMemoryLimit(prev) }
}

// memoryLimit is the Go memory limit in effect, 0 if there is none.
func memoryLimit() int64 {
	if l := debug.SetMemoryLimit(-1); l != math.MaxInt64 {
		return l
	}
	return 0
}

// gcSample is the collector's counters at one moment, from runtime/metrics.
type gcSample struct {
	gc, idleMark, total, idle float64 // CPU seconds: /cpu/classes/...
	cycles                    uint64
}

func readGC() gcSample {
	s := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}, {Name: "/cpu/classes/gc/mark/idle:cpu-seconds"},
		{Name: "/cpu/classes/total:cpu-seconds"}, {Name: "/cpu/classes/idle:cpu-seconds"}, {Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(s)
	return gcSample{gc: float64Sample(s[0]), idleMark: float64Sample(s[1]), total: float64Sample(s[2]),
		idle: float64Sample(s[3]), cycles: uint64Sample(s[4])}
}

// since is the collector's work from b to a.
func (a gcSample) since(b gcSample) GCFigures {
	f := GCFigures{Cycles: a.cycles - b.cycles, CPUSeconds: a.gc - b.gc, IdleMarkCPUSeconds: a.idleMark - b.idleMark,
		BusyCPUSeconds: (a.total - a.idle) - (b.total - b.idle), AvailableCPUSeconds: a.total - b.total}
	if f.BusyCPUSeconds > 0 {
		f.Share = f.CPUSeconds / f.BusyCPUSeconds
	}
	if f.AvailableCPUSeconds > 0 {
		f.AvailableShare = f.CPUSeconds / f.AvailableCPUSeconds
	}
	return f
}

// uint64Sample and float64Sample are a sample's value, 0 if this Go does
// not have the metric.
func uint64Sample(s metrics.Sample) uint64 {
	if s.Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s.Value.Uint64()
}

func float64Sample(s metrics.Sample) float64 {
	if s.Value.Kind() != metrics.KindFloat64 {
		return 0
	}
	return s.Value.Float64()
}

// rss and peakRSS read the process's resident memory, now and at its
// peak, from /proc (0 where there is none).
func rss() uint64     { return procStatus("VmRSS:") }
func peakRSS() uint64 { return procStatus("VmHWM:") }

func procStatus(field string) uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field); ok {
			kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err == nil {
				return kb << 10
			}
		}
	}
	return 0
}
