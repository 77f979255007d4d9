package httpidem

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/idemkv/idemkv"
)

// msgRenewFailed is logged at Warn when a heartbeat could not renew the
// lease.
const msgRenewFailed = "httpidem: lease renewal failed"

// heartbeat keeps a running handler's lease (Route.Heartbeat). Every
// beat is an idemkv.AfterFunc callback on the middleware's clock that
// renews the lease (Store.Renew, fenced on its token) and schedules the
// next beat; there is no goroutine of its own, so a simulation whose
// clock is an idemkv.TimerClock runs the beats when it lets time pass.
//
// The invariant that stop establishes: once stop has returned, no
// renewal is running or will run. A beat that has already fired when
// stop is called is waited for (its renewal's context is cancelled, so
// the wait is short); one that has not fired never will. The settle that
// follows stop therefore never races a renewal, and the beat's callback
// has returned: nothing is left behind.
type heartbeat struct {
	p     *protected
	q     *request
	op    *Op
	every time.Duration
	// length is what each renewal asks for: the route's lease, or zero
	// for the store's default.
	length time.Duration
	// ctx is the request's, without its cancellation: each renewal
	// runs under a child of it that stop cancels.
	ctx context.Context

	mu struct {
		sync.Mutex
		// stopped is set by stop, or by a fenced renewal: no beat is
		// scheduled after it.
		stopped bool
		// cancelTimer cancels the beat scheduled last, and fired is
		// closed once its callback has returned; both nil once stop has
		// taken them.
		cancelTimer func() bool
		fired       chan struct{}
		// cancelRenewal ends the renewal in flight, if one is.
		cancelRenewal context.CancelFunc
		renewals      int
	}
}

// startHeartbeat starts keeping op's lease, or returns nil if the route
// turns heartbeats off (a nil heartbeat's stop does nothing). ctx is the
// request's, without its cancellation.
func (p *protected) startHeartbeat(ctx context.Context, q *request, op *Op) *heartbeat {
	every := p.route.Heartbeat
	if every < 0 {
		return nil
	}
	if every == 0 {
		lease := p.route.Lease
		if lease == 0 {
			// The store's default, as this lease shows it: a little
			// shorter than it is, by the claim's own latency, which
			// only makes the beats come a little early.
			lease = op.lease.Expires.Sub(p.m.clock.Now())
		}
		every = lease / 3
	}
	if every <= 0 {
		return nil // a lease already over (a clock unlike the store's): nothing to keep
	}
	// The beats log about q from their own goroutines: compute what
	// logEvent fills in lazily now, while only this goroutine sees q.
	q.keyHash()
	q.requestID()
	h := &heartbeat{p: p, q: q, op: op, ctx: ctx, every: every, length: p.route.Lease}
	h.mu.Lock()
	h.scheduleLocked()
	h.mu.Unlock()
	return h
}

// scheduleLocked arms the next beat.
// REQUIRES: h.mu held, h.mu.stopped false.
func (h *heartbeat) scheduleLocked() {
	fired := make(chan struct{})
	h.mu.fired = fired
	h.mu.cancelTimer = idemkv.AfterFunc(h.p.m.clock, h.every, func() {
		defer close(fired)
		h.beat()
	})
}

// beat renews the lease once and schedules the next beat, unless the
// heartbeat was stopped meanwhile or the renewal was fenced.
func (h *heartbeat) beat() {
	// The context is made here, not once for the request: a request
	// quicker than a beat, most of them, never pays for it.
	ctx, cancel := context.WithCancel(h.ctx)
	defer cancel()
	h.mu.Lock()
	if h.mu.stopped {
		h.mu.Unlock()
		return
	}
	h.mu.cancelRenewal = cancel
	h.mu.Unlock()
	renewed, err := h.p.m.store.Renew(ctx, h.op.Lease(), h.length)
	fenced := errors.Is(err, idemkv.ErrFenced)
	if err != nil && !h.stopped() {
		// Logged before the next beat is armed, so that stop, which
		// waits for this callback until then, also waits for the record.
		// A renewal that stop cancelled is no failure: stopped is set
		// before the cancellation.
		h.p.logEvent(ctx, h.q, slog.LevelWarn, msgRenewFailed, slog.Bool("fenced", fenced), slog.Any("err", err))
	}

	h.mu.Lock()
	defer h.mu.Unlock()
	h.mu.cancelRenewal = nil
	if h.mu.stopped {
		// The handler returned while the renewal ran: what it did no
		// longer matters (the settle is fenced on the token, not on the
		// expiry).
		return
	}
	switch {
	case err == nil:
		h.op.renewed(renewed.Expires)
		h.mu.renewals++
		h.scheduleLocked()
	case fenced:
		// Another attempt holds the key: no renewal can succeed again,
		// and the settle will be fenced too (409 lease-lost).
		h.mu.stopped = true
	default:
		h.scheduleLocked() // the store may be back by the next beat
	}
}

func (h *heartbeat) stopped() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.mu.stopped
}

// stop stops the heartbeat for good and returns how many renewals
// succeeded. Once it returns no renewal is running or will run (see
// heartbeat). It may be called more than once, and on a nil heartbeat.
func (h *heartbeat) stop() (renewals int) {
	if h == nil {
		return 0
	}
	h.mu.Lock()
	h.mu.stopped = true
	cancelTimer, fired := h.mu.cancelTimer, h.mu.fired
	h.mu.cancelTimer, h.mu.fired = nil, nil
	if h.mu.cancelRenewal != nil {
		h.mu.cancelRenewal()
	}
	h.mu.Unlock()
	if cancelTimer != nil && !cancelTimer() {
		// The beat fired: its callback runs, or is about to. Wait for
		// it, so that no renewal outlives stop.
		<-fired
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.mu.renewals
}
