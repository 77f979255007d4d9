package sim

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/admin"
)

// The world's troubles: crashes and pauses of service processes, and an
// operator who settles what the reconciler escalated and evicts
// completed payments now and then.

// chaosWindow is when crashes, pauses and evictions happen.
const chaosWindow = 2 * time.Minute

func (pw *payWorld) scheduleChaos() {
	w, prm := pw.w, pw.prm
	for i := 0; i < prm.crashes; i++ {
		at := time.Duration(w.Rand().Int64N(int64(chaosWindow)))
		s := pick(w, pw.services...)
		w.At(at, pw.chaos, func() { pw.crash(s) })
	}
	for i := 0; i < prm.freezes; i++ {
		at := time.Duration(w.Rand().Int64N(int64(chaosWindow)))
		s := pick(w, pw.services...)
		w.At(at, pw.chaos, func() {
			d := pw.pauseLength()
			w.Logf("chaos: %s pauses for %v", s.p.Name(), d)
			s.p.Freeze(d)
		})
	}
	op := w.NewProc("operator")
	w.Go(op, func() { pw.operate(op) })
	checker := w.NewProc("checker")
	w.Go(checker, func() { pw.checkLoop(checker) })
}

// crash kills s's life and starts the next after a while.
func (pw *payWorld) crash(s *service) {
	if s.p.Dead() {
		return
	}
	s.p.Crash()
	down := time.Millisecond + time.Duration(pw.w.Rand().Int64N(int64(pw.prm.downMax)))
	pw.w.At(down, pw.chaos, func() {
		if err := s.start(); err != nil {
			pw.fail(err)
		}
	})
}

// onService runs fn in an actor of a live life of a random service, as
// an admin request to it would, and waits for it (false: no live service
// took it).
func (pw *payWorld) onService(from *Proc, fn func(ctx context.Context, s *service)) bool {
	w := pw.w
	s := pick(w, pw.services...)
	life := s.p
	if life.Dead() {
		return false
	}
	_, err := from.Call(context.Background(), 15*time.Second, func(reply func(any, error)) {
		w.Send(pw.prm.toServer, life, func() {
			w.Go(life, func() {
				fn(context.Background(), s)
				w.Send(pw.prm.toClient, from, func() { reply(nil, nil) })
			})
		})
	})
	return err == nil
}

// operate is the operator: every so often, settle the escalated records
// on what the processor knows (as an operator who asked its support
// would), and within the chaos window evict a completed payment.
func (pw *payWorld) operate(op *Proc) {
	w, prm := pw.w, pw.prm
	evicts := prm.evicts
	for {
		if op.Sleep(10*time.Second+time.Duration(w.Rand().Int64N(int64(20*time.Second)))) != nil {
			return
		}
		pw.onService(op, func(ctx context.Context, s *service) { pw.settleEscalated(ctx, s) })
		if evicts > 0 && w.Now().Sub(pw.start) < chaosWindow {
			var acked []*payment
			for _, p := range pw.pays {
				if p.ack != nil && p.ack.status == http.StatusCreated {
					acked = append(acked, p)
				}
			}
			if len(acked) > 0 {
				evicts--
				pay := pick(w, acked...)
				pw.onService(op, func(ctx context.Context, s *service) { pw.evict(ctx, s, pay) })
			}
		}
	}
}

// settleEscalated resolves every escalated record whose truth the
// processor knows (nothing of it that could still charge).
func (pw *payWorld) settleEscalated(ctx context.Context, s *service) {
	page, err := s.store.List(ctx, idemkv.ListRequest{Escalated: true})
	if err != nil {
		return
	}
	for _, rec := range page.Records {
		if s.p.Dead() {
			return // crashed while it asked: a zombie may not touch the world
		}
		key := rec.OperationID.StepKey("charge")
		if pw.down.live(key) > 0 {
			continue
		}
		c := pw.down.charges[key]
		charged := c != nil && !c.declined
		req := admin.ResolveRequest{Tenant: rec.ID.Tenant, Endpoint: rec.ID.Endpoint, Key: rec.ID.Key,
			Token: rec.Token, NoEffect: !charged, Note: "sim operator: the processor says charged=" + fmt.Sprint(charged)}
		if charged {
			req.Status = http.StatusCreated
		}
		req.Verify = pw.w.Rand().IntN(2) == 0
		o := &admin.ResolveOptions{Settler: s.svc, Reconciler: s.svc, Clock: s.p}
		_, err := admin.Resolve(ctx, s.store, s.audit, req, o)
		pw.w.Logf("%s: operator resolves %s/%s charged=%v verify=%v: %v", s.p.Name(), rec.ID.Tenant, rec.ID.Key, charged, req.Verify, err)
		if errors.Is(err, admin.ErrDownstreamUnknown) {
			// The processor cannot say; the operator knows, and settles
			// on their own word, as docs/operations.md tells them to.
			req.Verify = false
			_, err = admin.Resolve(ctx, s.store, s.audit, req, o)
			pw.w.Logf("%s: operator resolves %s/%s charged=%v without verify: %v", s.p.Name(), rec.ID.Tenant, rec.ID.Key, charged, err)
		}
	}
}

// evict evicts pay's record, if it is completed.
func (pw *payWorld) evict(ctx context.Context, s *service, pay *payment) {
	_, err := admin.Evict(ctx, s.store, s.audit, admin.EvictRequest{Tenant: pay.tenant, Endpoint: "POST /v1/payments",
		Key: pay.key, Reason: "sim operator"})
	pw.w.Logf("%s: operator evicts %s: %v", s.p.Name(), pay.o, err)
	if err == nil {
		pay.newEpoch()
	}
}

// checkLoop checks every half minute that nothing stays unsettled past
// the reconciler's limit without being escalated.
func (pw *payWorld) checkLoop(p *Proc) {
	prm := pw.prm
	slack := prm.grace + prm.maxBackoff + 3*prm.interval + prm.downMax + prm.lease + prm.pauseMax + 10*time.Second
	for {
		if p.Sleep(30*time.Second) != nil {
			return
		}
		pw.onService(p, func(ctx context.Context, s *service) {
			page, err := s.store.List(ctx, idemkv.ListRequest{Limit: 1000})
			if err != nil {
				return
			}
			now := s.p.Now()
			for _, rec := range page.Records {
				if age := now.Sub(rec.Created); age > prm.maxAge+slack {
					pw.fail(fmt.Errorf("%s/%s (%s) unsettled for %v, not escalated (limit %v)",
						rec.ID.Tenant, rec.ID.Key, rec.State, age, prm.maxAge))
				}
			}
		})
	}
}
