package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/examples/payments"
	"github.com/idemkv/idemkv/reconcile"
)

// The in-process processor: what idemkv serve charges without
// --processor, a payments.Provider in the service's own process that
// keeps its charges in a ledger of its own beside the store (an engine
// on its own filesystem), restarted with the process after a crash. Its
// calls have no network to cross: the uncertainty comes from the
// Provider's own timeouts after charging. The world checks it as it
// checks the remote one: every charge it makes is counted against the
// logical payment whose request made it.

// inprocLedger is the Provider's ledger of one service: its filesystem
// outlives the process's lives, as a directory does.
type inprocLedger struct {
	mem *vfs.MemFS
}

// open opens the ledger for the life p.
func (l *inprocLedger) open(pw *payWorld, p *Proc) (*engine.Engine, error) {
	if l.mem == nil {
		l.mem = vfs.NewCrashableMem()
	}
	e, err := engine.Open("processor", &engine.Options{
		FS: l.mem, Clock: p, Rand: rand.NewChaCha8(seed32(pw.w.Rand())), NoBackgroundSweep: true,
		Logger: quietPebble{}, MinFreeDisk: -1,
		CacheSize: 1 << 20, MemTableSize: 1 << 20, ReplayCacheSize: 1 << 20, Shards: 16,
	})
	if err != nil {
		return nil, err
	}
	p.OnCrash(func() {
		l.mem = l.mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
		_ = e.Close()
	})
	return e, nil
}

// newInprocProcessor is the processor of the life p of service s: the
// Provider on its ledger, as serve opens it, seen by the world.
func (pw *payWorld) newInprocProcessor(s *service, p *Proc) (payments.Processor, error) {
	ledger, err := s.ledger.open(pw, p)
	if err != nil {
		return nil, err
	}
	prov := payments.NewProvider(payments.ProviderOptions{
		Ledger: ledger, Rand: newRand(pw.w.Rand().Uint64()), Clock: p,
		FailRate: pw.prm.unavailable, TimeoutRate: pw.prm.inprocTimeouts,
	})
	return &observedProvider{pw: pw, p: p, prov: prov}, nil
}

// observedProvider is the in-process Provider, with the world watching
// what each call charged: after every call it asks the Provider what it
// holds under the call's key, and counts a charge it has not seen before
// against the call's payment.
type observedProvider struct {
	pw   *payWorld
	p    *Proc
	prov *payments.Provider
}

func (o *observedProvider) Charge(ctx context.Context, req payments.ChargeRequest) (payments.Charge, error) {
	if o.p.Dead() {
		return payments.Charge{}, ErrCrashed
	}
	c, err := o.prov.Charge(ctx, req)
	or, _ := ctx.Value(originKey{}).(origin)
	tenant, _ := ctx.Value(tenantKey{}).(string)
	if got, found, lerr := o.prov.Lookup(context.WithoutCancel(ctx), req.Key); lerr == nil && found {
		o.pw.down.landed(req.Key, got, or, tenant)
	}
	if err != nil && !errors.Is(err, payments.ErrProviderTimeout) && !errors.Is(err, payments.ErrProviderUnavailable) {
		return c, fmt.Errorf("%w: %w", payments.ErrProviderTimeout, err)
	}
	return c, err
}

func (o *observedProvider) Lookup(ctx context.Context, key string) (payments.Charge, bool, error) {
	if o.p.Dead() {
		return payments.Charge{}, false, ErrCrashed
	}
	return o.prov.Lookup(ctx, key)
}

// flakyReconciler is the service's reconciler with, now and then, an
// answer whose writes panic: a bug in the application, which the worker
// must survive, leaving the payment to a later pass.
type flakyReconciler struct {
	pw *payWorld
	r  reconcile.Reconciler
}

func (f flakyReconciler) Reconcile(ctx context.Context, rec idemkv.Record) (reconcile.Answer, error) {
	a, err := f.r.Reconcile(ctx, rec)
	if err == nil && a.Apply != nil && f.pw.w.Rand().Float64() < f.pw.prm.applyPanics {
		f.pw.w.Logf("application: the answer about %s/%s panics as it writes", rec.ID.Tenant, rec.ID.Key)
		a.Apply = func(idemkv.Effects) error { panic("sim: the application's Apply panics") }
	}
	return a, err
}
