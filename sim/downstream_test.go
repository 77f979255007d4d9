package sim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/reconcile"

	"github.com/idemkv/idemkv/examples/payments"
)

// The downstream: a card processor behind the network, modelled as real
// ones behave. It deduplicates charges on their idempotency key, forever
// (it is the service's retention that runs out first); it answers a
// lookup with what it has, so a charge still in flight is invisible to
// it; a charge request that lands after its caller gave up is charged all
// the same, unless (in most worlds, params.deadlines) it lands after the
// deadline it carries, by the processor's own clock, which lags the
// services' by params.lag; it refuses some calls before charging (503)
// and declines some cards (402, remembered under the key, as a processor
// replays its answer). It is the ground truth of the run: every charge it makes is
// counted against the logical payment whose request carried it.

// origin names the logical payment a request belongs to: the sim's own
// bookkeeping, carried beside the request, never seen by the processor's
// logic.
type origin struct {
	client, payment int
}

func (o origin) String() string { return fmt.Sprintf("c%d/p%d", o.client, o.payment) }

type chargeState struct {
	charge   payments.Charge
	declined bool
	origin   origin
	tenant   string
}

type downstream struct {
	pw *payWorld
	p  *Proc

	charges  map[string]*chargeState // by downstream key
	inflight map[string]int          // charge requests under way, by key
	// pending holds every charge a service has decided to send and that
	// has not landed yet, by key: on its way, or held back before the
	// send by a pause or a stall.
	pending  map[string][]*pendingCall
	byOrigin map[origin][]string // the keys charged for each payment
	made     int
}

func newDownstream(pw *payWorld) *downstream {
	return &downstream{pw: pw, p: pw.w.NewProc("processor"), charges: map[string]*chargeState{},
		inflight: map[string]int{}, pending: map[string][]*pendingCall{}, byOrigin: map[origin][]string{}}
}

// now is the processor's clock.
func (d *downstream) now() time.Time { return d.pw.w.Now().Add(-d.pw.prm.lag) }

// late reports whether a call with deadline would be refused if it
// landed now.
func (d *downstream) late(deadline time.Time) bool {
	return d.pw.prm.deadlines && !deadline.IsZero() && d.now().After(deadline)
}

// pendingCall is a charge decided and not landed.
type pendingCall struct {
	deadline time.Time // zero: none
	decided  time.Time
	from     *Proc
	// sent: it is on its way, and lands or is lost whatever happens to
	// from. One not sent is dropped when from crashes.
	sent bool
}

func (d *downstream) pend(key string, deadline time.Time, from *Proc) *pendingCall {
	c := &pendingCall{deadline: deadline, decided: d.pw.w.Now(), from: from}
	d.pending[key] = append(d.pending[key], c)
	return c
}

func (d *downstream) unpend(key string, c *pendingCall) {
	d.pending[key] = slices.DeleteFunc(d.pending[key], func(p *pendingCall) bool { return p == c })
	if len(d.pending[key]) == 0 {
		delete(d.pending, key)
	}
}

// live counts the charges under key that are decided, not landed, and
// could still charge: every one, where the processor ignores deadlines,
// else those whose deadline has not passed by its clock; never one not
// sent by a process that crashed since. One held back unsent longer than
// a pause makes the world unsafe, as its send would (sentAfter).
func (d *downstream) live(key string) int {
	n := 0
	for _, c := range d.pending[key] {
		if !c.sent && !c.from.Dead() {
			d.pw.sentAfter(d.pw.w.Now().Sub(c.decided))
		}
		if (c.sent || !c.from.Dead()) && !d.late(c.deadline) {
			n++
		}
	}
	return n
}

type chargeReply struct {
	charge      payments.Charge
	declined    bool
	unavailable bool
	expired     bool
}

// charge handles a charge request that has landed.
func (d *downstream) charge(req payments.ChargeRequest, o origin, tenant string) chargeReply {
	w := d.pw.w
	if w.Rand().Float64() < d.pw.prm.unavailable {
		w.Logf("processor: %s key %s: refused before charging (503)", o, short(req.Key))
		return chargeReply{unavailable: true}
	}
	if c, ok := d.charges[req.Key]; ok {
		w.Logf("processor: %s key %s: deduplicated (%s)", o, short(req.Key), c.charge.ID)
		return chargeReply{charge: c.charge, declined: c.declined}
	}
	if d.late(req.Deadline) {
		w.Logf("processor: %s key %s: refused, it landed after its deadline", o, short(req.Key))
		return chargeReply{expired: true}
	}
	if w.Rand().Float64() < d.pw.prm.declines {
		w.Logf("processor: %s key %s: declined", o, short(req.Key))
		d.charges[req.Key] = &chargeState{origin: o, tenant: tenant, declined: true}
		return chargeReply{declined: true}
	}
	d.made++
	c := payments.Charge{ID: fmt.Sprintf("ch_%04d", d.made), Key: req.Key, Amount: req.Amount,
		Currency: req.Currency, Description: req.Description}
	d.landed(req.Key, c, o, tenant)
	return chargeReply{charge: c}
}

// landed counts the charge c, made under key for the payment o of
// tenant, unless it was counted before: a second charge of one payment,
// under another key or under the same one (a processor that forgot it),
// fails the run, as does an account charged past its limit.
func (d *downstream) landed(key string, c payments.Charge, o origin, tenant string) {
	w := d.pw.w
	if prev, ok := d.charges[key]; ok {
		if prev.charge.ID != c.ID {
			d.pw.fail(fmt.Errorf("%s charged twice under one key %s: %s, then %s", o, short(key), prev.charge.ID, c.ID))
		}
		return
	}
	d.charges[key] = &chargeState{charge: c, origin: o, tenant: tenant}
	d.byOrigin[o] = append(d.byOrigin[o], key)
	w.Logf("processor: %s key %s: CHARGED %s %d", o, short(key), c.ID, c.Amount)
	if keys := d.byOrigin[o]; len(keys) > 1 {
		d.pw.fail(fmt.Errorf("%s charged %d times, under downstream keys %v", o, len(keys), keys))
	}
	d.checkLimit(tenant)
	for _, s := range d.pw.services {
		if !s.p.Dead() {
			d.pw.checkBooks(s.svc, tenant)
			break
		}
	}
}

func short(key string) string {
	if len(key) > 8 {
		return key[:8]
	}
	return key
}

// simProcessor is the payments.Processor of one service process: every
// call crosses the network to the downstream and back, and the caller
// waits at most the processor timeout for the answer, as
// payments.ProcessorClient does over HTTP.
type simProcessor struct {
	pw *payWorld
	p  *Proc
	s  *service // p is one of its lives
}

var _ payments.Processor = (*simProcessor)(nil)

// Charge implements payments.Processor with ProcessorClient's reading of
// the outcomes: a call not sent is ctx's error; one sent and not answered
// is ErrProviderTimeout.
func (sp *simProcessor) Charge(ctx context.Context, req payments.ChargeRequest) (payments.Charge, error) {
	if err := ctx.Err(); err != nil {
		return payments.Charge{}, err
	}
	pw, w := sp.pw, sp.pw.w
	o, _ := ctx.Value(originKey{}).(origin)
	tenant, _ := ctx.Value(tenantKey{}).(string)
	if sp.p.Dead() {
		return payments.Charge{}, ErrCrashed
	}
	d := pw.down
	pc := d.pend(req.Key, req.Deadline, sp.p)
	decided := pc.decided
	// Held back, the call ends unsent if its process crashes (its actor
	// then runs on outside the world, which it may not touch: live
	// ignores the call from then on) or its request is cancelled.
	unsent := func(err error) error {
		if !errors.Is(err, ErrCrashed) {
			d.unpend(req.Key, pc)
		}
		return err
	}
	// Between its last look at its lease and the send, either the whole
	// process stalls (a long garbage collection, a stopped VM: the
	// guide's delayed write) or only this request does (its goroutine
	// waits for a connection or a name lookup) while the rest of the
	// process runs on: its heartbeats, a retry that takes its lease over,
	// the reconciler. Never both, so that the delay stays within
	// pauseMax, which the grace of a safe world without deadlines
	// covers.
	switch u := w.Rand().Float64(); {
	case u < pw.prm.pauseBeforeSend:
		pause := pw.pauseLength()
		w.Logf("%s: %s paused %v before sending its charge", sp.p.Name(), o, pause)
		sp.p.Freeze(pause)
		if err := sp.p.Sleep(0); err != nil {
			return payments.Charge{}, unsent(err)
		}
	case u < pw.prm.pauseBeforeSend+pw.prm.stallBeforeSend:
		stall := pw.pauseLength()
		w.Logf("%s: %s stalls %v before sending its charge", sp.p.Name(), o, stall)
		if err := sp.p.Sleep(stall); err != nil {
			return payments.Charge{}, unsent(err)
		}
	}
	v, err := sp.p.Call(ctx, pw.prm.processorTimeout, func(reply func(any, error)) {
		pc.sent = true // it lands, or is lost, from here on
		d.inflight[req.Key]++
		w.Logf("%s: %s sends charge key %s", sp.p.Name(), o, short(req.Key))
		pw.sentAfter(w.Now().Sub(decided))
		delivered := w.Send(pw.prm.toDown, d.p, func() {
			d.inflight[req.Key]--
			d.unpend(req.Key, pc)
			r := d.charge(req, o, tenant)
			w.Send(pw.prm.fromDown, sp.p, func() { reply(r, nil) })
		})
		if !delivered {
			d.inflight[req.Key]--
			d.unpend(req.Key, pc)
			w.Logf("network: %s's charge key %s lost", o, short(req.Key))
		}
		if f := pw.prm.crashAfterSend; f > 0 && w.Rand().Float64() < f && sp.s.p == sp.p {
			w.Logf("chaos: %s crashes with %s's charge key %s on its way", sp.p.Name(), o, short(req.Key))
			w.At(0, pw.chaos, func() { pw.crash(sp.s) })
		}
	})
	if !pc.sent {
		unsent(err)
	}
	switch {
	case errors.Is(err, ErrCrashed):
		return payments.Charge{}, err
	case err != nil:
		w.Logf("%s: %s charge key %s: %v", sp.p.Name(), o, short(req.Key), err)
		return payments.Charge{}, fmt.Errorf("%w: %w", payments.ErrProviderTimeout, err)
	}
	r := v.(chargeReply)
	switch {
	case r.unavailable:
		return payments.Charge{}, payments.ErrProviderUnavailable
	case r.expired:
		return payments.Charge{}, payments.ErrCallExpired
	case r.declined:
		return payments.Charge{}, payments.ErrDeclined
	}
	return r.charge, nil
}

// sentAfter notes that a charge was sent d after its request decided to
// send it. Where the processor ignores deadlines, a safe world's grace
// covers one pause there (pauseMax); pauses of the process that follow
// one another (each request that pauses it pauses it anew) can hold a
// charge back longer, and from then on the grace no longer covers what
// the world does: the checks that rely on it are off for the rest of the
// run. Where it refuses late calls, no pause matters.
func (pw *payWorld) sentAfter(d time.Duration) {
	if pw.prm.safe && !pw.prm.deadlines && d > pw.prm.pauseMax {
		pw.w.Logf("world: a charge held back %v since the decision to send it, past pause_max %v: no longer safe", d, pw.prm.pauseMax)
		pw.prm.safe = false
	}
}

// Lookup implements payments.Processor: what the downstream has under key
// when the question lands.
func (sp *simProcessor) Lookup(ctx context.Context, key string) (payments.Charge, bool, error) {
	pw, w := sp.pw, sp.pw.w
	if sp.p.Dead() {
		return payments.Charge{}, false, ErrCrashed
	}
	type answer struct {
		c     payments.Charge
		found bool
	}
	v, err := sp.p.Call(ctx, pw.prm.processorTimeout, func(reply func(any, error)) {
		d := pw.down
		w.Send(pw.prm.toDown, d.p, func() {
			c, ok := d.charges[key]
			a := answer{found: ok && !c.declined}
			if a.found {
				a.c = c.charge
			}
			w.Logf("processor: lookup %s: found %v (in flight %d, could still charge %d)", short(key), a.found, d.inflight[key], d.live(key))
			w.Send(pw.prm.fromDown, sp.p, func() { reply(a, nil) })
		})
	})
	if err != nil {
		return payments.Charge{}, false, err
	}
	a := v.(answer)
	return a.c, a.found, nil
}

type originKey struct{}
type tenantKey struct{}

// checkLimit fails the run if tenant's charges passed the account limit,
// where the run's settings make the limit a promise (params.safe).
func (d *downstream) checkLimit(tenant string) {
	prm := d.pw.prm
	if prm.limit == 0 || !prm.safe {
		return
	}
	var sum int64
	for _, c := range d.charges {
		if c.tenant == tenant && !c.declined {
			sum += c.charge.Amount
		}
	}
	if sum > prm.limit {
		d.pw.fail(fmt.Errorf("%s charged %d in all, past its limit of %d", tenant, sum, prm.limit))
	}
}

// resolved checks a reconciler's resolution against the truth: it never
// says "not applied" of a payment whose charge has landed, or is decided
// and could still land and charge (on its way, or held back by a pause
// or a stall, its deadline not passed where the processor keeps them):
// the wrong answer of the first defect, which only the identity
// then saves from a second charge, and only if the client retries. Where
// the run's settings make the grace long enough to know (params.safe).
// Nor "applied" of one the processor never charged.
func (pw *payWorld) resolved(p *Proc, rec idemkv.Record, v reconcile.Verdict) {
	key := rec.OperationID.StepKey("charge")
	d := pw.down
	c := d.charges[key]
	charged := c != nil && !c.declined
	live := d.live(key)
	pw.w.Logf("%s: reconciler resolves %s/%s as %v (charged %v, in flight %d, could still charge %d)",
		p.Name(), rec.ID.Tenant, rec.ID.Key, v, charged, d.inflight[key], live)
	switch {
	case v == reconcile.Applied && !charged:
		pw.fail(fmt.Errorf("the reconciler said %s/%s was charged; the processor never charged it", rec.ID.Tenant, rec.ID.Key))
	case v == reconcile.NotApplied && (charged || live > 0) && pw.prm.safe:
		pw.fail(fmt.Errorf("the reconciler said %s/%s was not charged, while its charge had landed (%v) or could still land and charge (%d)",
			rec.ID.Tenant, rec.ID.Key, charged, live))
	}
}

// checkBooks checks, as a request ends, that tenant's account counts at
// least what the processor has charged it: a payment holds its amount
// before it charges, and gives it back only when it provably charged
// nothing, so an account that counts less than its charges has given
// back a hold still in use (the fourth defect: the room a
// concurrent payment then takes past the limit). Where the limit is a
// promise (params.safe) and set.
func (pw *payWorld) checkBooks(svc *payments.Service, tenant string) {
	if pw.prm.limit == 0 || !pw.prm.safe {
		return
	}
	var charged int64
	for _, c := range pw.down.charges {
		if c.tenant == tenant && !c.declined {
			charged += c.charge.Amount
		}
	}
	var acct payments.Account
	if err := get(svc, tenant, "/v1/account", &acct); err != nil {
		return // the store is failing: the run's other checks see to it
	}
	if acct.Spent < charged {
		pw.fail(fmt.Errorf("%s: the account counts %d spent or held, but the processor has charged it %d", tenant, acct.Spent, charged))
	}
}
