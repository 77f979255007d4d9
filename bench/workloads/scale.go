package workloads

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv/bench"
	"github.com/idemkv/idemkv/engine"
)

// ScalePoint is the unique workload measured on the first target (the
// engine) over a store that already holds LiveKeys completed records.
type ScalePoint struct {
	// LiveKeys is the number of completed records bulk-loaded into the
	// store before the point.
	LiveKeys int   `json:"live_keys"`
	Round    int   `json:"round"` // the round of Options.ScaleRounds that measured it, from 1
	Point    Point `json:"point"` // the unique point measured over it
	// Relative is this point's requests/s over that of the first store
	// size in the same round.
	Relative float64 `json:"relative"`
	// FilterBuildSeconds is how long after Open the engine's claim filter
	// was first built (engine.Engine.ClaimFilterBuilt); the measurement
	// starts after that. Zero for a target without one.
	FilterBuildSeconds float64 `json:"filter_build_seconds"`
}

// scale measures the unique workload at Options.ScaleConcurrency over
// stores of the first target seeded with each of Options.ScaleKeys live
// records, then flushed and compacted, as a store that has lived with
// them would be: every store is loaded first, then each round measures
// every size in turn, on a fresh checkpoint of its loaded store (hard
// links: no copying), so that the writes of one round do not grow the
// store of the next.
func (r *runner) scale(ctx context.Context) ([]ScalePoint, error) {
	loaded := make([]string, len(r.o.ScaleKeys))
	for i, n := range r.o.ScaleKeys {
		r.run.Step(fmt.Sprintf("scale: loading %d keys", n))
		o, err := r.seeded(ctx, r.o.Targets[0], r.newStream(), n, nil)
		if err == nil {
			loaded[i], err = o.dir, o.Close() // the store stays on disk
		}
		if err != nil {
			return nil, fmt.Errorf("bench: scale load of %d keys: %w", n, err)
		}
	}
	var out []ScalePoint
	for round := 1; round <= r.o.ScaleRounds; round++ {
		first := len(out)
		for i, n := range r.o.ScaleKeys {
			dir := fmt.Sprintf("%s-round-%d", loaded[i], round)
			if err := checkpoint(loaded[i], dir, r.o.Engine); err != nil {
				return nil, fmt.Errorf("bench: scale checkpoint of %d keys: %w", n, err)
			}
			sp, err := r.scalePoint(ctx, dir)
			if err != nil {
				return nil, fmt.Errorf("bench: scale point of %d keys: %w", n, err)
			}
			sp.LiveKeys, sp.Round, sp.Relative = n, round, 1
			if i > 0 && out[first].Point.RequestsPerSec > 0 {
				sp.Relative = sp.Point.RequestsPerSec / out[first].Point.RequestsPerSec
			}
			out = append(out, sp)
			r.run.Step(fmt.Sprintf("scale %d keys, round %d", n, round))
		}
	}
	return out, nil
}

// scalePoint opens the first target on dir, waits for its claim filter if
// it has one, and measures the unique workload. It removes dir.
func (r *runner) scalePoint(ctx context.Context, dir string) (sp ScalePoint, err error) {
	t := r.o.Targets[0]
	o, err := r.open(t, dir)
	if err != nil {
		return ScalePoint{}, errors.Join(err, os.RemoveAll(dir))
	}
	defer func() {
		if cerr := o.close(); err == nil {
			err = cerr
		}
	}()
	if f, ok := o.Store.(interface{ ClaimFilterBuilt() <-chan struct{} }); ok {
		start := time.Now()
		select {
		case <-f.ClaimFilterBuilt():
		case <-ctx.Done():
			return ScalePoint{}, ctx.Err()
		}
		sp.FilterBuildSeconds = time.Since(start).Seconds()
	}
	p := &point{o: r.o, store: o, stream: r.newStream()}
	sp.Point, err = r.measure(ctx, workloadByName(unique), p, o, r.o.ScaleConcurrency)
	sp.Point.Target = t.Name
	return sp, err
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

// writeScale writes the scale points, and with several rounds each size's
// geometric mean over them.
func (r *Report) writeScale(w io.Writer) {
	if len(r.Scale) == 0 {
		return
	}
	fmt.Fprintf(w, "\nScale: unique on %s at concurrency %d over stores of N live keys:\n",
		r.Scale[0].Point.Target, r.Scale[0].Point.Concurrency)
	rounds := r.Scale[len(r.Scale)-1].Round
	var sizes []int
	for _, s := range r.Scale {
		round := ""
		if rounds > 1 {
			round = fmt.Sprintf("round %d  ", s.Round)
		}
		fmt.Fprintf(w, "  %s%14s live keys  %10s req/s  p50 %9s  p99 %9s  %.2f x the first\n",
			round, bench.Count(float64(s.LiveKeys)), bench.Count(s.Point.RequestsPerSec),
			bench.Micros(s.Point.Latency.P50), bench.Micros(s.Point.Latency.P99), s.Relative)
		if !slices.Contains(sizes, s.LiveKeys) {
			sizes = append(sizes, s.LiveKeys)
		}
	}
	if rounds < 2 {
		return
	}
	for _, n := range sizes {
		var sum float64
		var k int
		for _, s := range r.Scale {
			if s.LiveKeys == n && s.Relative > 0 {
				sum += math.Log(s.Relative)
				k++
			}
		}
		fmt.Fprintf(w, "  %14s live keys: %.2f x the first, geometric mean of %d rounds\n",
			bench.Count(float64(n)), math.Exp(sum/float64(max(k, 1))), k)
	}
}
