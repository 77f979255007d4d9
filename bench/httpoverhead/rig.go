package httpoverhead

import (
	"cmp"
	"context"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"golang.org/x/time/rate"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/bench"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/httpidem"
)

// rig is what a run measures: the two stores, the two handlers served on
// loopback, and their clients' connections.
type rig struct {
	o       *Options
	db      *pebble.DB     // the bare handler's store
	e       *engine.Engine // the middleware's store
	servers []*server      // bare, then middleware
	closers []func() error
}

// server is one handler served on loopback and what was measured of it.
type server struct {
	name     string
	conns    []*httpConn // one per client
	hist     *bench.Histogram
	requests int64
	seconds  float64
	cpu      time.Duration
	sliceP99 []float64 // µs, one per measured slice
	sliceBg  []BackgroundWork
	engine   *engine.Engine // the middleware's store; nil for the bare handler
	commits  bench.CommitDelta
	runtime  runtimeDelta
}

// newRig opens the bare handler's store in bareDir and the engine in
// engineDir, serves both handlers and connects o.Clients clients to each.
func newRig(o *Options, bareDir, engineDir string) (rg *rig, err error) {
	rg = &rig{o: o}
	defer func() {
		if err != nil {
			rg.close()
		}
	}()
	po := o.Engine.PebbleOptions()
	po.Cache = pebble.NewCache(o.Engine.CacheSize)
	rg.closers = append(rg.closers, func() error { po.Cache.Unref(); return nil })
	if rg.db, err = pebble.Open(bareDir, po); err != nil {
		return nil, err
	}
	rg.closers = append(rg.closers, rg.db.Close)
	if rg.e, err = engine.Open(engineDir, o.Engine); err != nil {
		return nil, err
	}
	rg.closers = append(rg.closers, rg.e.Close)
	// Failures only: a record per request to stderr would measure the
	// terminal, and the bare handler logs nothing.
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	m, err := httpidem.New(&httpidem.Options{Store: rg.e, Tenant: tenant, Logger: log})
	if err != nil {
		return nil, err
	}
	protected, err := m.Wrap(paymentHandler(func(r *http.Request, key, row []byte) error {
		return httpidem.FromContext(r.Context()).Apply(func(fx idemkv.Effects) error { return fx.Set(key, row) })
	}), httpidem.Route{Require: true})
	if err != nil {
		return nil, err
	}
	bare := paymentHandler(func(_ *http.Request, key, row []byte) error {
		return rg.db.Set(key, row, pebble.Sync)
	})
	if err := rg.serve("bare", bare, nil); err != nil {
		return nil, err
	}
	return rg, rg.serve("middleware", protected, rg.e)
}

// serve serves h on a loopback port and connects the clients to it.
func (rg *rig) serve(name string, h http.Handler, e *engine.Engine) error {
	mux := http.NewServeMux()
	mux.Handle("POST /v1/payments", h)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	// The limits of idemkv serve, so that the measured server is the one
	// a service runs (they do not bind at the harness's rate).
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 15 * time.Second,
		WriteTimeout: 45 * time.Second, IdleTimeout: 60 * time.Second, MaxHeaderBytes: 32 << 10}
	go srv.Serve(ln)
	rg.closers = append(rg.closers, srv.Close)
	s := &server{name: name, hist: bench.NewHistogram(), engine: e}
	rg.servers = append(rg.servers, s)
	for range rg.o.Clients {
		hc, err := dialHTTP(ln.Addr().String())
		if err != nil {
			return err
		}
		s.conns = append(s.conns, hc)
		rg.closers = append(rg.closers, hc.c.Close)
	}
	return nil
}

// close closes what newRig opened, in reverse order.
func (rg *rig) close() {
	for i := len(rg.closers) - 1; i >= 0; i-- {
		_ = rg.closers[i]()
	}
}

// slice drives s at the configured rate for one slice, and if measured,
// adds what it measured to s.
func (rg *rig) slice(ctx context.Context, s *server, stream uint64, next *atomic.Uint64, measured bool) error {
	sctx, cancel := context.WithTimeout(ctx, rg.o.Slice)
	defer cancel()
	lim := rate.NewLimiter(rate.Limit(rg.o.Rate), 1)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
		slice    = bench.NewHistogram()
	)
	// The engine's Stats serve both the background work and, for the
	// middleware, the committer's figures.
	bg0, st0, err := rg.background()
	if err != nil {
		return err
	}
	rt0, cpu0, t0 := readRuntime(), bench.CPUTime(), time.Now()
	for _, hc := range s.conns {
		wg.Go(func() {
			h := bench.NewHistogram()
			for lim.Wait(sctx) == nil {
				start := time.Now()
				err := hc.pay(stream, next.Add(1), rg.o.Tenants)
				if sctx.Err() != nil {
					break
				}
				if err != nil {
					mu.Lock()
					firstErr = cmp.Or(firstErr, err)
					mu.Unlock()
					cancel()
					break
				}
				h.Record(time.Since(start))
			}
			mu.Lock()
			slice.Merge(h)
			mu.Unlock()
		})
	}
	wg.Wait()
	if err := cmp.Or(firstErr, ctx.Err()); err != nil || !measured {
		return err
	}
	elapsed := time.Since(t0)
	bg1, st1, err := rg.background()
	if err != nil {
		return err
	}
	s.hist.Merge(slice)
	s.sliceP99 = append(s.sliceP99, slice.Latency().P99)
	s.sliceBg = append(s.sliceBg, bg1.minus(bg0))
	s.requests += slice.Count()
	s.seconds += elapsed.Seconds()
	s.runtime.add(rt0, readRuntime())
	if cpu0 >= 0 {
		s.cpu += bench.CPUTime() - cpu0
	}
	if s.engine != nil {
		s.commits.Add(st0, st1, elapsed)
	}
	return nil
}

// figures returns what was measured of s.
func (s *server) figures() Target {
	t := Target{Name: s.name, Requests: s.requests, Latency: s.hist.Latency(), SliceP99US: s.sliceP99,
		SliceBackground: s.sliceBg, CommitFigures: s.commits.Figures(), Runtime: s.runtime.figures(s.requests)}
	if s.seconds > 0 {
		t.RequestsPerSec = float64(s.requests) / s.seconds
	}
	if s.requests > 0 && s.cpu >= 0 {
		t.CPUSecondsPerRequest = s.cpu.Seconds() / float64(s.requests)
	}
	return t
}

// BackgroundWork is flush and compaction work that Pebble completed: both
// stores', since both share the machine whichever handler is driven.
type BackgroundWork struct {
	Flushes     int64   `json:"flushes"`     // the number of memtable flushes that ended
	Compactions int64   `json:"compactions"` // the number of compactions that ended
	WrittenMB   float64 `json:"written_mb"`  // what those flushes and compactions wrote, in MB
	// FilterBuilds counts the engine's claim-filter builds that ended:
	// each scans every stored record key.
	FilterBuilds int64 `json:"filter_builds"`
	// CompactingAtStart is the number of compactions in progress when the
	// slice began; with Compactions and CompactingAtEnd, it tells whether
	// any compaction ran during the slice.
	CompactingAtStart int64 `json:"compacting_at_start"`
	// CompactingAtEnd is the number of compactions in progress when the
	// slice ended.
	CompactingAtEnd int64 `json:"compacting_at_end"`

	running int64 // compactions in progress when read (background)
}

// compacted reports whether a compaction ran during the slice.
func (b BackgroundWork) compacted() bool {
	return b.Compactions > 0 || b.CompactingAtStart > 0 || b.CompactingAtEnd > 0
}

// background returns the work both stores have completed so far, and the
// engine's Stats it read for it.
func (rg *rig) background() (BackgroundWork, engine.Stats, error) {
	st, err := rg.e.Stats()
	if err != nil {
		return BackgroundWork{}, st, err
	}
	m := rg.db.Metrics()
	total := m.Total()
	return BackgroundWork{
		Flushes:      m.Flush.Count + st.Flushes,
		Compactions:  m.Compact.Count + st.Compactions,
		WrittenMB:    float64(total.TableBytesFlushed+total.TableBytesCompacted+st.TableBytesWritten) / 1e6,
		FilterBuilds: st.ClaimFilterBuilds,
		running:      m.Compact.NumInProgress + st.CompactionsRunning,
	}, st, nil
}

// minus returns the work done from a to b: counters as growth, the
// compactions in progress as read at each end.
func (b BackgroundWork) minus(a BackgroundWork) BackgroundWork {
	return BackgroundWork{Flushes: b.Flushes - a.Flushes, Compactions: b.Compactions - a.Compactions,
		WrittenMB: b.WrittenMB - a.WrittenMB, FilterBuilds: b.FilterBuilds - a.FilterBuilds,
		CompactingAtStart: a.running, CompactingAtEnd: b.running}
}
