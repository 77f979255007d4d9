package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/examples/payments"
	"github.com/idemkv/idemkv/reconcile"
	"github.com/idemkv/idemkv/saga"
)

func init() {
	register(&command{
		name:    "serve",
		args:    "[--addr ADDR] [--api-keys FILE] [--metrics-addr ADDR] [--admin-addr ADDR [--admin-token-file FILE] [--admin-audit-log FILE] [--admin-allow-remote]] [--data DIR] [--wait D] [--lease D] [--provider-latency D] [--provider-fail-rate F] [--provider-timeout-rate F] [--processor URL] [--processor-timeout D] [--reconcile-interval D] [--reconcile-grace D] [--reconcile-max-attempts N] [--reconcile-max-age D] [--events nats://HOST:PORT|embedded] [--account-limit N] [--gomaxprocs N] [--background-nice N] [--log-format json|text] [--log-level LEVEL]",
		summary: "run the payments service: POST /v1/payments protected by Idempotency-Key (docs/http.md)",
		flags:   serveFlags,
	})
}

// serveConfig is what the serve flags set.
type serveConfig struct {
	addr     string
	dir      string
	wait     time.Duration
	lease    time.Duration
	provider payments.ProviderOptions
	bg       backgroundFlags
	// apiKeys is the API keys file; "" is demo mode, loopback only.
	apiKeys string
	// metricsAddr, if set, serves /metrics there instead of on addr;
	// metricsLn is its listener.
	metricsAddr string
	metricsLn   net.Listener
	// adminAddr, if set, serves the admin API there (adminLn), with the
	// token in adminTokenFile or the environment (serveadmin.go).
	adminAddr, adminTokenFile string
	adminAuditLog             string
	adminRemote               bool
	adminLn                   net.Listener
	// adminLimits, if set, replaces the admin server's limits,
	// defaultLimits(adminCallTime, adminConns): tests shorten its
	// timeouts rather than wait them out.
	adminLimits *serverLimits
	// reconcile configures the worker that settles uncertain payments.
	reconcile reconcile.Options
	// processorURL, if set, is an idemkv processor to charge over HTTP
	// instead of the simulation in this process, which keeps its charges
	// under dir/processor (openSimulator). The command requires it with
	// store (requireProcessor); serve itself does not, so that a test may
	// run one process on a PostgreSQL store with the simulation.
	processorURL     string
	processorTimeout time.Duration
	// events, if set, is where payments.created events go: a NATS
	// server's URL, or "embedded" (events.go).
	events string
	// accountLimit is payments.Config.AccountLimit.
	accountLimit int64
	// store, if set, is a PostgreSQL connection string: the service keeps
	// its store there (package pgstore) instead of in dir.
	store string
	// log shapes the service's log (servelog.go).
	log logFlags
}

func serveFlags(fs *flag.FlagSet) func(context.Context, io.Writer) error {
	var c serveConfig
	fs.StringVar(&c.addr, "addr", "127.0.0.1:8080", "listen on `ADDR`")
	fs.StringVar(&c.apiKeys, "api-keys", "", "authenticate callers with the API keys in `FILE` (\"SECRET ACCOUNT\" lines, mode 600); without it the service runs in demo mode, where any bearer token is its account, and only on a loopback address")
	fs.StringVar(&c.metricsAddr, "metrics-addr", "", "serve /metrics on `ADDR` (a private or loopback address: metrics are not authenticated) instead of on --addr")
	fs.StringVar(&c.adminAddr, "admin-addr", "", "serve the admin API (package admin) and the operator's console (/console/) on `ADDR`, a loopback address unless --admin-allow-remote; off by default")
	fs.StringVar(&c.adminTokenFile, "admin-token-file", "", "the admin API's bearer token is in `FILE` (default: the environment's "+adminTokenEnv+")")
	fs.StringVar(&c.adminAuditLog, "admin-audit-log", "", "record the admin API's resolves and evictions in `FILE` (JSON lines; default DIR/audit.log with --data; with --store, resolve and evict answer 404 without it)")
	fs.BoolVar(&c.adminRemote, "admin-allow-remote", false, "let --admin-addr be other than loopback (the token then crosses the network in the clear)")
	fs.StringVar(&c.dir, "data", "idemkv-data", "keep the store in `DIR` (Pebble, this process's alone), and the simulated card processor's charges in DIR/processor")
	fs.StringVar(&c.store, "store", "", "keep the store in the PostgreSQL database at `URL` (postgres://USER@HOST:PORT/DB?...), which several serve processes may share, instead of under --data; requires --processor")
	fs.DurationVar(&c.wait, "wait", 0, "how long a duplicate of a payment still running, in this process or (with --store) in any sharing the database, waits for its outcome before a 409 (0: answer 409 at once)")
	fs.DurationVar(&c.lease, "lease", 0, "how long a payment may run before a retry may take it over and resume the same charge (default: the store's, 30s)")
	fs.DurationVar(&c.provider.Latency, "provider-latency", 0, "time each call to the simulated card processor (the one in this process, without --processor) takes")
	fs.Float64Var(&c.provider.FailRate, "provider-fail-rate", 0, "fraction of processor calls refused before charging (the client gets 503 and may retry)")
	fs.Float64Var(&c.provider.TimeoutRate, "provider-timeout-rate", 0, "fraction of processor calls that charge and then time out (the payment is uncertain, and its retries get 409, until the reconciler has asked the processor, --reconcile-grace after the timeout)")
	fs.StringVar(&c.processorURL, "processor", "", "charge the card processor at `URL` (an idemkv processor) over HTTP instead of the simulated one in this process; the --provider flags then do not apply. Required with --store")
	fs.DurationVar(&c.processorTimeout, "processor-timeout", 5*time.Second, "give up on a call to --processor after `D`: the payment is then uncertain until reconciled. Every call carries a deadline (Charge-Deadline) at most this far ahead, after which the processor refuses it")
	fs.DurationVar(&c.reconcile.Interval, "reconcile-interval", time.Second, "how often the reconciler looks for uncertain and abandoned payments and asks the processor about them")
	fs.DurationVar(&c.reconcile.Grace, "reconcile-grace", 10*time.Second, "how long the reconciler leaves a payment before it asks the processor about it: counted from when it was marked uncertain, or, for one whose holder vanished, from when its lease ran out (a call sent just before may still land). Keep it above --processor-timeout, plus how far the processor's clock may lag this store's: a call can then no longer charge when the processor is asked")
	fs.IntVar(&c.reconcile.MaxAttempts, "reconcile-max-attempts", 20, "escalate a payment to an operator after `N` answers of \"unknown\" in a row")
	fs.DurationVar(&c.reconcile.MaxAge, "reconcile-max-age", 24*time.Hour, "escalate a payment still unsettled this long after it was first tried")
	fs.StringVar(&c.events, "events", "", "publish a payments.created event for every payment, from the store's outbox, to the NATS JetStream server at `URL` (nats://HOST:PORT), or to one started in this process with its store under --data (embedded); without it no events are kept")
	fs.Int64Var(&c.accountLimit, "account-limit", 0, "refuse (402 limit-exceeded) a payment that would take its account's payments past `N` minor units in all; 0: no limit (GET /v1/account shows what is spent)")
	c.bg.register(fs, true)
	c.log.register(fs)
	return func(ctx context.Context, stdout io.Writer) error {
		if err := c.log.validate(); err != nil {
			return usageError{err}
		}
		if err := validEventsFlag(c.events); err != nil {
			return usageError{err}
		}
		if err := validStoreFlag(c.store); err != nil {
			return usageError{err}
		}
		if err := requireProcessor(c); err != nil {
			return usageError{err}
		}
		for _, r := range []float64{c.provider.FailRate, c.provider.TimeoutRate, c.provider.FailRate + c.provider.TimeoutRate} {
			if !(r >= 0 && r <= 1) { // NaN too
				return usageError{errors.New("--provider-fail-rate and --provider-timeout-rate are fractions, and together at most 1")}
			}
		}
		if c.processorTimeout <= 0 {
			return usageError{errors.New("--processor-timeout must be positive")}
		}
		if c.processorURL != "" {
			if _, err := payments.NewProcessorClient(c.processorURL, c.processorTimeout, nil); err != nil {
				return usageError{err}
			}
		}
		r := c.reconcile
		if c.provider.Latency < 0 || c.wait < 0 || c.lease < 0 || c.processorTimeout < 0 ||
			r.Interval <= 0 || r.Grace < 0 || r.MaxAttempts < 1 || r.MaxAge <= 0 || c.accountLimit < 0 {
			return usageError{errors.New("durations and --account-limit may not be negative; --reconcile-interval, --reconcile-max-attempts and --reconcile-max-age must be positive")}
		}
		if err := c.bg.validate(); err != nil {
			return usageError{err}
		}
		if c.apiKeys == "" && !isLoopback(c.addr) {
			return usageError{fmt.Errorf("--addr %s is not a loopback address: give --api-keys FILE (without it any bearer token acts as its account)", c.addr)}
		}
		if c.adminAddr != "" && !c.adminRemote && !isLoopback(c.adminAddr) {
			return usageError{fmt.Errorf("--admin-addr %s is not a loopback address (give --admin-allow-remote to serve it there anyway)", c.adminAddr)}
		}
		ln, err := net.Listen("tcp", c.addr)
		if err != nil {
			return err
		}
		if c.metricsAddr != "" {
			if c.metricsLn, err = net.Listen("tcp", c.metricsAddr); err != nil {
				ln.Close()
				return err
			}
		}
		if c.adminAddr != "" {
			if c.adminLn, err = net.Listen("tcp", c.adminAddr); err != nil {
				ln.Close()
				if c.metricsLn != nil {
					c.metricsLn.Close()
				}
				return err
			}
		}
		return serve(ctx, ln, c, stdout)
	}
}

// service is what serve runs on its listeners: the store, the payments
// service on it, its reconciler, and the simulated processor's ledger
// when the service charges that one (nil otherwise).
type service struct {
	st     servedStore
	demo   bool // no API keys: any bearer token is its account
	svc    *payments.Service
	rw     *reconcile.Worker
	ledger *engine.Engine
}

// close closes the ledger and then the store; the service and its
// reconciler must have stopped.
func (s *service) close() error {
	var err error
	if s.ledger != nil {
		if err = s.ledger.Close(); err != nil {
			err = fmt.Errorf("closing the simulated card processor's ledger: %w", err)
		}
	}
	return errors.Join(err, s.st.store.Close())
}

// serve runs the payments service on ln until ctx is done, then shuts
// down gracefully: requests in flight finish and their outcomes are
// stored before the store closes.
func serve(ctx context.Context, ln net.Listener, c serveConfig, stdout io.Writer) error {
	log := c.log.logger()
	s, err := c.openService(ctx, log)
	if err != nil {
		c.closeListeners(ln)
		return err
	}
	errLog := slog.NewLogLogger(log.Handler(), slog.LevelWarn)
	servers, errc, stop, err := c.startServers(ln, s, log, errLog, stdout)
	if err != nil {
		c.closeListeners(ln)
		return errors.Join(err, s.close())
	}
	select {
	case err = <-errc: // a listener failed: stop the others too
	case <-ctx.Done():
	}
	// In-flight requests finish: each server bounds a handler's time
	// (WriteTimeout: the lease, --wait and some), and shutdown waits that
	// long. A second signal ends the process at once (main).
	grace := 30 * time.Second
	for _, srv := range servers {
		grace = max(grace, srv.WriteTimeout+5*time.Second)
	}
	log.Info("serve: stopping; in-flight requests finish first", "up_to", grace.String())
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	for _, srv := range servers {
		if serr := srv.Shutdown(sctx); errors.Is(serr, context.DeadlineExceeded) {
			err = errors.Join(err, fmt.Errorf("requests still running after %v were cut off: their keys are retried or reconciled", grace))
		} else {
			err = errors.Join(err, serr)
		}
	}
	cancel()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	stop()
	return errors.Join(err, s.close())
}

// closeListeners closes ln and the metrics and admin listeners, for a
// serve that stops before its servers own them.
func (c *serveConfig) closeListeners(ln net.Listener) {
	ln.Close()
	if c.metricsLn != nil {
		c.metricsLn.Close()
	}
	if c.adminLn != nil {
		c.adminLn.Close()
	}
}

// openService opens the store, the processor and the payments service
// on them, and the reconciler. On an error nothing is left open.
func (c *serveConfig) openService(ctx context.Context, log *slog.Logger) (*service, error) {
	st, err := c.openStore(ctx)
	if err != nil {
		return nil, err
	}
	s := &service{st: st}
	if err := c.openPayments(s, log); err != nil {
		return nil, errors.Join(err, s.close())
	}
	return s, nil
}

// openPayments opens s's processor, payments service and reconciler on
// its store.
func (c *serveConfig) openPayments(s *service, log *slog.Logger) error {
	var keys *payments.APIKeys
	if c.apiKeys != "" {
		var err error
		if keys, err = payments.LoadAPIKeys(c.apiKeys); err != nil {
			return err
		}
	}
	s.demo = keys == nil
	var proc payments.Processor
	var err error
	if c.processorURL != "" {
		proc, err = payments.NewProcessorClient(c.processorURL, c.processorTimeout, nil)
	} else {
		proc, s.ledger, err = c.openSimulator(s.st.store)
	}
	if err != nil {
		return err
	}
	if grace := cmp.Or(c.reconcile.Grace, reconcile.DefaultGrace); grace <= c.processorTimeout {
		log.Warn("--reconcile-grace is not above --processor-timeout: a payment left uncertain by a failed call may be asked about while that call can still charge, and be charged without its payment if its client does not retry",
			"reconcile_grace", grace, "processor_timeout", c.processorTimeout)
	}
	e := s.st.store
	if oc, ok := e.(idemkv.OffsetClock); ok {
		if lead := -oc.WallOffset(); lead > 0 {
			log.Warn("the store's time runs ahead of this host's clock, which was set back: the reconciler waits the lead out before it asks about a payment (idemkv clock --follow-wall ends it, once the clock is right)",
				"lead", lead.Round(time.Second).String())
		}
	}
	s.svc, err = payments.New(payments.Config{
		Store: e, Processor: proc, Wait: c.wait, Lease: c.lease, CallTimeout: c.processorTimeout, Logger: log, APIKeys: keys,
		NoMetricsRoute: c.metricsLn != nil, Events: c.events != "", AccountLimit: c.accountLimit,
	})
	if err != nil {
		return err
	}
	reg := s.svc.Registry()
	if err := registerStoreMetrics(reg, e); err != nil {
		return err
	}
	if prio := s.st.prio; prio != nil {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "idemkv_low_priority_compactions_total",
			Help: "Compactions run at the lowered priority of --background-nice.",
		}, func() float64 { return float64(prio.Lowered()) }))
	}
	s.rw, err = newReconciler(e, s.svc, c.reconcile, log, reg)
	return err
}

// running is a server and the listener it serves.
type running struct {
	srv *http.Server
	ln  net.Listener
}

// startServers starts the public server on ln, the metrics and admin
// servers on their listeners, the reconciler and the event relay. It
// returns the servers, where they report a failure to serve, and stop,
// which stops the reconciler and the relay once the servers are shut
// down. On an error it leaves nothing running and closes no listener.
func (c *serveConfig) startServers(ln net.Listener, s *service, logger *slog.Logger, errLog *log.Logger, stdout io.Writer) ([]*http.Server, <-chan error, func(), error) {
	lease := c.lease
	if lease == 0 {
		lease = s.st.lease
	}
	srv, cl := newServer(s.svc.Handler(), defaultLimits(lease+c.wait, s.st.maxConns), errLog)
	run := []running{{srv, cl.Listener(ln)}}
	c.banner(stdout, run[0].ln.Addr(), s.st, s.demo)
	if c.metricsLn != nil {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", s.svc.MetricsHandler())
		msrv, mcl := newServer(mux, defaultLimits(0, metricsConns), errLog)
		run = append(run, running{msrv, mcl.Listener(c.metricsLn)})
		fmt.Fprintf(stdout, "idemkv: metrics on http://%s/metrics\n", c.metricsLn.Addr())
	}
	closeAudit := func() {}
	if c.adminLn != nil {
		asrv, aln, ca, err := c.adminServerFor(s, logger, errLog)
		if err != nil {
			return nil, nil, nil, err
		}
		closeAudit = ca
		run = append(run, running{asrv, aln})
		fmt.Fprintf(stdout, "idemkv: admin API on http://%s (idemkv inspect|list|pending|resolve|evict|export|check|sweep|backup --server http://%s)\n", aln.Addr(), aln.Addr())
		fmt.Fprintf(stdout, "idemkv: operator's console on http://%s/console/ (sign in with the admin token)\n", aln.Addr())
	}
	stopReconciler := startReconciler(s.rw, s.svc.Orders(), logger)
	stopEvents := func() {}
	if c.events != "" {
		var err error
		if stopEvents, err = startEvents(*c, s.st.store, logger, s.svc.Registry(), stdout); err != nil {
			stopReconciler()
			closeAudit()
			return nil, nil, nil, err
		}
	}
	errc := make(chan error, len(run))
	servers := make([]*http.Server, len(run))
	for i, r := range run {
		servers[i] = r.srv
		go func() { errc <- r.srv.Serve(r.ln) }()
	}
	stop := func() {
		stopReconciler()
		stopEvents()
		closeAudit()
	}
	return servers, errc, stop, nil
}

// requireProcessor refuses --store without --processor: the simulated
// processor lives in one process, with its charges under that process's
// --data, so the processes sharing a store would each charge their own,
// and ask their own whether a payment another one charged was charged.
func requireProcessor(c serveConfig) error {
	switch {
	case c.store != "" && c.processorURL == "":
		return errors.New("--store needs --processor URL: the simulated card processor lives in one serve process, " +
			"so processes sharing a store would each charge, and ask, their own; run idemkv processor and give its URL to every serve")
	case c.store != "" && c.events == "embedded":
		return errors.New("--store needs --events nats://HOST:PORT, not embedded: the processes sharing a store share its outbox, " +
			"and each event would go to whichever process's own broker took it; run one NATS JetStream server and give its URL to every serve")
	}
	return nil
}

// simulatorDir is where, under --data, the simulated processor keeps its
// charges.
const simulatorDir = "processor"

// openSimulator opens the simulated card processor of c.provider on a
// ledger of its own, an engine under DIR/processor: a processor's charges
// outlive a restart of serve, as a remote processor's do, so that the
// reconciler asking about a payment whose answer was lost before a
// restart finds its charge instead of hearing "never charged" and letting
// the retry charge again. The caller closes the ledger.
// Its clock is the store's, which the calls' deadlines are in.
func (c *serveConfig) openSimulator(clock idemkv.Clock) (payments.Processor, *engine.Engine, error) {
	dir := filepath.Join(c.dir, simulatorDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, err
	}
	e, err := engine.Open(dir, &engine.Options{CacheSize: 8 << 20, MemTableSize: 4 << 20, ReplayCacheSize: 1 << 20})
	if err != nil {
		return nil, nil, fmt.Errorf("the simulated card processor's ledger: %w", err)
	}
	o := c.provider
	o.Ledger, o.Clock = e, clock
	return payments.NewProvider(o), e, nil
}

// banner prints what serve runs: where, with what store and limits, the
// processor, demo mode, a first request to try, and the reconciler.
func (c *serveConfig) banner(stdout io.Writer, addr net.Addr, st servedStore, demo bool) {
	fmt.Fprintf(stdout, "idemkv: payments service on http://%s (store %s; at most %d connections; GOMAXPROCS %d%s)\n",
		addr, st.describe, st.maxConns, runtime.GOMAXPROCS(0), st.note)
	if c.processorURL != "" {
		fmt.Fprintf(stdout, "idemkv: charging the card processor at %s (calls give up after %v)\n", c.processorURL, c.processorTimeout)
	} else {
		fmt.Fprintf(stdout, "idemkv: charging the simulated card processor in this process (its charges kept in %s)\n", filepath.Join(c.dir, simulatorDir))
	}
	if demo {
		fmt.Fprintln(stdout, "idemkv: demo mode: any bearer token is taken as its account (give --api-keys FILE to authenticate)")
	}
	fmt.Fprintf(stdout, "try: curl -si -X POST http://%s/v1/payments -H 'Authorization: Bearer acct_1' -H 'Idempotency-Key: order-1' -d '{\"amount\":5000,\"currency\":\"USD\",\"card\":\"tok_123\"}'\n", addr)
	fmt.Fprintf(stdout, "idemkv: reconciling uncertain payments every %v (escalated after %d unknown answers or %v; list them with idemkv pending --escalated)\n",
		c.reconcile.Interval, c.reconcile.MaxAttempts, c.reconcile.MaxAge)
}

// newReconciler is the reconcile.Worker that settles the service's
// uncertain and abandoned payments and order steps by asking its
// processor (startReconciler runs it).
func newReconciler(e payments.Store, svc *payments.Service, o reconcile.Options, log *slog.Logger, reg prometheus.Registerer) (*reconcile.Worker, error) {
	o.Clock = e    // engine time, which the records' times are in
	o.Logger = log // an escalation is an Error record: settle it with idemkv resolve
	orders := svc.Orders()
	o.Handles = func(rec idemkv.Record) bool { return !orders.Owns(rec) } // orders resume below
	// A settled authorization goes on with its order at once, instead of
	// when the order's lease runs out.
	o.OnResolve = func(ctx context.Context, rec idemkv.Record, _ reconcile.Verdict) { orders.Wake(ctx, rec) }
	w, err := reconcile.New(e, svc, &o)
	if err != nil {
		return nil, err
	}
	if err := registerReconcileMetrics(reg, w); err != nil {
		return nil, err
	}
	return w, nil
}

// startReconciler runs w, and resumes the orders a crash left at w's
// interval; the function it returns stops both and waits for them.
func startReconciler(w *reconcile.Worker, orders *saga.Runner, log *slog.Logger) func() {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = w.Run(ctx) })
	wg.Go(func() {
		t := time.NewTicker(w.Interval())
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if n, err := orders.Resume(ctx); err != nil && ctx.Err() == nil {
				log.Warn("resuming orders failed, will retry", "err", err)
			} else if n > 0 {
				log.Info("resumed orders a crash or an unknown outcome had stopped", "orders", n)
			}
		}
	})
	return sync.OnceFunc(func() {
		cancel()
		wg.Wait()
	})
}

// metricsConns caps the connections of the metrics address: scrapers are
// few.
const metricsConns = 16

// isLoopback reports whether addr (host:port) can only be reached from
// this machine.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// registerReconcileMetrics exports the reconciler's counts (its Stats) on
// reg: its passes, its answers by verdict, the reconciler's errors, the
// settling writes it lost to another, and the store errors it met.
func registerReconcileMetrics(reg prometheus.Registerer, w *reconcile.Worker) error {
	counter := func(name, help string, value func(reconcile.Stats) int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(value(w.Stats())) })
	}
	answers := func(verdict string, value func(reconcile.Stats) int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "idemkv_reconcile_answers_total",
			Help: "Answers of the reconciler, by verdict (errors, panics and timeouts count as unknown).", ConstLabels: prometheus.Labels{"verdict": verdict}},
			func() float64 { return float64(value(w.Stats())) })
	}
	for _, c := range []prometheus.Collector{
		counter("idemkv_reconcile_passes_total", "Passes of the reconciler over the records awaiting reconciliation.", func(s reconcile.Stats) int64 { return s.Passes }),
		answers("applied", func(s reconcile.Stats) int64 { return s.Applied }),
		answers("not_applied", func(s reconcile.Stats) int64 { return s.NotApplied }),
		answers("unknown", func(s reconcile.Stats) int64 { return s.Unknown }),
		counter("idemkv_reconcile_errors_total", "Reconciler calls that failed, panicked or timed out.", func(s reconcile.Stats) int64 { return s.Errors }),
		counter("idemkv_reconcile_panics_total", "Panics recovered in the reconciler, its answers' writes and its hooks (the record stays unsettled).", func(s reconcile.Stats) int64 { return s.Panics }),
		counter("idemkv_reconcile_lost_total", "Settling writes that found the record settled by another (its holder, an operator).", func(s reconcile.Stats) int64 { return s.Lost }),
		counter("idemkv_reconcile_store_errors_total", "Listings and settling writes that failed in the store (retried at the next pass).", func(s reconcile.Stats) int64 { return s.StoreErrors }),
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
