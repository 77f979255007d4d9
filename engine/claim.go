package engine

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/idemkv/idemkv"
)

// Claim implements idemkv.Store. The answer is decideClaim's, on the
// record found under the key's stripe mutex. A local claim is held in
// memory; a remote claim, and a claim that finds an expired remote lease
// and turns the record uncertain, write their record with a synced write
// before they return.
func (e *Engine) Claim(ctx context.Context, req idemkv.ClaimRequest) (idemkv.Claim, error) {
	if err := req.Validate(); err != nil {
		return idemkv.Claim{}, err
	}
	if err := e.writable(); err != nil {
		return idemkv.Claim{}, err
	}
	if err := e.gate.begin(ctx); err != nil {
		return idemkv.Claim{}, err
	}
	defer e.gate.exit()
	class, err := e.claimClass(req.Retention)
	if err != nil {
		return idemkv.Claim{}, err
	}
	e.counters.claims.Add(1)
	// An HMAC, computed before the lock, and used only if the claim
	// starts a new remote operation.
	opID := e.operationID(&req)
	k := appendRecordKey(nil, req.ID)
	st := e.table.stripe(k)
	now := e.clock.Now()
	c := claimCase{now: now, lease: cmp.Or(req.Lease, e.opts.Lease), class: class, expires: e.expiresAt(now, class)}

	d, s, err := e.decide(st, k, &req, &c, opID)
	if err != nil {
		return idemkv.Claim{}, err
	}
	switch {
	case d.outcome == idemkv.Acquired:
		var prev *idemkv.Record // the stored record a takeover replaces
		if c.found && c.durable {
			prev = &c.cur
		}
		return e.acquired(st, k, s, prev, &d.rec)
	case d.write:
		// An expired remote lease turns uncertain: its record is on disk.
		if err := e.commitRecord(st, k, s, &c.cur, &d.rec, nil); err != nil {
			return idemkv.Claim{}, err
		}
	}
	e.counters.count(d.outcome)
	return idemkv.Claim{Outcome: d.outcome, Record: d.rec, RetryAfter: d.retryAfter}, nil
}

// decide looks k up under its stripe mutex and decides the claim. For
// Acquired it returns the holder's slot; for a decision that writes, k's
// slot marked busy for the write.
func (e *Engine) decide(st *stripe, k []byte, req *idemkv.ClaimRequest, c *claimCase, opID idemkv.OperationID) (claimDecision, *slot, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	cur, s, found, err := e.lookupLocked(st, k, c.now)
	if err != nil {
		return claimDecision{}, nil, err
	}
	if c.cur, c.found = cur, found; found {
		c.cur.ID = req.ID
		c.busy, c.durable = s != nil && s.busy, s == nil || s.durable
		c.curExpires = e.expiresAt(c.now, c.cur.Class)
	}
	d := decideClaim(req, c)
	switch {
	case d.outcome == idemkv.Acquired:
		s, err = e.acquireLocked(st, k, &d.rec, opID, c.now)
	case d.write:
		s = e.table.beginWriteLocked(st, k, s, c.cur)
	}
	return d, s, err
}

// acquireLocked gives rec, the attempt decideClaim chose, its token and
// operation id, and installs it as k's slot, busy if it is a remote claim
// that must be written. While the store is unhealthy or the disk is low
// on space it refuses with ErrUnhealthy or ErrNoSpace instead: new work,
// or resumed work, would write where writes cannot flush or find space.
//
// REQUIRES: st.mu held.
func (e *Engine) acquireLocked(st *stripe, k []byte, rec *idemkv.Record, opID idemkv.OperationID, now time.Time) (*slot, error) {
	if err := e.health.check(); err != nil {
		return nil, err
	}
	if e.disk.lowAt(now) {
		e.counters.diskRefusals.Add(1)
		return nil, fmt.Errorf("%w (less than %d bytes free)", idemkv.ErrNoSpace, e.opts.MinFreeDisk)
	}
	var err error
	if rec.Token, err = e.nextToken(); err != nil {
		return nil, err
	}
	if rec.Mode == idemkv.ModeRemote && rec.OperationID.IsZero() {
		rec.OperationID = opID
	}
	return e.table.installHolderLocked(st, k, *rec, rec.Mode == idemkv.ModeRemote, now), nil
}

// acquired finishes a claim that acquired k's slot s for rec, replacing
// prev, the record stored under k (nil: none): a remote claim precedes a
// remote call, so it is made durable before the caller may make that call
// (or a retry after a restart would call downstream again blind).
func (e *Engine) acquired(st *stripe, k []byte, s *slot, prev, rec *idemkv.Record) (idemkv.Claim, error) {
	if rec.Mode == idemkv.ModeRemote {
		if err := e.commitClaim(st, k, s, prev, rec); err != nil {
			return idemkv.Claim{}, err
		}
	}
	if rec.Attempt > 1 {
		e.counters.takeovers.Add(1)
	}
	e.counters.count(idemkv.Acquired)
	return idemkv.Claim{Outcome: idemkv.Acquired, Lease: leaseOf(rec)}, nil
}

// commitClaim makes rec, the remote claim held in k's busy slot s,
// durable in place of prev (nil: none stored), and then lets others see
// it.
func (e *Engine) commitClaim(st *stripe, k []byte, s *slot, prev, rec *idemkv.Record) (err error) {
	defer e.abandonOnPanic(s, &err)
	b := e.db.NewBatch()
	e.putPending(b, k, prev, rec)
	_ = b.Set(k, e.encodeRecord(nil, k, rec), nil)
	err = e.commits.commit(b)
	_ = b.Close()
	if err != nil {
		err = e.fail(fmt.Errorf("engine: durable claim: %w", err))
		s.abandonWrite()
		return err
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	s.durable = true
	s.clearBusy()
	return nil
}

// operationID is the downstream identity a remote claim gets if it
// starts a new operation: derived from the request under the store's
// secret, so that every claim of one logical request (after a release,
// an eviction or an expiry too) gets the same one, and a downstream that
// deduplicates on it absorbs a late call of an earlier attempt. A
// takeover resumes the stored id instead.
func (e *Engine) operationID(req *idemkv.ClaimRequest) idemkv.OperationID {
	if req.Mode != idemkv.ModeRemote {
		return idemkv.OperationID{}
	}
	return e.opIDs.Derive(req.ID, req.Fingerprint, req.Generation)
}

func leaseOf(r *idemkv.Record) idemkv.Lease {
	return idemkv.Lease{ID: r.ID, Mode: r.Mode, Token: r.Token, Expires: r.LeaseExpires,
		Attempt: r.Attempt, OperationID: r.OperationID}
}
