package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/examples/payments"
	"github.com/idemkv/idemkv/httpidem"
	"github.com/idemkv/idemkv/internal/fakeclock"
)

// The demo's stage: the payments service running in process on a real
// engine and a loopback port, the network between it and the client,
// which loses a response when told to, the script of the one simulated
// processor behind it, and the client.

// startDemo opens the store, starts the service on a loopback port and
// makes the client.
func startDemo(dir string, cfg demoConfig) (*demo, error) {
	d := &demo{
		out:   cfg.out,
		dir:   dir,
		fault: cfg.fault,
		run:   randHex(2),
		// The clock starts at the real time, so records kept with --data
		// carry plausible timestamps, and then moves only when told.
		clock: fakeclock.New(time.Now().UTC().Truncate(time.Second)),
		lost:  make(chan reply, 1),
	}
	// The engine follows the demo's clock as it is (TrustClock): it is
	// set by hand on purpose, and a second run over a kept --data starts
	// it behind the time the first run reached.
	d.opts = engine.Options{Clock: d.clock, ClockTolerance: engine.TrustClock, Lease: demoLease,
		CacheSize: 8 << 20, MemTableSize: 4 << 20, ReplayCacheSize: 4 << 20}
	d.proc = payments.NewProvider(payments.ProviderOptions{Fault: d.script.fault, Clock: d.clock})
	if err := d.open(); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		d.close()
		return nil, err
	}
	d.url = "http://" + ln.Addr().String()
	_, conns := fileBudget()
	srv, cl := newServer(d, defaultLimits(demoLease, conns), nil)
	d.srv = srv
	go d.srv.Serve(cl.Listener(ln))
	// Every request on a new connection: net/http's client resends by
	// itself a request that carries an Idempotency-Key when a reused
	// connection drops before the answer, and the demo's client retries
	// by hand, where the reader sees it.
	d.client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	return d, nil
}

// stop shuts the server and closes the store.
func (d *demo) stop() {
	d.srv.Close()
	d.close()
}

// open opens the engine on d.dir and starts a payments service on it, as
// a process does when it starts.
func (d *demo) open() error {
	e, err := engine.Open(d.dir, &d.opts)
	if err != nil {
		return err
	}
	// Errors only: the narrative on stdout tells the state changes.
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	// Heartbeats off: the demo's clock moves by hand, so a holder's lease
	// runs out exactly when the demo says, as if its process had stalled
	// (a running payment renews its lease, on Go's timers, otherwise).
	svc, err := payments.New(payments.Config{Store: e, Processor: d.proc, Clock: d.clock, Events: true, Logger: log, Heartbeat: -1})
	if err != nil {
		e.Close()
		return err
	}
	d.e = e
	d.svc.Store(svc)
	d.opens++
	return nil
}

func (d *demo) ensureOpen() error {
	if d.e != nil {
		return nil
	}
	return d.open()
}

// close closes the engine, first adding its counters to d.stats. The
// service stays in place, answering 503, until the next open.
func (d *demo) close() error {
	if d.e == nil {
		return nil
	}
	if st, err := d.e.Stats(); err == nil {
		addCounters(&d.stats, st)
	}
	err := d.e.Close()
	d.e = nil
	return err
}

// restart stands for a crash and a restart of the service's process: the
// store is closed and reopened on the same directory, and a new service
// runs on it. The processor carries on.
func (d *demo) restart() error {
	if err := d.close(); err != nil {
		return err
	}
	return d.open()
}

// ServeHTTP is the network between the client and the service. It hands
// each request to the service running now and, when told to, loses the
// response: the service runs to the end, its answer goes to d.lost
// instead of the client, and the client's connection is cut.
func (d *demo) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := d.svc.Load().Handler()
	if !d.lose.CompareAndSwap(true, false) {
		h.ServeHTTP(w, r)
		return
	}
	lw := &lostWriter{reply{header: make(http.Header)}}
	h.ServeHTTP(lw, r)
	d.lost <- lw.r
	panic(http.ErrAbortHandler) // net/http closes the connection, silently
}

// lostWriter keeps a response the network loses.
type lostWriter struct{ r reply }

func (w *lostWriter) Header() http.Header { return w.r.header }

func (w *lostWriter) WriteHeader(status int) {
	if w.r.status == 0 {
		w.r.status = status
	}
}

func (w *lostWriter) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	w.r.body = append(w.r.body, b...)
	return len(b), nil
}

// script scripts the processor (payments.ProviderOptions.Fault): a
// scenario arms it for the one call it needs to stall or time out; every
// other call goes through.
type script struct {
	mu   sync.Mutex
	next func(ctx context.Context) error // the next call's fate; nil: none
}

func (s *script) fault(ctx context.Context, _ string) error {
	s.mu.Lock()
	f := s.next
	s.next = nil
	s.mu.Unlock()
	if f == nil {
		return nil
	}
	return f(ctx)
}

func (s *script) arm(f func(ctx context.Context) error) {
	s.mu.Lock()
	s.next = f
	s.mu.Unlock()
}

// timeout makes the next call charge, and then time out.
func (s *script) timeout() {
	s.arm(func(context.Context) error { return payments.ErrProviderTimeout })
}

// stall makes the next call wait, on its way to the processor, until
// release is called; reached is closed when it starts waiting.
func (s *script) stall() (reached <-chan struct{}, release func()) {
	r, gate := make(chan struct{}), make(chan struct{})
	s.arm(func(ctx context.Context) error {
		close(r)
		select {
		case <-gate:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	return r, sync.OnceFunc(func() { close(gate) })
}

// The client.

// reply is what the client got: a response, or err if none arrived.
type reply struct {
	status int
	header http.Header
	body   []byte
	err    error
}

// pay sends POST /v1/payments with key and body from d.account.
func (d *demo) pay(ctx context.Context, key, body string) reply {
	req, err := http.NewRequestWithContext(ctx, "POST", d.url+"/v1/payments", strings.NewReader(body))
	if err != nil {
		return reply{err: err}
	}
	req.Header.Set(httpidem.HeaderKey, `"`+key+`"`)
	return d.do(req)
}

func (d *demo) do(req *http.Request) reply {
	req.Header.Set("Authorization", "Bearer "+d.account)
	resp, err := d.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return reply{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b, err: err}
}

// payLost sends a payment whose response the network loses, and returns
// the response the client never got.
func (d *demo) payLost(ctx context.Context, key string) (reply, error) {
	d.lose.Store(true)
	r := d.pay(ctx, key, demoBody)
	if r.err == nil {
		return r, fmt.Errorf("the response was to be lost, but the client got %d", r.status)
	}
	// The network keeps the response before it cuts the connection, so
	// by now it is there, unless the request failed some other way.
	select {
	case lost := <-d.lost:
		d.say("network", "the connection drops before the answer: the client sees %q", r.err)
		return lost, nil
	default:
		d.lose.Store(false)
		return r, fmt.Errorf("the request failed before the service answered: %w", r.err)
	}
}

// listPayments returns d.account's payments, newest first.
func (d *demo) listPayments(ctx context.Context) ([]payments.Payment, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", d.url+"/v1/payments?limit=100", nil)
	if err != nil {
		return nil, err
	}
	r := d.do(req)
	if r.err == nil && r.status != http.StatusOK {
		r.err = fmt.Errorf("GET /v1/payments: %d %s", r.status, r.body)
	}
	var list struct {
		Data []payments.Payment `json:"data"`
	}
	if r.err == nil {
		r.err = json.Unmarshal(r.body, &list)
	}
	return list.Data, r.err
}
