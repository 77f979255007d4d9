package engine

import (
	"bytes"
	"fmt"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine/internal/record"
)

// busyRetry is the RetryAfter given while a key's write is in flight: its
// outcome will be known within about one fsync.
const busyRetry = 50 * time.Millisecond

// claimCase is what a claim's answer depends on besides the request: what
// is there for its key, and the time. decideClaim turns them into the
// answer; the engine only gathers them (under the key's stripe mutex) and
// carries the decision out. It holds values, not pointers, so that a claim
// allocates nothing for it.
type claimCase struct {
	// cur is the live record for the key (a holder's slot, else the stored
	// record), if found.
	cur   idemkv.Record
	found bool
	// busy: a write of the key is in flight. durable: cur, if in progress,
	// is on disk (a remote claim): its attempt's effect may have happened
	// elsewhere.
	busy, durable bool

	now time.Time
	// lease is the lease to grant; class the retention class a new record
	// gets (already checked).
	lease time.Duration
	class string
	// expires is the end of the retention window, for a record settling
	// at now, of class (a new record) and of cur's class (a record turning
	// uncertain).
	expires, curExpires time.Time
}

// claimDecision is the answer to a claimCase.
type claimDecision struct {
	outcome idemkv.Outcome
	// rec is, for Acquired, the attempt to install: its Token is not yet
	// set, nor its OperationID unless the attempt resumes an operation
	// (the engine assigns both). For Reconciling with write set, it is the
	// uncertain record to make durable before answering. Otherwise it is
	// the record to report.
	rec idemkv.Record
	// write: rec must be written before the answer is given.
	write      bool
	retryAfter time.Duration
}

// decideClaim answers req, a claim. It is a pure function of the request
// and its case: the precedence of the answers (docs/design.md, "States and
// transitions") is written down here and nowhere else.
func decideClaim(req *idemkv.ClaimRequest, c *claimCase) claimDecision {
	now := c.now
	if !c.found {
		return claimDecision{outcome: idemkv.Acquired, rec: idemkv.Record{
			ID: req.ID, State: idemkv.StateInProgress, Mode: req.Mode,
			Fingerprint: bytes.Clone(req.Fingerprint), Attempt: 1,
			Created: now.Truncate(time.Second), LeaseExpires: now.Add(c.lease),
			Expires: c.expires, Class: c.class,
		}}
	}
	cur := c.cur
	if !bytes.Equal(cur.Fingerprint, req.Fingerprint) {
		cur.Result = idemkv.Result{} // another request's outcome is not this one's to see
		return claimDecision{outcome: idemkv.Mismatch, rec: cur}
	}
	switch cur.State {
	case idemkv.StateCompleted:
		return claimDecision{outcome: idemkv.Replay, rec: cur}
	case idemkv.StateUncertain:
		return claimDecision{outcome: idemkv.Reconciling, rec: cur}
	}
	if c.busy {
		return claimDecision{outcome: idemkv.InProgress, rec: cur, retryAfter: busyRetry}
	}
	if now.Before(cur.LeaseExpires) {
		return claimDecision{outcome: idemkv.InProgress, rec: cur, retryAfter: cur.LeaseExpires.Sub(now)}
	}

	// The lease has expired. Its holder may still be running: an expired
	// lease does not prove that it stopped.
	next := cur
	next.Token = 0
	next.Attempt = cur.Attempt + 1
	next.LeaseExpires = now.Add(c.lease)
	if !c.durable {
		// A local claim: the stale holder's effects can only commit
		// together with its outcome, under its token, which this takeover
		// fences off. Taking over is safe; the new attempt is in effect a
		// fresh one.
		next.Mode = req.Mode
		next.OperationID = idemkv.OperationID{}
		return claimDecision{outcome: idemkv.Acquired, rec: next}
	}
	// A durable remote claim: the stale attempt's downstream call may have
	// landed, or may still land. Only a caller whose downstream
	// deduplicates on the operation id may resume it; otherwise the
	// outcome is unknown.
	if req.Mode == idemkv.ModeRemote && req.Resumable {
		next.Mode = idemkv.ModeRemote
		return claimDecision{outcome: idemkv.Acquired, rec: next}
	}
	unc := cur
	unc.State = idemkv.StateUncertain
	// Its holder sends nothing once its lease has run out, which it has
	// by now: a reconciler's grace may run from here.
	unc.Marked = record.Milliseconds(now)
	unc.LeaseExpires = time.Time{}
	unc.Expires = c.curExpires
	unc.Note = fmt.Sprintf("lease of attempt %d expired before its remote outcome was recorded", cur.Attempt)
	return claimDecision{outcome: idemkv.Reconciling, rec: unc, write: true}
}
