package bench

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
)

// ScalePoint is the unique workload measured on the first target (the
// engine) over a store that already holds LiveKeys completed records.
type ScalePoint struct {
	LiveKeys int `json:"live_keys"`
	// Round counts from 1 (Config.ScaleRounds).
	Round int   `json:"round"`
	Point Point `json:"point"`
	// Relative is this point's requests/s over that of the first store
	// size in the same round.
	Relative float64 `json:"relative"`
	// FilterBuildSeconds is how long after Open the engine's claim filter
	// was first built (engine.Engine.ClaimFilterBuilt); the measurement
	// starts after that. Zero for a target without one.
	FilterBuildSeconds float64 `json:"filter_build_seconds"`
}

// scale measures the unique workload at Config.ScaleConcurrency over
// stores bulk-loaded with each of Config.ScaleKeys live records: every
// store is loaded first, then each round measures every size in turn, on
// a fresh checkpoint of its loaded store (hard links: no copying), so
// that the writes of one round do not grow the store of the next.
func (r *runner) scale(ctx context.Context) ([]ScalePoint, error) {
	if len(r.cfg.ScaleKeys) == 0 {
		return nil, nil
	}
	loaded := make([]string, len(r.cfg.ScaleKeys))
	for i, n := range r.cfg.ScaleKeys {
		r.seq++
		loaded[i] = filepath.Join(r.dir, fmt.Sprintf("%03d-scale-%d", r.seq, n))
		r.step(fmt.Sprintf("scale: loading %d keys", n))
		if err := bulkLoad(ctx, loaded[i], r.cfg.Engine, r.newStream(), n, r.cfg.Tenants); err != nil {
			return nil, fmt.Errorf("bench: scale load of %d keys: %w", n, err)
		}
	}
	var out []ScalePoint
	for round := 1; round <= r.cfg.ScaleRounds; round++ {
		first := len(out)
		for i, n := range r.cfg.ScaleKeys {
			dir := fmt.Sprintf("%s-round-%d", loaded[i], round)
			if err := checkpoint(loaded[i], dir, r.cfg.Engine); err != nil {
				return nil, fmt.Errorf("bench: scale checkpoint of %d keys: %w", n, err)
			}
			sp, err := r.scalePoint(ctx, dir)
			if rerr := os.RemoveAll(dir); err == nil {
				err = rerr
			}
			if err != nil {
				return nil, fmt.Errorf("bench: scale point of %d keys: %w", n, err)
			}
			sp.LiveKeys, sp.Round, sp.Relative = n, round, 1
			if i > 0 && out[first].Point.RequestsPerSec > 0 {
				sp.Relative = sp.Point.RequestsPerSec / out[first].Point.RequestsPerSec
			}
			out = append(out, sp)
			r.step(fmt.Sprintf("scale %d keys, round %d", n, round))
		}
	}
	return out, nil
}

// scalePoint opens the first target on dir, waits for its claim filter if
// it has one, and measures the unique workload.
func (r *runner) scalePoint(ctx context.Context, dir string) (ScalePoint, error) {
	t := r.cfg.Targets[0]
	fs := newCountingFS(r.cfg.Engine.FS)
	s, err := t.Open(dir, fs)
	if err != nil {
		return ScalePoint{}, err
	}
	var built float64
	if f, ok := s.(interface{ ClaimFilterBuilt() <-chan struct{} }); ok {
		start := time.Now()
		select {
		case <-f.ClaimFilterBuilt():
		case <-ctx.Done():
			_ = s.Close()
			return ScalePoint{}, ctx.Err()
		}
		built = time.Since(start).Seconds()
	}
	o := &opened{Store: s, fs: fs, dir: dir}
	p := &point{cfg: r.cfg, store: o, stream: r.newStream()}
	pt, err := r.measure(ctx, workloadByName(Unique), p, o, r.cfg.ScaleConcurrency)
	if cerr := o.close(); err == nil {
		err = cerr
	}
	pt.Target = t.Name
	return ScalePoint{Point: pt, FilterBuildSeconds: built}, err
}

// checkpoint makes dst a checkpoint of the store in src: a consistent copy
// whose sstables are hard links.
func checkpoint(src, dst string, eo *engine.Options) error {
	po := eo.EnsureDefaults().PebbleOptions()
	db, err := pebble.Open(src, po)
	if err != nil {
		return err
	}
	err = db.Checkpoint(dst)
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	return err
}

// bulkLoad writes n completed records of stream into a new store in dir
// through engine.Load (the layout the engine writes: records in their
// expiry buckets), then compacts it, as a store that has lived with n keys
// would be. It skips the engine's claims (and their fsync per request)
// because it only sets the stage: the requests measured afterwards go
// through the engine and are durable as always.
func bulkLoad(ctx context.Context, dir string, eo *engine.Options, stream uint64, n, tenants int) error {
	o := *eo.EnsureDefaults()
	recs := func(yield func(idemkv.Record) bool) {
		for i := range uint64(n) {
			if !yield(idemkv.Record{ID: keyOf(stream, i, tenants), State: idemkv.StateCompleted,
				Fingerprint: fingerprint(stream, i, false), Result: resultOf(stream, i, nil)}) {
				return
			}
		}
	}
	if _, err := engine.Load(ctx, dir, &o, recs); err != nil {
		return err
	}
	o.ClaimFilterBitsPerKey, o.NoBackgroundSweep = -1, true
	e, err := engine.Open(dir, &o)
	if err != nil {
		return err
	}
	err = e.Compact(ctx)
	if cerr := e.Close(); err == nil {
		err = cerr
	}
	return err
}

func (r *Report) writeScale(b *strings.Builder) {
	if len(r.Scale) == 0 {
		return
	}
	fmt.Fprintf(b, "\nScale: unique on %s at concurrency %d over stores of N live keys:\n",
		r.Scale[0].Point.Target, r.Scale[0].Point.Concurrency)
	rounds := 0
	for _, s := range r.Scale {
		rounds = max(rounds, s.Round)
		round := ""
		if s.Round > 1 || r.Scale[len(r.Scale)-1].Round > 1 {
			round = fmt.Sprintf("round %d  ", s.Round)
		}
		fmt.Fprintf(b, "  %s%14s live keys  %10s req/s  p50 %9s  p99 %9s  %.2f x the first\n",
			round, count(float64(s.LiveKeys)), count(s.Point.RequestsPerSec),
			us(s.Point.Latency.P50), us(s.Point.Latency.P99), s.Relative)
	}
	if rounds < 2 {
		return
	}
	for _, n := range uniqueSizes(r.Scale) {
		var logs []float64
		for _, s := range r.Scale {
			if s.LiveKeys == n && s.Relative > 0 {
				logs = append(logs, math.Log(s.Relative))
			}
		}
		fmt.Fprintf(b, "  %14s live keys: %.2f x the first, geometric mean of %d rounds\n",
			count(float64(n)), math.Exp(mean(logs)), len(logs))
	}
}

// uniqueSizes returns the store sizes of points, in their first order.
func uniqueSizes(points []ScalePoint) []int {
	var out []int
	for _, s := range points {
		if !slices.Contains(out, s.LiveKeys) {
			out = append(out, s.LiveKeys)
		}
	}
	return out
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	var sum float64
	for _, x := range xs {
		sum += x
	}
	return sum / float64(len(xs))
}
