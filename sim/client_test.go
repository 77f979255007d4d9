package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idemkv/idemkv/httpidem"
)

// Clients: each pays a few logical payments, one idempotency key each,
// retrying every attempt that did not end in a stored outcome (timeouts,
// 409 while it runs or is reconciled, 5xx), sometimes sending a
// concurrent duplicate, and replaying some payments later: soon after
// their answer (which must come back byte for byte) and after the key's
// retention has run out (when the payment runs anew, and must still be
// charged once).

// clientRequest is one HTTP request in flight.
type clientRequest struct {
	from   *Proc
	origin origin
	tenant string
	method string
	path   string
	key    string
	body   []byte
	// gone, set once the request reached a server, tells that server the
	// client went away.
	gone func()
}

// payment is one logical payment: a key and a body, sent until it gets a
// stored outcome.
type payment struct {
	o      origin
	tenant string
	key    string
	amount int64
	body   []byte

	// epoch counts the times the payment's record was removed (evicted by
	// an operator, or expired): an answer is compared only with the
	// acknowledged answer of its own epoch.
	epoch int
	ack   *httpReply
	ackAt time.Time
}

// newEpoch starts an epoch of pay: its record is gone (evicted, or
// expired), and the next stored outcome is a new answer.
func (pay *payment) newEpoch() {
	pay.epoch++
	pay.ack = nil
}

type client struct {
	pw     *payWorld
	id     int
	p      *Proc
	tenant string
	pays   []*payment
}

func (c *client) run() {
	w, prm := c.pw.w, c.pw.prm
	if c.p.Sleep(time.Duration(w.Rand().Int64N(int64(prm.clientSpread)))) != nil {
		return
	}
	for _, pay := range c.pays {
		c.pay(pay)
	}
	c.pw.busy--
}

// pay sends pay until it gets its outcome or the client gives up.
func (c *client) pay(pay *payment) {
	w, prm := c.pw.w, c.pw.prm
	for attempt := 1; attempt <= prm.clientAttempts; attempt++ {
		if w.Rand().Float64() < prm.duplicates {
			// A duplicate from another tab or device: at once, or a
			// little later, while the attempt may still be running.
			d := time.Duration(w.Rand().Int64N(int64(3 * time.Second)))
			c.pw.busy++
			w.Go(c.p, func() {
				defer func() { c.pw.busy-- }()
				if c.p.Sleep(d) == nil {
					c.send(pay, "dup")
				}
			})
		}
		res, err := c.send(pay, fmt.Sprintf("attempt %d", attempt))
		wait, done := c.next(res, err)
		if done {
			break
		}
		if c.p.Sleep(wait) != nil {
			return
		}
	}
	if pay.ack == nil {
		return
	}
	if w.Rand().Float64() < prm.replays {
		d := time.Second + time.Duration(w.Rand().Int64N(int64(prm.retention/3)))
		c.pw.busy++
		w.Go(c.p, func() {
			defer func() { c.pw.busy-- }()
			if c.p.Sleep(d) == nil {
				c.send(pay, "replay")
			}
		})
	}
	if w.Rand().Float64() < prm.lateResends {
		// Past the retention the record is gone: the payment runs anew,
		// and must find its charge, not make another.
		d := prm.retention + 30*time.Second + time.Duration(w.Rand().Int64N(int64(time.Minute)))
		c.pw.busy++
		w.Go(c.p, func() {
			defer func() { c.pw.busy-- }()
			if c.p.Sleep(d) != nil {
				return
			}
			pay.newEpoch()
			c.pw.w.Logf("client%d: %s resends after its retention (epoch %d)", c.id, pay.o, pay.epoch)
			for i := 0; i < prm.clientAttempts; i++ {
				res, err := c.send(pay, "late")
				wait, done := c.next(res, err)
				if done || c.p.Sleep(wait) != nil {
					return
				}
			}
		})
	}
}

// send makes one attempt at a random service and returns its reply.
func (c *client) send(pay *payment, what string) (httpReply, error) {
	pw, w := c.pw, c.pw.w
	svc := pw.services[w.Rand().IntN(len(pw.services))]
	life, handler := svc.p, svc.svc
	req := &clientRequest{from: c.p, origin: pay.o, tenant: pay.tenant, method: http.MethodPost,
		path: "/v1/payments", key: pay.key, body: pay.body}
	epoch := pay.epoch
	w.Logf("client%d: %s %s to %s", c.id, pay.o, what, life.Name())
	v, err := c.p.Call(context.Background(), pw.prm.clientTimeout, func(reply func(any, error)) {
		w.Send(pw.prm.toServer, life, func() { svc.serveHTTP(life, handler, req, reply) })
	})
	if err != nil {
		if req.gone != nil {
			req.gone()
		}
		if !errors.Is(err, ErrCrashed) {
			w.Logf("client%d: %s %s: %v", c.id, pay.o, what, err)
		}
		return httpReply{}, err
	}
	res := v.(httpReply)
	pw.observe(pay, epoch, res)
	return res, nil
}

// next says what the client does after an attempt: wait and try again,
// or stop (an outcome, or an answer that retrying cannot change).
func (c *client) next(res httpReply, err error) (time.Duration, bool) {
	w, prm := c.pw.w, c.pw.prm
	backoff := prm.clientBackoff/2 + time.Duration(w.Rand().Int64N(int64(prm.clientBackoff)))
	switch {
	case errors.Is(err, ErrCrashed):
		return 0, true
	case err != nil:
		return backoff, false
	case res.status == http.StatusCreated:
		return 0, true
	case res.status == http.StatusPaymentRequired:
		return 0, true // declined (stored) or over the limit (not): final for this client
	case res.status == http.StatusConflict || res.status >= 500:
		if ra, err := strconv.Atoi(res.header.Get("Retry-After")); err == nil {
			return min(time.Duration(ra)*time.Second, prm.clientBackoff*2), false
		}
		return backoff, false
	}
	return 0, true // anything else was reported by observe
}

// stored reports whether res is a stored outcome: the payment, or a
// declined card. Every other answer (409, 5xx, 504 while the outcome is
// unknown, 402 over the limit, which holds nothing) may change.
func stored(res httpReply) bool {
	switch res.status {
	case http.StatusCreated:
		return true
	case http.StatusPaymentRequired:
		return problemType(res) == "card-declined"
	}
	return false
}

func problemType(res httpReply) string {
	var p httpidem.Problem
	if json.Unmarshal(res.body, &p) != nil {
		return ""
	}
	return strings.TrimPrefix(p.Type, httpidem.ProblemBase)
}

func brief(res httpReply) string {
	if t := problemType(res); t != "" {
		return t
	}
	if res.header.Get("Idempotent-Replayed") == "true" {
		return "replayed"
	}
	return ""
}

// observe checks an answer to pay sent in epoch: a stored outcome must be
// the first one acknowledged in its epoch, byte for byte; an answer a
// correct client never gets fails the run.
func (pw *payWorld) observe(pay *payment, epoch int, res httpReply) {
	switch res.status {
	case http.StatusCreated, http.StatusPaymentRequired, http.StatusConflict,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout, http.StatusInternalServerError:
	default:
		pw.fail(fmt.Errorf("%s got %d %s: %s", pay.o, res.status, problemType(res), res.body))
		return
	}
	if res.status == http.StatusInternalServerError {
		pw.fail(fmt.Errorf("%s got 500: %s", pay.o, res.body))
		return
	}
	if !stored(res) || epoch != pay.epoch {
		return
	}
	if pay.ack == nil {
		pay.ack, pay.ackAt = &res, pw.w.Now()
		return
	}
	if res.status != pay.ack.status || !bytes.Equal(res.body, pay.ack.body) ||
		res.header.Get("Content-Type") != pay.ack.header.Get("Content-Type") {
		pw.fail(fmt.Errorf("%s: a replay differs from the answer acknowledged at %v:\n  first: %d %s\n  now:   %d %s",
			pay.o, pay.ackAt.Sub(pw.start), pay.ack.status, pay.ack.body, res.status, res.body))
	}
}
