package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/tier"
	"pgregory.net/rapid"
)

// stateMachine drives a store with random sequences of claims, completions,
// releases (with and without compensations), uncertain marks, renewals,
// resolutions, escalations, reads, listings, scans, evictions, clock
// advances and reopen cycles, and checks every answer against a plain
// in-memory model of the contract, the downstream identity of each
// logical request and the moment each record was marked uncertain
// included.
func stateMachine(t *testing.T, newHarness NewHarness) {
	tier.LimitRapid()
	rapid.Check(t, func(rt *rapid.T) {
		m := newMachine(t, rt, newHarness)
		defer m.h.Close()
		rt.Repeat(map[string]func(*rapid.T){
			"claim":     m.claim,
			"complete":  m.complete,
			"release":   m.release,
			"uncertain": m.markUncertain,
			"renew":     m.renew,
			"resolve":   m.resolve,
			"escalate":  m.escalate,
			"list":      m.list,
			"scan":      m.scan,
			"evict":     m.evict,
			"get":       m.get,
			"advance":   m.advance,
			"reopen":    m.reopen,
			"sweep":     m.sweep,
			"":          m.check,
		})
	})
}

// mrec is the model's view of one record.
type mrec struct {
	state   idemkv.State
	mode    idemkv.Mode
	fp      []byte
	token   uint64
	attempt uint32
	opID    idemkv.OperationID
	// lease is the holder's lease as the live process knows it (renewals
	// included); durableLease is what a remote claim wrote to disk.
	lease, durableLease time.Time
	expires             time.Time
	result              idemkv.Result
	// effects is how many effect keys the completion set (Record.Effects).
	effects int
	// class is the retention class of the first claim; takeovers keep it.
	class string
	// escalated and note: an escalated record, and the note of an
	// uncertain one or the audit note of a resolved one.
	escalated bool
	note      string
	// marked is when the record was marked uncertain (zero in any other
	// state). looseMark: an abandoned record an escalation turned
	// uncertain, which the contract leaves unmarked or marks at the
	// escalation.
	marked    time.Time
	looseMark bool
}

// durable reports whether an in-progress record is durable: a remote
// claim always is.
func (r *mrec) durable() bool { return r.mode == idemkv.ModeRemote }

type machine struct {
	h      Harness
	recs   map[idemkv.ID]*mrec
	effect map[idemkv.ID]uint64 // token whose Complete wrote the key's effect
	comp   map[idemkv.ID]uint64 // token whose Release wrote the key's compensation
	leases []idemkv.Lease       // every lease ever acquired, stale ones too
	maxTok uint64
	// opIDs is the operation id each logical request was first given,
	// and requests the request each id was given to: every later record
	// of the request must carry the same, and no other request it.
	opIDs    map[request]idemkv.OperationID
	requests map[idemkv.OperationID]request
}

// request names a logical request: what a store derives an operation id
// from.
type request struct {
	id         idemkv.ID
	fp         string
	generation uint32
}

var modelIDs = []idemkv.ID{
	{Tenant: "t1", Endpoint: "POST /pay", Key: "a"},
	{Tenant: "t1", Endpoint: "POST /pay", Key: "b"},
	{Tenant: "t2", Endpoint: "POST /pay", Key: "a"}, // same key, other tenant
	{Tenant: "t1", Endpoint: "POST /refund", Key: "a"},
}

var modelFPs = [][]byte{{1, 0xaa}, {1, 0xbb}}

const (
	modelLease     = 30 * time.Second
	modelRetention = time.Hour
	// modelShort is the window of the "short" retention class.
	modelShort = 20 * time.Minute
)

var modelClasses = []string{"", "short"}

// window is the retention window of a model class.
func window(class string) time.Duration {
	if class == "short" {
		return modelShort
	}
	return modelRetention
}

func newMachine(t *testing.T, rt *rapid.T, newHarness NewHarness) *machine {
	h := newHarness(t, &Config{Lease: modelLease, Retention: modelRetention,
		Classes: map[string]time.Duration{"short": modelShort}})
	return &machine{h: h, recs: map[idemkv.ID]*mrec{}, effect: map[idemkv.ID]uint64{}, comp: map[idemkv.ID]uint64{},
		opIDs: map[request]idemkv.OperationID{}, requests: map[idemkv.OperationID]request{}}
}

// live returns the model record for id, treating a completed record past
// its retention as absent.
func (m *machine) live(id idemkv.ID) *mrec {
	r := m.recs[id]
	if r != nil && r.state == idemkv.StateCompleted && !m.h.Now().Before(r.expires) {
		return nil
	}
	return r
}

func (m *machine) claim(t *rapid.T) {
	id := rapid.SampledFrom(modelIDs).Draw(t, "id")
	fp := rapid.SampledFrom(modelFPs).Draw(t, "fp")
	mode := idemkv.Mode(rapid.IntRange(0, 1).Draw(t, "mode"))
	resumable := rapid.Bool().Draw(t, "resumable")
	leaseDur := rapid.SampledFrom([]time.Duration{0, 5 * time.Second, time.Minute}).Draw(t, "lease")
	class := rapid.SampledFrom(modelClasses).Draw(t, "class")
	gen := uint32(rapid.IntRange(0, 1).Draw(t, "generation"))
	c, err := m.h.Store().Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: fp, Mode: mode, Lease: leaseDur, Resumable: resumable,
		Retention: class, Generation: gen})
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	if leaseDur == 0 {
		leaseDur = modelLease
	}
	now := m.h.Now()
	r := m.live(id)
	acquire := func(next *mrec) {
		if c.Outcome != idemkv.Acquired {
			t.Fatalf("claim %v: got %v, model expects acquired", id, c.Outcome)
		}
		if c.Lease.Token <= m.maxTok {
			t.Fatalf("token %d not above every earlier token %d", c.Lease.Token, m.maxTok)
		}
		if c.Lease.Attempt != next.attempt || !c.Lease.Expires.Equal(now.Add(leaseDur)) || c.Lease.Mode != next.mode {
			t.Fatalf("lease %+v, model attempt %d mode %v", c.Lease, next.attempt, next.mode)
		}
		if next.mode == idemkv.ModeRemote && c.Lease.OperationID.IsZero() {
			t.Fatalf("remote lease without operation id")
		}
		if !next.opID.IsZero() && c.Lease.OperationID != next.opID {
			t.Fatalf("takeover changed the operation id")
		}
		if next.mode == idemkv.ModeRemote && next.opID.IsZero() {
			m.checkIdentity(t, request{id, string(fp), gen}, c.Lease.OperationID)
		}
		m.maxTok = c.Lease.Token
		next.token, next.opID = c.Lease.Token, c.Lease.OperationID
		next.state = idemkv.StateInProgress
		next.lease, next.durableLease = now.Add(leaseDur), now.Add(leaseDur)
		m.recs[id] = next
		m.leases = append(m.leases, c.Lease)
	}
	expect := func(o idemkv.Outcome) {
		if c.Outcome != o {
			t.Fatalf("claim %v fp %x: got %v, model expects %v", id, fp, c.Outcome, o)
		}
	}
	switch {
	case r == nil:
		acquire(&mrec{mode: mode, fp: fp, attempt: 1, class: class, expires: now.Add(window(class))})
	case !bytes.Equal(r.fp, fp):
		expect(idemkv.Mismatch)
		if c.Record.Result.Status != 0 || c.Record.Result.Body != nil {
			t.Fatalf("mismatch leaked the stored result")
		}
	case r.state == idemkv.StateCompleted:
		expect(idemkv.Replay)
		if !equalResult(c.Record.Result, r.result) {
			t.Fatalf("replay %+v, model %+v", c.Record.Result, r.result)
		}
	case r.state == idemkv.StateUncertain:
		expect(idemkv.Reconciling)
	case now.Before(r.lease):
		expect(idemkv.InProgress)
		if c.RetryAfter != r.lease.Sub(now) {
			t.Fatalf("retry after %v, model %v", c.RetryAfter, r.lease.Sub(now))
		}
	case !r.durable():
		next := *r
		next.mode, next.opID, next.attempt = mode, idemkv.OperationID{}, r.attempt+1
		acquire(&next)
	case mode == idemkv.ModeRemote && resumable:
		next := *r
		next.attempt++
		acquire(&next)
	default:
		expect(idemkv.Reconciling)
		r.state = idemkv.StateUncertain
		r.expires = now.Add(window(r.class))
		r.marked = now
	}
	if c.Outcome == idemkv.Reconciling {
		m.checkMarked(t, "claim", c.Record, r)
	}
}

// checkIdentity checks the operation id a new remote record of req was
// given: the one of every earlier record of req, and no other request's.
func (m *machine) checkIdentity(t *rapid.T, req request, op idemkv.OperationID) {
	if want, ok := m.opIDs[req]; ok && op != want {
		t.Fatalf("%v (fp %x, generation %d) has operation id %v, its first record had %v",
			req.id, req.fp, req.generation, op, want)
	}
	if other, ok := m.requests[op]; ok && other != req {
		t.Fatalf("%v (fp %x, generation %d) has the operation id %v of %v (fp %x, generation %d)",
			req.id, req.fp, req.generation, op, other.id, other.fp, other.generation)
	}
	m.opIDs[req], m.requests[op] = op, req
}

// checkMarked checks a record read from the store against the model's
// moment of marking.
func (m *machine) checkMarked(t *rapid.T, op string, got idemkv.Record, r *mrec) {
	switch {
	case r.state != idemkv.StateUncertain:
		if !got.Marked.IsZero() {
			t.Fatalf("%s: a %v record marked %v", op, r.state, got.Marked)
		}
	case r.looseMark:
		if !got.Marked.IsZero() && !got.Marked.Equal(r.marked) {
			t.Fatalf("%s: an escalated abandoned record marked %v, want none or %v", op, got.Marked, r.marked)
		}
	case !got.Marked.Equal(r.marked):
		t.Fatalf("%s: marked %v, model %v", op, got.Marked, r.marked)
	}
}

func equalResult(a, b idemkv.Result) bool {
	return a.Status == b.Status && a.Pointer == b.Pointer && bytes.Equal(a.Body, b.Body)
}

// pickLease draws a lease the test once held, current or stale.
func (m *machine) pickLease(t *rapid.T) (idemkv.Lease, bool) {
	if len(m.leases) == 0 {
		return idemkv.Lease{}, false
	}
	return m.leases[rapid.IntRange(0, len(m.leases)-1).Draw(t, "lease")], true
}

// holder returns the model record if l is its current holder.
func (m *machine) holder(l idemkv.Lease) *mrec {
	r := m.recs[l.ID]
	if r != nil && r.state == idemkv.StateInProgress && r.token == l.Token {
		return r
	}
	return nil
}

func (m *machine) expectFenced(t *rapid.T, op string, err error) {
	if !errors.Is(err, idemkv.ErrFenced) {
		t.Fatalf("%s: got %v, model expects ErrFenced", op, err)
	}
}

func (m *machine) complete(t *rapid.T) {
	l, ok := m.pickLease(t)
	if !ok {
		t.Skip("no lease")
	}
	res := idemkv.Result{
		Status:  rapid.SampledFrom([]int{200, 201, 402, 422}).Draw(t, "status"),
		Pointer: rapid.SampledFrom([]string{"", "/p/1"}).Draw(t, "ptr"),
	}
	if rapid.Bool().Draw(t, "body") {
		res.Body = []byte(fmt.Sprintf("body %d", l.Token))
	}
	err := m.h.Store().Complete(ctx, l, res, func(w idemkv.Effects) error {
		return w.Set(effectKey(l.ID), []byte(strconv.FormatUint(l.Token, 10)))
	})
	r := m.holder(l)
	if r == nil {
		m.expectFenced(t, "complete", err)
		return
	}
	if err != nil {
		t.Fatalf("complete: %v", err)
	}
	r.state, r.result, r.effects = idemkv.StateCompleted, res, 1
	r.expires = m.h.Now().Add(window(r.class))
	m.effect[l.ID] = l.Token
}

func effectKey(id idemkv.ID) []byte {
	return []byte(id.Tenant + "|" + id.Endpoint + "|" + id.Key)
}

// release releases a lease, current or stale, without compensations,
// with one that writes the key's compensation, or with one that writes
// it and fails.
func (m *machine) release(t *rapid.T) {
	l, ok := m.pickLease(t)
	if !ok {
		t.Skip("no lease")
	}
	var apply func(idemkv.Effects) error
	comp := rapid.SampledFrom([]string{"none", "write", "fail"}).Draw(t, "compensation")
	if comp != "none" {
		apply = func(fx idemkv.Effects) error {
			if err := fx.Set(compKey(l.ID), []byte(strconv.FormatUint(l.Token, 10))); err != nil {
				return err
			}
			if comp == "fail" {
				return errCompensation
			}
			return nil
		}
	}
	err := m.h.Store().Release(ctx, l, apply)
	switch {
	case comp == "fail" && errors.Is(err, errCompensation):
		return // nothing written, the lease as it was
	case m.holder(l) == nil:
		m.expectFenced(t, "release", err)
		return
	case comp == "fail":
		t.Fatalf("release with a failing compensation: %v, want its error", err)
	case err != nil:
		t.Fatalf("release: %v", err)
	}
	delete(m.recs, l.ID)
	if comp == "write" {
		m.comp[l.ID] = l.Token
	}
}

func compKey(id idemkv.ID) []byte {
	return []byte("comp|" + id.Tenant + "|" + id.Endpoint + "|" + id.Key)
}

func (m *machine) markUncertain(t *rapid.T) {
	l, ok := m.pickLease(t)
	if !ok {
		t.Skip("no lease")
	}
	err := m.h.Store().MarkUncertain(ctx, l, "timeout")
	r := m.holder(l)
	if r == nil {
		m.expectFenced(t, "mark uncertain", err)
		return
	}
	if err != nil {
		t.Fatalf("mark uncertain: %v", err)
	}
	r.state, r.note = idemkv.StateUncertain, "timeout"
	r.expires = m.h.Now().Add(window(r.class))
	r.marked = m.h.Now()
}

func (m *machine) renew(t *rapid.T) {
	l, ok := m.pickLease(t)
	if !ok {
		t.Skip("no lease")
	}
	d := rapid.SampledFrom([]time.Duration{time.Second, time.Minute}).Draw(t, "d")
	nl, err := m.h.Store().Renew(ctx, l, d)
	r := m.holder(l)
	if r == nil {
		m.expectFenced(t, "renew", err)
		return
	}
	if err != nil {
		t.Fatalf("renew: %v", err)
	}
	r.lease = m.h.Now().Add(d)
	if r.durable() || m.h.Config().DurableRenewals {
		r.durableLease = r.lease
	}
	if nl.Token != l.Token || !nl.Expires.Equal(r.lease) {
		t.Fatalf("renewed lease %+v, model expiry %v", nl, r.lease)
	}
}

func (m *machine) get(t *rapid.T) {
	id := rapid.SampledFrom(modelIDs).Draw(t, "id")
	got, err := m.h.Store().Get(ctx, id)
	r := m.live(id)
	if r == nil {
		if !errors.Is(err, idemkv.ErrNotFound) {
			t.Fatalf("get absent %v: %v %+v", id, err, got)
		}
		return
	}
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	if got.ID != id || got.State != r.state || got.Token != r.token || !bytes.Equal(got.Fingerprint, r.fp) ||
		got.Attempt != r.attempt || got.OperationID != r.opID || got.Mode != r.mode {
		t.Fatalf("get %v: %+v, model %+v", id, got, *r)
	}
	if r.state == idemkv.StateCompleted && (!equalResult(got.Result, r.result) || got.Effects != r.effects) {
		t.Fatalf("get result %+v with %d effects, model %+v with %d", got.Result, got.Effects, r.result, r.effects)
	}
	if got.Escalated != r.escalated || r.note != "" && got.Note != r.note {
		t.Fatalf("get %v: escalated %v note %q, model %v %q", id, got.Escalated, got.Note, r.escalated, r.note)
	}
	m.checkMarked(t, "get", got, r)
}

// sweep runs the store's expiry sweeper, if it has one. Sweeping deletes
// only what every read already treats as absent, so the model does not
// change; the next checks prove the store agrees.
func (m *machine) sweep(t *rapid.T) {
	s, ok := m.h.(Sweeper)
	if !ok {
		t.Skip("the store has no sweeper")
	}
	if err := s.Sweep(); err != nil {
		t.Fatalf("sweep: %v", err)
	}
}

func (m *machine) advance(t *rapid.T) {
	d := rapid.SampledFrom([]time.Duration{time.Second, 10 * time.Second, 31 * time.Second, 2 * time.Minute, modelShort, 2 * modelRetention}).Draw(t, "d")
	m.h.Advance(d)
}

func (m *machine) reopen(t *rapid.T) {
	m.h.Reopen()
	// Durable claims keep the lease they were written with; local claims
	// survive only in a store that persists them.
	for id, r := range m.recs {
		if r.state != idemkv.StateInProgress {
			continue
		}
		if !r.durable() && m.h.Config().VolatileLocalClaims {
			delete(m.recs, id)
		} else {
			r.lease = r.durableLease
		}
	}
}

// check runs after every step: every effect on disk is the one the model
// says its key's winning Complete wrote, and every compensation the one
// its key's last successful Release with compensations wrote.
func (m *machine) check(t *rapid.T) {
	for _, id := range modelIDs {
		m.checkData(t, "effect", effectKey(id), m.effect, id)
		m.checkData(t, "compensation", compKey(id), m.comp, id)
	}
}

// checkData checks the value key holds against the token the model says
// wrote it (written[id]), if any.
func (m *machine) checkData(t *rapid.T, what string, key []byte, written map[idemkv.ID]uint64, id idemkv.ID) {
	v, err := m.h.ReadEffect(key)
	tok, ok := written[id]
	if !ok {
		if !errors.Is(err, idemkv.ErrNotFound) {
			t.Fatalf("%s for %v that the model has not written: %q %v", what, id, v, err)
		}
		return
	}
	if err != nil || string(v) != strconv.FormatUint(tok, 10) {
		t.Fatalf("%s for %v: %q %v, model token %d", what, id, v, err, tok)
	}
}
