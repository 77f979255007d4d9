package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/jackc/pgx/v5"
)

// localRecSQL claims and completes a local operation at once: it inserts
// the record completed, or replaces one that Claim could take (absent to
// reads, or a local claim whose lease ran out, with the same
// fingerprint), and otherwise writes nothing. A takeover keeps the
// record's creation and retention class, as Claim and Complete would. As
// claimSQL, it tries the insert only if its snapshot shows no record it
// could not take, so that a duplicate locks nothing.
//
// $3 fingerprint, $5 now, $6-$8 id, $9 class, $10 created, $11 expiry of
// a new record, $12 status, $13 pointer, $14 body, $15 the count of
// values set; $1, $2 and $4 are the data writes' (dataSQL). The expiry of
// a takeover is its class's window from now (%s: expiresSQL).
const localRecSQL = `
	INSERT INTO idemkv_records AS r (tenant, endpoint, key, state, mode, fingerprint, token, attempt,
		created, expires, class, status, pointer, body, effects)
	SELECT $6::text, $7::text, $8::text, 3, 0, $3::bytea, nextval('idemkv_tokens'), 1, $10::timestamptz,
		$11::timestamptz, $9::text, $12::int, $13::text, $14::bytea, $15::int
	WHERE NOT EXISTS (SELECT 1 FROM idemkv_records c WHERE c.tenant = $6 AND c.endpoint = $7 AND c.key = $8
		AND NOT ((c.state = 3 AND c.expires <= $5)
			OR (c.state = 1 AND c.mode = 0 AND c.lease_expires <= $5 AND c.fingerprint = $3)))
	ON CONFLICT (tenant, endpoint, key) DO UPDATE SET
		state = 3, mode = 0,
		fingerprint = excluded.fingerprint,
		token = nextval('idemkv_tokens'),
		attempt = CASE WHEN r.state = 3 THEN 1 ELSE r.attempt + 1 END,
		operation_id = NULL,
		created = CASE WHEN r.state = 3 THEN excluded.created ELSE r.created END,
		lease_expires = NULL,
		expires = CASE WHEN r.state = 3 THEN excluded.expires ELSE %s END,
		class = CASE WHEN r.state = 3 THEN excluded.class ELSE r.class END,
		status = excluded.status, pointer = excluded.pointer, body = excluded.body,
		effects = excluded.effects, note = '', escalated = false, marked = NULL, waiters = 0
	WHERE (r.state = 3 AND r.expires <= $5)
		OR (r.state = 1 AND r.mode = 0 AND r.lease_expires <= $5 AND r.fingerprint = excluded.fingerprint)
	RETURNING ` + recordColumns

// localResultSQL ends the statement: the record it wrote, or the one that
// is there (as claimSQL reads it), with the events stored and a zero
// (the watchers notified, which a local record has none of). %s are the
// two counts: "0, 0" without events.
const localResultSQL = `
SELECT ` + recordColumns + `, true, %s FROM rec
UNION ALL
SELECT ` + recordColumns + `, false, 0, 0 FROM idemkv_records
WHERE tenant = $6 AND endpoint = $7 AND key = $8 AND NOT EXISTS (SELECT 1 FROM rec)`

// newLocalSQL builds the variants of RunLocal's statement.
func newLocalSQL(o *Options) writeSQL {
	head := "WITH rec AS (" + fmt.Sprintf(localRecSQL, expiresOf(o, "$5", "r.class")) + "),"
	return buildWriteSQL(head, "(SELECT token FROM rec)", func(events bool) string {
		if events {
			return eventsSQL(16) + fmt.Sprintf(localResultSQL, "(SELECT count(*) FROM evs), 0::bigint")
		}
		return fmt.Sprintf(localResultSQL, "0::bigint, 0::bigint")
	})
}

// RunLocal runs a local operation in one statement: it runs apply, then
// claims req and commits the outcome r (or the result apply sets through
// idemkv.ResultSetter) with apply's writes and events, all in one
// transaction of one statement. It returns the claim: Acquired if the
// outcome committed (Claim.Record is the completed record, Claim.Lease
// the lease its writes were made under), or what Claim would have
// returned otherwise (Replay, InProgress, Mismatch, Reconciling), and then
// nothing apply wrote is kept. If apply returns an error, nothing is
// written and the error is returned.
//
// It does what Claim and then Complete do for a local operation, in one
// round trip and one commit instead of two each. The price is that apply
// runs before the claim is known, even for a duplicate: the Effects
// contract allows it (an apply function may run more than once and does
// nothing but read and write through Effects), but a function with any
// other effect must go through Claim and Complete.
//
// An apply function that reads (Effects.Get) needs the read check of
// Complete's transaction: RunLocal then runs Claim and Complete instead
// (releasing the claim if Complete fails), so such a function runs once
// more than it would there.
func (s *Store) RunLocal(ctx context.Context, req idemkv.ClaimRequest, r idemkv.Result, apply func(idemkv.Effects) error) (idemkv.Claim, error) {
	if req.Mode != idemkv.ModeLocal {
		return idemkv.Claim{}, fmt.Errorf("%w: RunLocal of a claim in mode %v", idemkv.ErrInvalidArgument, req.Mode)
	}
	class, _, err := s.checkClaim(&req)
	if err != nil {
		return idemkv.Claim{}, err
	}
	if err := s.validateResult(&r); err != nil {
		return idemkv.Claim{}, err
	}
	fx := s.newEffects(ctx)
	fx.blind = true
	if apply != nil {
		err := apply(fx)
		if fx.readRefused { // whatever apply made of errReads
			return s.runLocalInTwo(ctx, req, r, apply)
		}
		if err != nil {
			return idemkv.Claim{}, err
		}
	}
	if fx.result != nil {
		r = *fx.result
	}
	a, err := fx.args()
	if err != nil {
		return idemkv.Claim{}, err
	}
	s.counter.claims.Add(1)
	// It reads nothing of apply's, so a failure to serialize is never a
	// conflict of the caller's (maxBlindRuns), and is not a run of the
	// claim that found the record changing (maxClaimRuns).
	for run, conflicts := 0, 0; run < maxClaimRuns; {
		c, again, err := s.runLocalOnce(ctx, conflicts, &req, class, r, &a)
		if errors.Is(err, errSerialization) {
			if conflicts++; conflicts == maxBlindRuns {
				return idemkv.Claim{}, fmt.Errorf("pgstore: a local operation that read nothing failed to serialize %d times in a row", conflicts)
			}
			continue
		}
		if err != nil || !again {
			return c, err
		}
		run++
	}
	return idemkv.Claim{}, fmt.Errorf("pgstore: claim of key_hash %s: the record kept changing", req.ID.Hash())
}

// runLocalOnce runs RunLocal's statement once (run counts the failures
// to serialize before); again says that the record changed meanwhile and
// the statement must run again; errSerialization, that it failed to
// serialize (after a pause) and must run again.
func (s *Store) runLocalOnce(ctx context.Context, run int, req *idemkv.ClaimRequest, class string, r idemkv.Result, a *writeArgs) (c idemkv.Claim, again bool, err error) {
	now := s.now()
	id := req.ID
	args := []any{a.setKeys, a.setVals, req.Fingerprint, a.delKeys, now, id.Tenant, id.Endpoint, id.Key,
		class, now.Truncate(time.Second), now.Add(s.window(class)), int32(r.Status), r.Pointer, r.Body, int32(len(a.setKeys))}
	if len(a.topics) > 0 {
		args = append(args, a.topics, a.entities, a.payloads, a.headers, a.eventIDs)
	}
	var (
		written bool
		events  int64
	)
	q := s.blind(len(a.setKeys)+len(a.delKeys) > 0)
	cur, err := scanRecord(q.QueryRow(ctx, s.sql.local.pick(a), args...), id, &written, &events, new(int64))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return idemkv.Claim{}, true, nil
	case serialization(err):
		// SERIALIZABLE (it writes data): another claim of the key, or a
		// write of its data, committed since the statement's snapshot.
		s.counter.conflicts.Add(1)
		if perr := pauseAfterConflict(ctx, run+1); perr != nil {
			return idemkv.Claim{}, false, perr
		}
		return idemkv.Claim{}, true, errSerialization
	case err != nil:
		return idemkv.Claim{}, false, s.dbErr("run local", err)
	case written:
		s.counter.acquired.Add(1)
		s.completed(events)
		return idemkv.Claim{Outcome: idemkv.Acquired, Record: cur, Lease: idemkv.Lease{ID: id, Mode: idemkv.ModeLocal,
			Token: cur.Token, Attempt: cur.Attempt}}, false, nil
	}
	return s.decide(ctx, s.pool, req, &cur, now)
}

// errSerialization: RunLocal's statement failed to serialize.
var errSerialization = errors.New("pgstore: failed to serialize")

// errReads stops an apply function that reads inside RunLocal.
var errReads = errors.New("pgstore: RunLocal's apply function reads: it runs as Claim and Complete")

// runLocalInTwo runs a local operation as Claim, then Complete.
func (s *Store) runLocalInTwo(ctx context.Context, req idemkv.ClaimRequest, r idemkv.Result, apply func(idemkv.Effects) error) (idemkv.Claim, error) {
	c, err := s.Claim(ctx, req)
	if err != nil || c.Outcome != idemkv.Acquired {
		return c, err
	}
	if err := s.Complete(ctx, c.Lease, r, apply); err != nil {
		_ = s.Release(context.WithoutCancel(ctx), c.Lease, nil)
		return idemkv.Claim{}, err
	}
	// The outcome has committed: what follows only fills in the answer.
	if rec, err := s.Get(context.WithoutCancel(ctx), req.ID); err == nil {
		c.Record = rec
	}
	return c, nil
}
