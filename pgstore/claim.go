package pgstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/ttl"
	"github.com/jackc/pgx/v5"
)

// claimSQL claims a key in one statement: it inserts a new record, or
// replaces one that is absent to reads (completed and past its expiry), or
// takes over an expired lease where that is safe (a local claim, or a
// remote one whose caller resumes it), and otherwise writes nothing and
// reads what is there. It tries the insert only if its snapshot shows no
// record it could not take (the NOT EXISTS): ON CONFLICT DO UPDATE locks
// the row it meets even when it then updates nothing, and a lock is a
// write the commit waits to flush, so a replay would cost a WAL flush. The row comes back with written set if this claim
// wrote it. A takeover draws its token under the row's lock (in the
// update, not the VALUES that every run draws), so that tokens increase
// in the order the record is acquired.
//
// Under READ COMMITTED the ON CONFLICT arm sees the latest committed
// version of the row, but the fallback SELECT reads the statement's
// snapshot: a row committed by another claim since the snapshot was taken
// is seen by the first and not by the second, and the statement returns
// nothing. Claim then runs it again.
//
// A new record, or one that replaces an absent or local one, gets the
// request's operation id ($11); a remote takeover keeps the record's, so
// the attempt it resumes is sent downstream under the same identity.
//
// $1-$3 id, $4 fingerprint, $5 mode, $6 resumable, $7 now, $8 lease
// expiry, $9 expiry of a new record, $10 class, $11 the request's
// operation id (remote claims; NULL for local ones), $12 created.
const claimSQL = `
WITH w AS (
	INSERT INTO idemkv_records AS r (tenant, endpoint, key, state, mode, fingerprint, token, attempt,
		operation_id, created, lease_expires, expires, class)
	SELECT $1::text, $2::text, $3::text, 1, $5::smallint, $4::bytea, nextval('idemkv_tokens'), 1, $11::bytea,
		$12::timestamptz, $8::timestamptz, $9::timestamptz, $10::text
	WHERE NOT EXISTS (SELECT 1 FROM idemkv_records c WHERE c.tenant = $1 AND c.endpoint = $2 AND c.key = $3
		AND NOT ((c.state = 3 AND c.expires <= $7)
			OR (c.state = 1 AND c.lease_expires <= $7 AND c.fingerprint = $4 AND (c.mode = 0 OR ($5 = 1 AND $6)))))
	ON CONFLICT (tenant, endpoint, key) DO UPDATE SET
		state = 1,
		mode = CASE WHEN r.state = 3 OR r.mode = 0 THEN excluded.mode ELSE 1 END,
		fingerprint = excluded.fingerprint,
		token = nextval('idemkv_tokens'),
		attempt = CASE WHEN r.state = 3 THEN 1 ELSE r.attempt + 1 END,
		operation_id = CASE WHEN r.state = 3 OR r.mode = 0 THEN excluded.operation_id ELSE r.operation_id END,
		created = CASE WHEN r.state = 3 THEN excluded.created ELSE r.created END,
		lease_expires = excluded.lease_expires,
		expires = CASE WHEN r.state = 3 THEN excluded.expires ELSE r.expires END,
		class = CASE WHEN r.state = 3 THEN excluded.class ELSE r.class END,
		status = 0, pointer = '', body = NULL, effects = 0, note = '', escalated = false, marked = NULL,
		waiters = 0
	WHERE (r.state = 3 AND r.expires <= $7)
		OR (r.state = 1 AND r.lease_expires <= $7 AND r.fingerprint = excluded.fingerprint
			AND (r.mode = 0 OR ($5 = 1 AND $6)))
	RETURNING ` + recordColumns + `, true
)
SELECT * FROM w
UNION ALL
SELECT ` + recordColumns + `, false FROM idemkv_records
WHERE tenant = $1 AND endpoint = $2 AND key = $3 AND NOT EXISTS (SELECT 1 FROM w)`

// abandonedSQL turns an abandoned remote claim uncertain, marked now
// ($7): its lease ran out and the claim that found it cannot resume it.
// It checks the lease again: a Renew committed since the claim's
// snapshot keeps the record in progress.
const abandonedSQL = `
UPDATE idemkv_records SET state = 2, lease_expires = NULL, expires = $5, note = $6, marked = $7
WHERE tenant = $1 AND endpoint = $2 AND key = $3 AND token = $4 AND state = 1 AND lease_expires <= $7
RETURNING waiters, token`

// maxClaimRuns bounds the runs of claimSQL that find a row changing under
// them; each run that writes nothing and reads nothing saw a commit.
const maxClaimRuns = 100

// Claim implements idemkv.Store, in one statement (claimSQL) unless an
// abandoned remote record must first be made uncertain.
func (s *Store) Claim(ctx context.Context, req idemkv.ClaimRequest) (idemkv.Claim, error) {
	class, lease, err := s.checkClaim(&req)
	if err != nil {
		return idemkv.Claim{}, err
	}
	return s.claim(ctx, s.pool, &req, class, lease)
}

// checkClaim validates req and returns its retention class ("" for the
// default) and its lease.
func (s *Store) checkClaim(req *idemkv.ClaimRequest) (class string, lease time.Duration, err error) {
	if err := req.Validate(); err != nil {
		return "", 0, err
	}
	if err := validateID(req.ID); err != nil {
		return "", 0, err
	}
	class = req.Retention
	if class == ttl.DefaultClass {
		class = ""
	}
	if _, err := s.opts.RetentionClasses.Lookup(class); err != nil {
		return "", 0, fmt.Errorf("%w: %w", idemkv.ErrInvalidArgument, err)
	}
	if err := s.open(); err != nil {
		return "", 0, err
	}
	lease = req.Lease
	if lease == 0 {
		lease = s.opts.Lease
	}
	return class, lease, nil
}

// claim runs claimSQL on q until it writes the record or reads one that
// holds still.
func (s *Store) claim(ctx context.Context, q querier, req *idemkv.ClaimRequest, class string, lease time.Duration) (idemkv.Claim, error) {
	s.counter.claims.Add(1)
	for run := 0; run < maxClaimRuns; run++ {
		c, again, err := s.claimOnce(ctx, q, req, class, lease)
		if err != nil || !again {
			return c, err
		}
	}
	return idemkv.Claim{}, fmt.Errorf("pgstore: claim of key_hash %s: the record kept changing", req.ID.Hash())
}

// claimOnce runs claimSQL once and decides on its answer; again says that
// the row changed meanwhile and the claim must run again.
func (s *Store) claimOnce(ctx context.Context, q querier, req *idemkv.ClaimRequest, class string, lease time.Duration) (c idemkv.Claim, again bool, err error) {
	now := s.now()
	var opID []byte
	if req.Mode == idemkv.ModeRemote {
		// The logical request's identity, for a new record; a takeover
		// keeps the record's (claimSQL), and so does a record written
		// before the store derived them (its id was drawn at random).
		id := s.opIDs.Derive(req.ID, req.Fingerprint, req.Generation)
		opID = id[:]
	}
	id := req.ID
	row := q.QueryRow(ctx, claimSQL, id.Tenant, id.Endpoint, id.Key, req.Fingerprint, int16(req.Mode),
		req.Resumable, now, now.Add(lease), now.Add(s.window(class)), class, opID, now.Truncate(time.Second))
	var written bool
	cur, err := scanRecord(row, id, &written)
	if errors.Is(err, pgx.ErrNoRows) {
		return idemkv.Claim{}, true, nil
	}
	if err != nil {
		return idemkv.Claim{}, false, s.dbErr("claim", err)
	}
	if written {
		s.counter.acquired.Add(1)
		return idemkv.Claim{Outcome: idemkv.Acquired, Lease: leaseOf(&cur)}, false, nil
	}
	return s.decide(ctx, q, req, &cur, now)
}

// decide answers a claim that wrote nothing, from the record it read (the
// precedence of docs/design.md, "States and transitions", as the engine's
// decideClaim has it). A record the statement should have written (as its
// snapshot shows it) was changed since: run again.
func (s *Store) decide(ctx context.Context, q querier, req *idemkv.ClaimRequest, cur *idemkv.Record, now time.Time) (idemkv.Claim, bool, error) {
	switch {
	case cur.State == idemkv.StateCompleted && !now.Before(cur.Expires):
		return idemkv.Claim{}, true, nil
	case !bytes.Equal(cur.Fingerprint, req.Fingerprint):
		cur.Result = idemkv.Result{}
		s.counter.mismatches.Add(1)
		return idemkv.Claim{Outcome: idemkv.Mismatch, Record: *cur}, false, nil
	case cur.State == idemkv.StateCompleted:
		s.counter.replays.Add(1)
		return idemkv.Claim{Outcome: idemkv.Replay, Record: *cur}, false, nil
	case cur.State == idemkv.StateUncertain:
		return idemkv.Claim{Outcome: idemkv.Reconciling, Record: *cur}, false, nil
	case now.Before(cur.LeaseExpires):
		s.counter.inProgress.Add(1)
		return idemkv.Claim{Outcome: idemkv.InProgress, Record: *cur, RetryAfter: cur.LeaseExpires.Sub(now)}, false, nil
	case cur.Mode == idemkv.ModeLocal || req.Mode == idemkv.ModeRemote && req.Resumable:
		return idemkv.Claim{}, true, nil // a takeover the statement did not see to make
	}
	// An abandoned remote claim that this caller cannot resume: its
	// attempt's downstream call may have landed, so its outcome is
	// unknown.
	unc := *cur
	unc.State = idemkv.StateUncertain
	unc.LeaseExpires = time.Time{}
	unc.Marked = now
	unc.Expires = now.Add(s.window(cur.Class))
	unc.Note = fmt.Sprintf("lease of attempt %d expired before its remote outcome was recorded", cur.Attempt)
	id := cur.ID
	var n int64
	err := q.QueryRow(ctx, s.sql.abandoned, id.Tenant, id.Endpoint, id.Key, int64(cur.Token), unc.Expires, unc.Note, now).Scan(&n, new(int64))
	if err != nil {
		return idemkv.Claim{}, false, s.dbErr("claim: mark uncertain", err)
	}
	if n == 0 {
		return idemkv.Claim{}, true, nil
	}
	return idemkv.Claim{Outcome: idemkv.Reconciling, Record: unc}, false, nil
}

// now reads the clock at the database's precision (microseconds), so
// that what a caller is told equals what is stored.
func (s *Store) now() time.Time {
	return s.opts.Clock.Now().Truncate(time.Microsecond)
}
