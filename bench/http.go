package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/cockroachdb/pebble/v2"
	"golang.org/x/time/rate"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/httpidem"
)

// HTTPConfig configures RunHTTP, the middleware's latency overhead over
// loopback HTTP: one payment-creating handler served twice in the same
// process, bare and behind package httpidem, driven in alternating slices
// at the same request rate. The bare handler commits its payment row with
// its own synced Pebble write; the protected one hands the row to the
// middleware, which commits it with the stored response in one synced
// batch. So both do one durable write per request, and the difference is
// what protection costs: the key check, the fingerprint, the claim, the
// response capture and the record. The zero value of every field means
// the default stated on it; HTTPProfile returns the standard ones.
type HTTPConfig struct {
	// Profile names the configuration in the report. Default: "custom".
	Profile string
	// Rate is the request rate, requests per second. Default: 5,000, the
	// guide's.
	Rate float64
	// Clients is the number of concurrent clients (keep-alive connections)
	// sharing the rate. Default: 64.
	Clients int
	// Slice is how long each target is driven at a time. Default: 5 s.
	Slice time.Duration
	// Slices is the number of slices per target, after one warm-up slice
	// each that is not measured. Default: 4.
	Slices int
	// Tenants is the number of accounts the requests are spread over.
	// Default: 1,000.
	Tenants int
	// Dir is where the run's temporary directory is created; it is removed
	// at the end. Default: os.TempDir().
	Dir string
	// Engine configures the engine and, through its Pebble options, the
	// bare handler's store. Default: engine defaults.
	Engine *engine.Options
	// CompactionNice, if positive, runs both stores' compactions at this
	// nice value (package engine/lowprio), unless Engine sets
	// ConfigurePebble. Default: 0, the process's priority.
	CompactionNice int
	// Progress, if set, is called after each slice.
	Progress func(Progress)
}

// HTTPProfile returns a standard configuration: "quick" (3 slices of 3 s
// per target, about 25 s) or "full" (6 slices of 10 s, about 2.5 min).
func HTTPProfile(name string) (HTTPConfig, error) {
	switch name {
	case "quick":
		return HTTPConfig{Profile: name, Slice: 3 * time.Second, Slices: 3}, nil
	case "full":
		return HTTPConfig{Profile: name, Slice: 10 * time.Second, Slices: 6}, nil
	}
	return HTTPConfig{}, fmt.Errorf("bench: unknown profile %q (want quick or full)", name)
}

func (c HTTPConfig) ensureDefaults() HTTPConfig {
	if c.Profile == "" {
		c.Profile = "custom"
	}
	if c.Rate == 0 {
		c.Rate = 5000
	}
	if c.Clients == 0 {
		c.Clients = 64
	}
	if c.Slice == 0 {
		c.Slice = 5 * time.Second
	}
	if c.Slices == 0 {
		c.Slices = 4
	}
	if c.Tenants == 0 {
		c.Tenants = 1000
	}
	if c.Dir == "" {
		c.Dir = os.TempDir()
	}
	return c
}

// Validate reports a configuration RunHTTP cannot run.
func (c HTTPConfig) Validate() error {
	d := c.ensureDefaults()
	if d.Rate <= 0 || d.Clients < 1 || d.Slice <= 0 || d.Slices < 1 || d.Tenants < 1 {
		return errors.New("bench: http: rate, clients, slice, slices and tenants must be positive")
	}
	if d.CompactionNice < 0 || d.CompactionNice > 19 {
		return fmt.Errorf("bench: http: compaction nice %d outside 0..19", d.CompactionNice)
	}
	return nil
}

// HTTPReport is the result of RunHTTP. JSON field names are stable and
// documented in docs/benchmarks.md.
type HTTPReport struct {
	Meta HTTPMeta `json:"meta"`
	// Targets: "bare" and "middleware".
	Targets []HTTPTarget `json:"targets"`
	// Overhead is the middleware's latency minus the bare handler's, at
	// each percentile, in µs.
	Overhead HTTPLatency `json:"overhead_us"`
}

// HTTPMeta describes the run.
type HTTPMeta struct {
	Date         string  `json:"date"`
	GoVersion    string  `json:"go_version"`
	CPUModel     string  `json:"cpu_model"`
	NumCPU       int     `json:"num_cpu"`
	Profile      string  `json:"profile"`
	Rate         float64 `json:"rate"`
	Clients      int     `json:"clients"`
	SliceSeconds float64 `json:"slice_seconds"`
	Slices       int     `json:"slices"`
	// L0CompactionThreshold is engine.Options.L0CompactionThreshold, for
	// both stores.
	L0CompactionThreshold int `json:"l0_compaction_threshold"`
	// Compression is the name of engine.Options.Compression, for both
	// stores.
	Compression string `json:"compression"`
	// GOMAXPROCS is the Go processors the run had, and CompactionNice
	// HTTPConfig.CompactionNice.
	GOMAXPROCS     int     `json:"gomaxprocs"`
	CompactionNice int     `json:"compaction_nice"`
	WallSeconds    float64 `json:"wall_seconds"`
}

// HTTPLatency is a latency distribution in µs, measured by the client from
// sending a request to reading the last byte of its response.
type HTTPLatency struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p999"`
	Max  float64 `json:"max"`
	Mean float64 `json:"mean"`
}

// HTTPTarget is one served handler's figures over its measured slices.
type HTTPTarget struct {
	Name                 string      `json:"name"`
	Requests             int64       `json:"requests"`
	RequestsPerSec       float64     `json:"requests_per_sec"`
	Latency              HTTPLatency `json:"latency_us"`
	CPUSecondsPerRequest float64     `json:"cpu_seconds_per_request"`
	// SliceP99US is the p99 latency of each measured slice, in µs, in the
	// order they ran. Background work (the engine's flushes and
	// compactions) lands in some slices and not others; these show how
	// much of Latency.P99 comes from a few slices.
	SliceP99US []float64 `json:"slice_p99_us"`
	// SliceBackground is the flush and compaction work the two stores
	// completed during each measured slice, in the order of SliceP99US.
	SliceBackground []BackgroundWork `json:"slice_background"`
	// The engine's committer over the measured slices (middleware only).
	CommitFigures
	// Runtime is the Go runtime's scheduler wait and collector work over
	// the measured slices: the whole process's, clients included.
	Runtime RuntimeFigures `json:"runtime"`
}

func httpLatencyOf(h *hdrhistogram.Histogram) HTTPLatency {
	us := func(ns int64) float64 { return float64(ns) / 1e3 }
	return HTTPLatency{
		P50: us(h.ValueAtQuantile(50)), P90: us(h.ValueAtQuantile(90)), P99: us(h.ValueAtQuantile(99)),
		P999: us(h.ValueAtQuantile(99.9)), Max: us(h.Max()), Mean: h.Mean() / 1e3,
	}
}

// BackgroundWork is flush and compaction work that Pebble completed: both
// stores', since both share the machine whichever handler is driven.
type BackgroundWork struct {
	Flushes     int64 `json:"flushes"`
	Compactions int64 `json:"compactions"`
	// WrittenMB is what those flushes and compactions wrote, in MB.
	WrittenMB float64 `json:"written_mb"`
	// FilterBuilds counts the engine's claim-filter builds that ended:
	// each scans every stored record key.
	FilterBuilds int64 `json:"filter_builds"`
	// CompactingAtStart and CompactingAtEnd are the compactions in
	// progress when the slice began and ended: with Compactions, they
	// tell whether any compaction ran during it.
	CompactingAtStart int64 `json:"compacting_at_start"`
	CompactingAtEnd   int64 `json:"compacting_at_end"`

	running int64 // compactions in progress when read (readBackground)
}

// compacted reports whether a compaction ran during the slice.
func (b BackgroundWork) compacted() bool {
	return b.Compactions > 0 || b.CompactingAtStart > 0 || b.CompactingAtEnd > 0
}

// readBackground returns the work db and e have completed so far, and
// e's Stats it read for it.
func readBackground(db *pebble.DB, e *engine.Engine) (BackgroundWork, engine.Stats, error) {
	st, err := e.Stats()
	if err != nil {
		return BackgroundWork{}, st, err
	}
	m := db.Metrics()
	total := m.Total()
	return BackgroundWork{
		Flushes:      m.Flush.Count + st.Flushes,
		Compactions:  m.Compact.Count + st.Compactions,
		WrittenMB:    float64(total.TableBytesFlushed+total.TableBytesCompacted+st.TableBytesWritten) / 1e6,
		FilterBuilds: st.ClaimFilterBuilds,
		running:      m.Compact.NumInProgress + st.CompactionsRunning,
	}, st, nil
}

func (b BackgroundWork) minus(a BackgroundWork) BackgroundWork {
	return BackgroundWork{Flushes: b.Flushes - a.Flushes, Compactions: b.Compactions - a.Compactions,
		WrittenMB: b.WrittenMB - a.WrittenMB, FilterBuilds: b.FilterBuilds - a.FilterBuilds,
		CompactingAtStart: a.running, CompactingAtEnd: b.running}
}

// httpTarget is one running server and what was measured of it.
type httpTarget struct {
	name     string
	addr     string
	conns    []*httpConn // one per client
	hist     *hdrhistogram.Histogram
	requests int64
	seconds  float64
	cpu      time.Duration
	sliceP99 []float64 // µs, one per measured slice
	sliceBg  []BackgroundWork
	engine   *engine.Engine // the middleware's store; nil for the bare handler
	commits  commitDelta
	runtime  runtimeDelta
}

func (t *httpTarget) close() {
	for _, hc := range t.conns {
		hc.c.Close()
	}
}

// RunHTTP runs the HTTP overhead measurement.
func RunHTTP(ctx context.Context, c HTTPConfig) (*HTTPReport, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	c = c.ensureDefaults()
	start := time.Now()
	dir, err := os.MkdirTemp(c.Dir, "idemkv-bench-http-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)

	eopts := *c.Engine.EnsureDefaults()
	if err := withCompactionNice(&eopts, c.CompactionNice); err != nil {
		return nil, err
	}
	po := eopts.PebbleOptions()
	po.Cache = pebble.NewCache(eopts.CacheSize)
	defer po.Cache.Unref()
	db, err := pebble.Open(filepath.Join(dir, "bare"), po)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	e, err := engine.Open(filepath.Join(dir, "engine"), &eopts)
	if err != nil {
		return nil, err
	}
	defer e.Close()
	m, err := httpidem.New(&httpidem.Options{Store: e, Tenant: benchTenant})
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
		return db.Set(key, row, pebble.Sync)
	})

	var targets []*httpTarget
	for _, t := range []struct {
		name string
		h    http.Handler
		e    *engine.Engine
	}{{"bare", bare, nil}, {"middleware", protected, e}} {
		mux := http.NewServeMux()
		mux.Handle("POST /v1/payments", t.h)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		srv := &http.Server{Handler: mux}
		go srv.Serve(ln)
		defer srv.Close()
		targets = append(targets, &httpTarget{name: t.name, addr: ln.Addr().String(), hist: newHist(), engine: t.e})
	}
	for _, t := range targets {
		defer t.close()
		for range c.Clients {
			hc, err := dialHTTP(t.addr)
			if err != nil {
				return nil, err
			}
			t.conns = append(t.conns, hc)
		}
	}

	stream := uint64(time.Now().UnixNano())
	var next atomic.Uint64
	total := 2 * (c.Slices + 1)
	bg := func() (BackgroundWork, engine.Stats, error) { return readBackground(db, e) }
	for s := 0; s <= c.Slices; s++ {
		for _, t := range targets {
			measured := s > 0 // the first slice of each target warms it up
			if err := httpSlice(ctx, c, t, stream, &next, bg, measured); err != nil {
				return nil, fmt.Errorf("bench: http: %s: %w", t.name, err)
			}
			if c.Progress != nil {
				c.Progress(Progress{Done: 2*s + len(targets), Total: total, Step: fmt.Sprintf("http %s slice %d", t.name, s)})
			}
		}
	}

	rep := &HTTPReport{Meta: HTTPMeta{
		Date: start.UTC().Format(time.RFC3339), GoVersion: runtime.Version(), CPUModel: cpuModel(), NumCPU: runtime.NumCPU(),
		Profile: c.Profile, Rate: c.Rate, Clients: c.Clients, SliceSeconds: c.Slice.Seconds(), Slices: c.Slices,
		L0CompactionThreshold: eopts.L0CompactionThreshold, Compression: eopts.Compression.Name,
		GOMAXPROCS: runtime.GOMAXPROCS(0), CompactionNice: c.CompactionNice,
		WallSeconds: time.Since(start).Seconds(),
	}}
	for _, t := range targets {
		ht := HTTPTarget{Name: t.name, Requests: t.requests, Latency: httpLatencyOf(t.hist), SliceP99US: t.sliceP99, SliceBackground: t.sliceBg,
			CommitFigures: t.commits.figures(), Runtime: t.runtime.figures(t.requests)}
		if t.seconds > 0 {
			ht.RequestsPerSec = float64(t.requests) / t.seconds
		}
		if t.requests > 0 && t.cpu >= 0 {
			ht.CPUSecondsPerRequest = t.cpu.Seconds() / float64(t.requests)
		}
		rep.Targets = append(rep.Targets, ht)
	}
	b, p := rep.Targets[0].Latency, rep.Targets[1].Latency
	rep.Overhead = HTTPLatency{P50: p.P50 - b.P50, P90: p.P90 - b.P90, P99: p.P99 - b.P99, P999: p.P999 - b.P999, Max: p.Max - b.Max, Mean: p.Mean - b.Mean}
	return rep, nil
}

// httpSlice drives t at the configured rate for one slice.
func httpSlice(ctx context.Context, c HTTPConfig, t *httpTarget, stream uint64, next *atomic.Uint64, background func() (BackgroundWork, engine.Stats, error), measured bool) error {
	sctx, cancel := context.WithTimeout(ctx, c.Slice)
	defer cancel()
	lim := rate.NewLimiter(rate.Limit(c.Rate), 1)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		requests atomic.Int64
		firstErr error
		slice    = newHist()
	)
	// The engine's Stats serve both the background work and, for the
	// middleware, the committer's figures.
	bg0, c0, err := background()
	if err != nil {
		return err
	}
	rt0, cpu0, t0 := readRuntime(), cpuTime(), time.Now()
	for _, hc := range t.conns {
		wg.Go(func() {
			h := newHist()
			defer func() {
				mu.Lock()
				if measured {
					t.hist.Merge(h)
					slice.Merge(h)
				}
				mu.Unlock()
			}()
			for lim.Wait(sctx) == nil {
				i := next.Add(1)
				start := time.Now()
				err := hc.pay(stream, i, c.Tenants)
				if sctx.Err() != nil {
					return
				}
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					cancel()
					return
				}
				recordLatency(h, time.Since(start))
				requests.Add(1)
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if measured {
		t.sliceP99 = append(t.sliceP99, float64(slice.ValueAtQuantile(99))/1e3)
		bg1, c1, err := background()
		if err != nil {
			return err
		}
		t.sliceBg = append(t.sliceBg, bg1.minus(bg0))
		t.requests += requests.Load()
		t.seconds += time.Since(t0).Seconds()
		t.runtime.add(rt0, readRuntime())
		if cpu0 >= 0 {
			t.cpu += cpuTime() - cpu0
		}
		if t.engine != nil {
			t.commits.add(c0, c1, time.Since(t0))
		}
	}
	return nil
}

// httpConn is one client's keep-alive connection to one handler. A
// request is written and its response read on the client's goroutine,
// without net/http's client transport and the two goroutines it runs per
// connection: on two cores shared with the servers, the load generator
// should spend as little of them, and add as few scheduling hand-offs to
// each request, as it can. The request is what a payments client sends:
// a bearer token, an Idempotency-Key as a Structured Field string and a
// JSON body.
type httpConn struct {
	c    net.Conn
	r    *bufio.Reader
	host string
	buf  []byte
}

// httpRequestTimeout bounds one request; a handler that stalls this long
// fails the run rather than hang it.
const httpRequestTimeout = 30 * time.Second

func dialHTTP(addr string) (*httpConn, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	return &httpConn{c: c, r: bufio.NewReaderSize(c, 4096), host: addr}, nil
}

// pay sends one new payment and checks that it was created.
func (hc *httpConn) pay(stream, i uint64, tenants int) error {
	id := keyOf(stream, i, tenants)
	var body [96]byte
	bb := append(body[:0], `{"amount":`...)
	bb = strconv.AppendUint(bb, 1+i%100000, 10)
	bb = append(bb, `,"currency":"USD","card":"tok_visa"}`...)
	b := append(hc.buf[:0], "POST /v1/payments HTTP/1.1\r\nHost: "...)
	b = append(b, hc.host...)
	b = append(b, "\r\nAuthorization: Bearer "...)
	b = append(b, id.Tenant...)
	b = append(b, "\r\n"+httpidem.HeaderKey+": \""...)
	b = append(b, id.Key...)
	b = append(b, "\"\r\nContent-Type: application/json\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(len(bb)), 10)
	b = append(b, "\r\n\r\n"...)
	b = append(b, bb...)
	hc.buf = b
	if err := hc.c.SetDeadline(time.Now().Add(httpRequestTimeout)); err != nil {
		return err
	}
	if _, err := hc.c.Write(b); err != nil {
		return err
	}
	resp, err := http.ReadResponse(hc.r, nil)
	if err != nil {
		return err
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	switch {
	case err != nil:
		return err
	case resp.StatusCode != http.StatusCreated:
		return fmt.Errorf("status %d: %s", resp.StatusCode, got)
	case resp.Close:
		return errors.New("the server closed the connection")
	}
	return nil
}

func benchTenant(r *http.Request) (string, error) {
	t, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || t == "" {
		return "", errors.New("no bearer token")
	}
	return t, nil
}

// paymentHandler is the handler both targets serve: it checks the
// principal and the JSON body, makes a payment row and commits it with
// commit, and answers 201 with the payment.
func paymentHandler(commit func(r *http.Request, key, row []byte) error) http.HandlerFunc {
	var seq atomic.Uint64
	return func(w http.ResponseWriter, r *http.Request) {
		tenant, err := benchTenant(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		var req struct {
			Amount   int64  `json:"amount"`
			Currency string `json:"currency"`
			Card     string `json:"card"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Amount <= 0 || req.Currency == "" || req.Card == "" {
			http.Error(w, "bad payment", http.StatusUnprocessableEntity)
			return
		}
		id := "pay_" + strconv.FormatUint(seq.Add(1), 36)
		row, _ := json.Marshal(map[string]any{"id": id, "tenant": tenant, "amount": req.Amount, "currency": req.Currency, "status": "succeeded"})
		if err := commit(r, []byte("pay/"+id), row); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/v1/payments/"+id)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%q,"amount":%d,"currency":%q,"status":"succeeded"}`, id, req.Amount, req.Currency)
	}
}

// WriteJSON writes the report as indented JSON.
func (r *HTTPReport) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes the report for people.
func (r *HTTPReport) WriteTable(w io.Writer) error {
	var b strings.Builder
	m := r.Meta
	fmt.Fprintf(&b, "idemkv bench http, profile %s, %s, %s, %d CPUs (GOMAXPROCS %d), %s\n", m.Profile, m.Date, m.CPUModel, m.NumCPU, m.GOMAXPROCS, m.GoVersion)
	if m.CompactionNice > 0 {
		fmt.Fprintf(&b, "compactions at nice %d\n", m.CompactionNice)
	}
	fmt.Fprintf(&b, "%.0f requests/s from %d clients over loopback, %d alternating slices of %v per handler\n\n",
		m.Rate, m.Clients, m.Slices, time.Duration(m.SliceSeconds*float64(time.Second)))
	fmt.Fprintf(&b, "%-11s %9s %9s %9s %9s %9s %9s %9s %11s\n", "handler", "req/s", "p50", "p90", "p99", "p99.9", "max", "mean", "CPU µs/req")
	row := func(name string, rps float64, l HTTPLatency, cpu float64, signed bool) {
		f := us
		if signed {
			f = func(v float64) string {
				if v < 0 {
					return "−" + us(-v)
				}
				return "+" + us(v)
			}
		}
		rs := ""
		if rps > 0 {
			rs = strconv.FormatFloat(rps, 'f', 0, 64)
		}
		cs := ""
		if cpu > 0 {
			cs = strconv.FormatFloat(cpu*1e6, 'f', 1, 64)
		}
		fmt.Fprintf(&b, "%-11s %9s %9s %9s %9s %9s %9s %9s %11s\n", name, rs, f(l.P50), f(l.P90), f(l.P99), f(l.P999), f(l.Max), f(l.Mean), cs)
	}
	for _, t := range r.Targets {
		row(t.Name, t.RequestsPerSec, t.Latency, t.CPUSecondsPerRequest, false)
	}
	row("overhead", 0, r.Overhead, 0, true)
	fmt.Fprintf(&b, "\np99 of each slice, median (lowest to highest):")
	for i, t := range r.Targets {
		if len(t.SliceP99US) == 0 {
			continue
		}
		lo, hi := slices.Min(t.SliceP99US), slices.Max(t.SliceP99US)
		sep := ";"
		if i == len(r.Targets)-1 {
			sep = "\n"
		}
		fmt.Fprintf(&b, " %s %s (%s to %s)%s", t.Name, us(median(t.SliceP99US)), us(lo), us(hi), sep)
	}
	for _, t := range r.Targets {
		if len(t.SliceBackground) != len(t.SliceP99US) || len(t.SliceP99US) == 0 {
			continue
		}
		var with, without []float64
		var flushes int64
		for i, bg := range t.SliceBackground {
			flushes += bg.Flushes
			if bg.compacted() {
				with = append(with, t.SliceP99US[i])
			} else {
				without = append(without, t.SliceP99US[i])
			}
		}
		fmt.Fprintf(&b, "%s: %d flushes in its slices; %d of %d slices had a compaction running", t.Name, flushes, len(with), len(t.SliceP99US))
		if len(with) > 0 && len(without) > 0 {
			fmt.Fprintf(&b, "; slice p99 median %s in those, %s in the others", us(median(with)), us(median(without)))
		}
		b.WriteString("\n")
	}
	for _, t := range r.Targets {
		rt := t.Runtime
		fmt.Fprintf(&b, "%s: goroutines waited for a core p50 %s, p99 %s, p99.9 %s; %d GC cycles, GC CPU %.1f µs/req\n",
			t.Name, us(rt.SchedLatencyUS.P50), us(rt.SchedLatencyUS.P99), us(rt.SchedLatencyUS.P999), rt.GCCycles, rt.GCCPUSecondsPerRequest*1e6)
	}
	for _, t := range r.Targets {
		if t.Commits > 0 {
			fmt.Fprintf(&b, "%s: commit path busy %.0f%%, %.1f writes a commit, %s each, %.0f%% of it waiting for the fsync\n",
				t.Name, 100*t.CommitBusy, t.WritesPerCommit, us(t.CommitMeanUS), 100*t.CommitSyncWaitShare)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// median returns the median of v, which must not be empty.
func median(v []float64) float64 {
	v = slices.Sorted(slices.Values(v))
	if len(v)%2 == 0 {
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return v[len(v)/2]
}
