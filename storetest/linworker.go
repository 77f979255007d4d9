package storetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/reconcile"
)

// linWorkerMeta marks the operations of the reconcile.Worker in a history.
const linWorkerMeta = "reconcile.Worker"

// worker runs a reconcile.Worker pass on each tick, over a store that
// records its Resolve and Escalate calls in the history. Its reconciler
// answers at random: applied (with a result naming the worker), not
// applied, or unknown; two unknowns in a row escalate a record.
func (r *linRun) worker(c int, rng *rand.Rand, tick <-chan struct{}) {
	var mu sync.Mutex // rng is not safe for concurrent use
	answer := reconcile.ReconcilerFunc(func(_ context.Context, rec idemkv.Record) (reconcile.Answer, error) {
		mu.Lock()
		v := reconcile.Verdict(rng.IntN(3))
		mu.Unlock()
		a := reconcile.Answer{Verdict: v, Reason: "the downstream does not know"}
		if v == reconcile.Applied {
			a.Result = idemkv.Result{Status: 201, Pointer: "/v1/payments/" + rec.ID.Key,
				Body: []byte(fmt.Sprintf("worker token %d", rec.Token))}
		}
		return a, nil
	})
	w, err := reconcile.New(linRecorded{Store: r.h.Store(), r: r, client: c}, answer, &reconcile.Options{
		Clock: linClock{r.h}, Grace: time.Second, MinBackoff: time.Second, MaxBackoff: 2 * time.Second,
		MaxAttempts: 2, Concurrency: 2, Rand: rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64())),
	})
	if err != nil {
		r.t.Errorf("reconcile.New: %v", err)
		return
	}
	for range tick {
		if err := w.Pass(ctx); err != nil {
			r.t.Errorf("worker pass: %v", err)
		}
	}
}

// linClock is the harness's clock, read at each call: a Reopen may replace
// the harness's store, never its clock.
type linClock struct{ h Harness }

func (c linClock) Now() time.Time { return c.h.Now() }

// linRecorded is a store whose Resolve and Escalate calls are recorded in
// the run's history as the worker's.
type linRecorded struct {
	idemkv.Store
	r      *linRun
	client int
}

func (s linRecorded) Resolve(ctx context.Context, req idemkv.ResolveRequest) error {
	in := linInput{Kind: linResolve, Key: req.ID.Key, Token: req.Token, NoEffect: req.NoEffect, Result: linResultOf(req.Result),
		Since: !req.Since.IsZero()}
	var err error
	s.r.record(s.client, in, linWorkerMeta, func() linOutput {
		if err = s.Store.Resolve(ctx, req); err != nil {
			return linErrOutput(err)
		}
		return linOutput{}
	})
	return err
}

func (s linRecorded) Escalate(ctx context.Context, req idemkv.EscalateRequest) error {
	in := linInput{Kind: linEscalate, Key: req.ID.Key, Token: req.Token, Since: !req.Since.IsZero()}
	var err error
	s.r.record(s.client, in, linWorkerMeta, func() linOutput {
		if err = s.Store.Escalate(ctx, req); err != nil {
			return linErrOutput(err)
		}
		return linOutput{}
	})
	return err
}
