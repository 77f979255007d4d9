package sim

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/admin"
	"github.com/idemkv/idemkv/examples/payments"
	"github.com/idemkv/idemkv/reconcile"
)

// A service is one process of the payments service, restarted on the
// same store after each crash: each life is a Proc of its own (a crashed
// Proc stays dead), with its own store handle, its payments.Service (the
// real handler, httpidem middleware included), and its reconciler and
// sweeper loops.
type service struct {
	pw   *payWorld
	id   int
	life int

	p      *Proc
	store  payments.Store
	svc    *payments.Service
	worker *reconcile.Worker
	audit  *admin.AuditLog
	cancel context.CancelFunc
	ledger inprocLedger // the in-process processor's, if it runs one
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// start begins a new life of s. It runs in an actor (of the world's
// chaos process) or at the start of the run.
func (s *service) start() error {
	pw := s.pw
	s.life++
	p := pw.w.NewProc(fmt.Sprintf("svc%d.%d", s.id, s.life))
	st, err := pw.backend.open(p, s.id)
	if err != nil {
		return fmt.Errorf("open the store of %s: %w", p.Name(), err)
	}
	heartbeat := time.Duration(0) // a third of the lease
	if !pw.prm.heartbeat {
		heartbeat = -1
	}
	var proc payments.Processor = &simProcessor{pw: pw, p: p, s: s}
	if pw.prm.inproc {
		if proc, err = pw.newInprocProcessor(s, p); err != nil {
			return err
		}
	}
	clock := storeTime{st, p}
	svc, err := payments.New(payments.Config{
		Store: st, Processor: proc, Lease: pw.prm.lease, CallTimeout: pw.prm.processorTimeout, Heartbeat: heartbeat, Clock: clock,
		Logger: quiet, AccountLimit: pw.prm.limit,
	})
	if err != nil {
		return err
	}
	worker, err := reconcile.New(st, flakyReconciler{pw: pw, r: svc}, &reconcile.Options{
		Clock: clock, Interval: pw.prm.interval, Grace: pw.prm.grace,
		MinBackoff: time.Second, MaxBackoff: pw.prm.maxBackoff, MaxAttempts: pw.prm.maxAttempts,
		MaxAge: pw.prm.maxAge, Timeout: time.Hour, Concurrency: 1, PerPass: 1000,
		Rand: newRand(pw.w.Rand().Uint64()), Logger: quiet,
		OnResolve: func(_ context.Context, rec idemkv.Record, v reconcile.Verdict) { pw.resolved(p, rec, v) },
	})
	if err != nil {
		return err
	}
	audit, err := admin.OpenAuditLog(filepath.Join(pw.dir, fmt.Sprintf("audit-%d.log", s.id)))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.p, s.store, s.svc, s.worker, s.audit, s.cancel = p, st, svc, worker, audit, cancel
	p.OnCrash(func() {
		cancel()
		pw.backend.crash(s.id, st)
		_ = audit.Close()
	})
	pw.w.Logf("%s: started", p.Name())
	pw.w.Go(p, func() { s.reconcileLoop(ctx, p, worker) })
	pw.w.Go(p, func() { s.sweepLoop(ctx, p, st) })
	return nil
}

// reconcileLoop is reconcile.Worker.Run on the world's time.
func (s *service) reconcileLoop(ctx context.Context, p *Proc, worker *reconcile.Worker) {
	for {
		if p.Sleep(s.pw.prm.interval) != nil {
			return
		}
		_ = worker.Pass(ctx)
	}
}

// sweepLoop drops expired records now and then.
func (s *service) sweepLoop(ctx context.Context, p *Proc, st payments.Store) {
	for {
		if p.Sleep(time.Minute) != nil {
			return
		}
		_ = s.pw.backend.sweep(ctx, st)
	}
}

// httpReply is what a client's request got back.
type httpReply struct {
	status int
	header http.Header
	body   []byte
}

// serveHTTP runs the request through the life p's handler, as an actor of
// p, and sends the reply back over the network. cancel ends the
// request's context, as a server does when the client goes away.
func (s *service) serveHTTP(p *Proc, svc *payments.Service, req *clientRequest, reply func(any, error)) {
	pw := s.pw
	ctx, cancel := context.WithCancel(context.Background())
	ctx = context.WithValue(ctx, originKey{}, req.origin)
	ctx = context.WithValue(ctx, tenantKey{}, req.tenant)
	req.gone = func() { cancel(); p.Poke() }
	pw.w.Go(p, func() {
		defer cancel()
		r := httptest.NewRequestWithContext(ctx, req.method, req.path, bytes.NewReader(req.body))
		r.Header.Set("Authorization", "Bearer "+req.tenant)
		if req.key != "" {
			r.Header.Set("Idempotency-Key", req.key)
		}
		r.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		svc.Handler().ServeHTTP(rec, r)
		if p.Dead() {
			return // a zombie: its answer never leaves
		}
		pw.checkBooks(svc, req.tenant)
		res := httpReply{status: rec.Code, header: rec.Header().Clone(), body: bytes.Clone(rec.Body.Bytes())}
		pw.w.Logf("%s: %s %s %s -> %d %s", p.Name(), req.origin, req.method, req.path, res.status, brief(res))
		pw.w.Send(pw.prm.toClient, req.from, func() { reply(res, nil) })
	})
}

// storeTime is the store's time, which serve's service and reconciler
// read (the records' times are in it), with the timers of the process p,
// which the simulation drives. It tells how far the store's time is from
// p's wall clock (idemkv.OffsetClock) where the store does.
type storeTime struct {
	store idemkv.Clock
	p     *Proc
}

func (t storeTime) Now() time.Time { return t.store.Now() }
func (t storeTime) AfterFunc(d time.Duration, f func()) (stop func() bool) {
	return t.p.AfterFunc(d, f)
}
func (t storeTime) WallOffset() time.Duration {
	if oc, ok := t.store.(idemkv.OffsetClock); ok {
		return oc.WallOffset()
	}
	return 0
}
