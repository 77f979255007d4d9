package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/idemkv/idemkv/bench"
	"github.com/idemkv/idemkv/bench/internal/pgsize"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/pgstore"
)

// Options configure a run.
type Options struct {
	// DSN is the database to measure in: the run creates its tables
	// there (pgstore's, and the baseline's naive_* tables, dropped first).
	DSN string
	// EngineDir is an empty directory for the engine's store.
	EngineDir string
	// Concurrency lists the points: closed-loop clients. Default 16, 64.
	Concurrency []int
	// Duration is how long each store runs at each point, each round.
	// Default 3 s.
	Duration time.Duration
	// Rounds of every point. Default 2.
	Rounds int
	// Tenants the keys spread over. Default 16.
	Tenants int
	// Pool is the connection pool of each PostgreSQL side. Default 16: docs/operations.md
	// suggests 2 to 4 a core, and more connections than the cores can run
	// only add contention in the server.
	Pool int32
	// Warmup is how long each PostgreSQL side runs, unmeasured, before
	// the first point: a server just started plans, caches and extends
	// its files, and the first side measured would pay for it. Default
	// 2 s.
	Warmup time.Duration
	// Logf, if set, reports progress.
	Logf func(format string, args ...any)
}

func (o *Options) withDefaults() *Options {
	c := *o
	if len(c.Concurrency) == 0 {
		c.Concurrency = []int{16, 64}
	}
	if c.Duration == 0 {
		c.Duration = 3 * time.Second
	}
	if c.Warmup == 0 {
		c.Warmup = 2 * time.Second
	}
	if c.Rounds == 0 {
		c.Rounds = 2
	}
	if c.Tenants == 0 {
		c.Tenants = 16
	}
	if c.Pool == 0 {
		c.Pool = 16
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
	return &c
}

// The stores measured: pgstore by RunLocal (one statement a request),
// pgstore by Claim and Complete (two), the naive baseline (three
// statements), and the engine, each request writing one effect; and the
// same request without an effect, by pgstore both ways and by a naive
// baseline of two statements (a claim's INSERT ... ON CONFLICT and a
// completion's UPDATE), the least a hand-written service does.
const (
	postgres        = "pgstore"
	postgresTwo     = "pgstore-claim-complete"
	naiveSide       = "naive"
	engineSide      = "engine"
	postgresBare    = "pgstore-no-effect"
	postgresBareTwo = "pgstore-claim-complete-no-effect"
	naiveTwo        = "naive-2"
)

// pgSides are the PostgreSQL sides, and baseline the naive side each is
// compared with.
var (
	pgSides  = []string{postgres, postgresTwo, naiveSide, postgresBare, postgresBareTwo, naiveTwo}
	baseline = map[string]string{postgres: naiveSide, postgresTwo: naiveSide, postgresBare: naiveTwo, postgresBareTwo: naiveTwo}
)

// Side is one store's figures at one point.
type Side struct {
	// Requests completed over all rounds.
	Requests int64 `json:"requests"`
	// PerSec is the mean of the rounds' requests a second.
	PerSec float64 `json:"per_sec"`
	// Latency of a request, over all rounds.
	Latency bench.Latency `json:"latency"`
}

// Point is one concurrency's figures, by store, over all rounds.
type Point struct {
	// Clients is the number of closed-loop clients.
	Clients int `json:"clients"`
	// Sides are the figures by store: "pgstore", "pgstore-claim-complete",
	// "naive", "engine".
	Sides map[string]Side `json:"sides"`
	// Ratio is pgstore (RunLocal) over the naive baseline: the geometric
	// mean of the rounds' ratios. The engine runs once a point, after all
	// the PostgreSQL points.
	Ratio float64 `json:"ratio"`
	// RatioTwo is the same for pgstore by Claim and Complete.
	RatioTwo float64 `json:"ratio_claim_complete"`
	// RatioBare is RunLocal over the two-statement baseline, neither
	// writing an effect.
	RatioBare float64 `json:"ratio_no_effect"`
	// RatioBareTwo is the same for Claim and Complete.
	RatioBareTwo float64 `json:"ratio_claim_complete_no_effect"`
}

// Report is a run's figures.
type Report struct {
	// Points are the figures by concurrency.
	Points []Point `json:"points"`
	// BytesPerKey is each store's size at rest over the completed keys
	// it holds: tables and indexes after a VACUUM for PostgreSQL, live
	// sstables after a full compaction for the engine.
	BytesPerKey map[string]float64 `json:"bytes_per_key"`
	// Keys is the number of keys each side completed in the run.
	Keys map[string]int64 `json:"keys"`
}

// Run measures the stores.
func Run(ctx context.Context, opts *Options) (*Report, error) {
	o := opts.withDefaults()
	conns := o.Pool
	pg, err := pgstore.Open(ctx, o.DSN+poolParam(o.DSN, conns), &pgstore.Options{NoBackgroundSweep: true})
	if err != nil {
		return nil, err
	}
	defer pg.Close()
	nv, err := openNaive(ctx, o.DSN, conns)
	if err != nil {
		return nil, err
	}
	defer nv.pool.Close()
	e, err := engine.Open(o.EngineDir, nil)
	if err != nil {
		return nil, err
	}
	defer e.Close()

	do := map[string]func(ctx context.Context, stream, i uint64) error{
		postgres:        func(ctx context.Context, s, i uint64) error { return runLocal(ctx, pg, s, i, o.Tenants, true) },
		postgresTwo:     func(ctx context.Context, s, i uint64) error { return storeRequest(ctx, pg, s, i, o.Tenants, true) },
		naiveSide:       func(ctx context.Context, s, i uint64) error { return nv.request(ctx, s, i, o.Tenants, true) },
		engineSide:      func(ctx context.Context, s, i uint64) error { return storeRequest(ctx, e, s, i, o.Tenants, true) },
		postgresBare:    func(ctx context.Context, s, i uint64) error { return runLocal(ctx, pg, s, i, o.Tenants, false) },
		postgresBareTwo: func(ctx context.Context, s, i uint64) error { return storeRequest(ctx, pg, s, i, o.Tenants, false) },
		naiveTwo:        func(ctx context.Context, s, i uint64) error { return nv.request(ctx, s, i, o.Tenants, false) },
	}
	rep := &Report{Keys: map[string]int64{}}
	var stream uint64
	side := func(name string, n int, h *bench.Histogram) (float64, error) {
		stream += uint64(n) + 1
		done, err := drive(ctx, n, o.Duration, stream, h, do[name])
		if err != nil {
			return 0, fmt.Errorf("%s, %d clients: %w", name, n, err)
		}
		rep.Keys[name] += done
		return float64(done) / o.Duration.Seconds(), nil
	}
	for _, name := range pgSides {
		stream += uint64(o.Concurrency[0]) + 1
		if _, err := drive(ctx, o.Concurrency[0], o.Warmup, stream, bench.NewHistogram(), do[name]); err != nil {
			return nil, fmt.Errorf("%s, warming up: %w", name, err)
		}
	}
	// The PostgreSQL sides take turns, point by point; the engine
	// runs after all of them, so that its flushes and compactions do not
	// take the CPU from a PostgreSQL side.
	for _, n := range o.Concurrency {
		pt := Point{Clients: n, Sides: map[string]Side{}}
		hists := map[string]*bench.Histogram{}
		for _, name := range pgSides {
			hists[name] = bench.NewHistogram()
		}
		logRatio := map[string]float64{}
		for round := range o.Rounds {
			order := slices.Clone(pgSides)
			if round%2 == 1 {
				slices.Reverse(order)
			}
			perSec := map[string]float64{}
			for _, name := range order {
				ps, err := side(name, n, hists[name])
				if err != nil {
					return nil, err
				}
				perSec[name] = ps
				sd := pt.Sides[name]
				sd.PerSec += ps / float64(o.Rounds)
				pt.Sides[name] = sd
				o.Logf("%d clients, round %d: %s %.0f/s", n, round+1, name, ps)
			}
			for side, base := range baseline {
				logRatio[side] += math.Log(perSec[side] / perSec[base])
			}
		}
		for name, h := range hists {
			sd := pt.Sides[name]
			sd.Requests, sd.Latency = h.Count(), h.Latency()
			pt.Sides[name] = sd
		}
		ratio := func(side string) float64 { return math.Exp(logRatio[side] / float64(o.Rounds)) }
		pt.Ratio, pt.RatioTwo = ratio(postgres), ratio(postgresTwo)
		pt.RatioBare, pt.RatioBareTwo = ratio(postgresBare), ratio(postgresBareTwo)
		rep.Points = append(rep.Points, pt)
	}
	for i, n := range o.Concurrency {
		h := bench.NewHistogram()
		ps, err := side(engineSide, n, h)
		if err != nil {
			return nil, err
		}
		o.Logf("%d clients: %s %.0f/s", n, engineSide, ps)
		rep.Points[i].Sides[engineSide] = Side{Requests: h.Count(), PerSec: ps, Latency: h.Latency()}
	}
	rep.BytesPerKey, err = bytesPerKey(ctx, pg, nv, e, rep.Keys)
	return rep, err
}

// poolParam adds pool_max_conns to a URL.
func poolParam(dsn string, n int32) string {
	sep := "?"
	if slices.Contains([]byte(dsn), '?') {
		sep = "&"
	}
	return fmt.Sprintf("%spool_max_conns=%d", sep, n)
}

// drive runs n closed-loop clients for d, each request of client c the
// next of stream+c, and returns how many completed.
func drive(ctx context.Context, n int, d time.Duration, stream uint64, h *bench.Histogram, req func(context.Context, uint64, uint64) error) (int64, error) {
	var (
		done atomic.Int64
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	deadline := time.Now().Add(d)
	for c := range n {
		wg.Go(func() {
			local := bench.NewHistogram()
			for i := uint64(0); time.Now().Before(deadline); i++ {
				start := time.Now()
				if err := req(ctx, stream+uint64(c), i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				local.Record(time.Since(start))
				done.Add(1)
			}
			mu.Lock()
			h.Merge(local)
			mu.Unlock()
		})
	}
	wg.Wait()
	return done.Load(), errors.Join(errs...)
}

// bytesPerKey measures each store at rest over the keys it completed.
func bytesPerKey(ctx context.Context, pg *pgstore.Store, nv *naive, e *engine.Engine, keys map[string]int64) (map[string]float64, error) {
	out := map[string]float64{}
	size := func(tables ...string) (float64, error) {
		n, err := pgsize.AtRest(ctx, nv.pool, tables...)
		return float64(n), err
	}
	b, err := size("idemkv_records", "idemkv_data")
	if err != nil {
		return nil, err
	}
	pgKeys := keys[postgres] + keys[postgresTwo] + keys[postgresBare] + keys[postgresBareTwo] // all in the same tables
	out[postgres] = b / float64(pgKeys)
	if b, err = size("idemkv_records"); err != nil {
		return nil, err
	}
	out[recordOnly(postgres)] = b / float64(pgKeys)
	if b, err = size("naive_records", "naive_data"); err != nil {
		return nil, err
	}
	out[naiveSide] = b / float64(keys[naiveSide])
	if b, err = size("naive2_records"); err != nil {
		return nil, err
	}
	out[naiveTwo] = b / float64(keys[naiveTwo])
	if err := e.Flush(); err != nil {
		return nil, err
	}
	if err := e.Compact(ctx); err != nil {
		return nil, err
	}
	st, err := e.Stats()
	if err != nil {
		return nil, err
	}
	out[engineSide] = float64(st.TableBytes) / float64(keys[engineSide])
	return out, nil
}

// recordOnly names a side's bytes per key of its records' table alone
// (in Report.BytesPerKey).
func recordOnly(side string) string { return side + "-records" }

// Print writes the report as tables.
func (r *Report) Print(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "clients\tpgstore/s\tratio\tclaim+complete/s\tratio\tnaive SQL/s\tengine/s\tpgstore p50 / p99\tnaive p50 / p99\t")
	for _, p := range r.Points {
		pg, two, nv, en := p.Sides[postgres], p.Sides[postgresTwo], p.Sides[naiveSide], p.Sides[engineSide]
		fmt.Fprintf(tw, "%d\t%.0f\t%.2f×\t%.0f\t%.2f×\t%.0f\t%.0f\t%s / %s\t%s / %s\t\n", p.Clients, pg.PerSec, p.Ratio,
			two.PerSec, p.RatioTwo, nv.PerSec, en.PerSec,
			ms(pg.Latency.P50), ms(pg.Latency.P99), ms(nv.Latency.P50), ms(nv.Latency.P99))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "without an effect:")
	fmt.Fprintln(tw, "clients\tRunLocal/s\tratio\tclaim+complete/s\tratio\tnaive 2-statement SQL/s\t")
	for _, p := range r.Points {
		pg, two, nv := p.Sides[postgresBare], p.Sides[postgresBareTwo], p.Sides[naiveTwo]
		fmt.Fprintf(tw, "%d\t%.0f\t%.2f×\t%.0f\t%.2f×\t%.0f\t\n", p.Clients, pg.PerSec, p.RatioBare, two.PerSec, p.RatioBareTwo, nv.PerSec)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "bytes per completed key at rest: pgstore %.0f, naive SQL %.0f, engine %.0f; records alone: pgstore %.0f, naive 2-statement %.0f\n",
		r.BytesPerKey[postgres], r.BytesPerKey[naiveSide], r.BytesPerKey[engineSide], r.BytesPerKey[recordOnly(postgres)], r.BytesPerKey[naiveTwo])
	return err
}

// ms formats a latency in microseconds as milliseconds.
func ms(us float64) string { return fmt.Sprintf("%.2f ms", us/1000) }
