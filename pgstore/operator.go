package pgstore

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/idemkv/idemkv"
	"github.com/jackc/pgx/v5"
)

var (
	_ idemkv.Scanner = (*Store)(nil)
	_ idemkv.Evicter = (*Store)(nil)
)

// Scan implements idemkv.Scanner, in (tenant, endpoint, key) order along
// the primary key. Each page is a snapshot of its own.
func (s *Store) Scan(ctx context.Context, req idemkv.ScanRequest) (idemkv.ScanPage, error) {
	if err := req.Validate(); err != nil {
		return idemkv.ScanPage{}, err
	}
	if !pgText(req.Tenant) {
		return idemkv.ScanPage{}, fmt.Errorf("%w: a tenant with a NUL byte", idemkv.ErrInvalidScope)
	}
	var after *[3]string
	if req.After != "" {
		after = new([3]string)
		b, err := base64.RawURLEncoding.DecodeString(req.After)
		if err == nil {
			err = json.Unmarshal(b, after)
		}
		if err != nil || !pgText(after[0]) || !pgText(after[1]) || !pgText(after[2]) {
			return idemkv.ScanPage{}, fmt.Errorf("%w: malformed scan cursor", idemkv.ErrInvalidArgument)
		}
	}
	if err := s.open(); err != nil {
		return idemkv.ScanPage{}, err
	}
	limit := min(cmp.Or(req.Limit, 100), maxListLimit)
	q := scanStmt(&req, after, s.now(), limit)
	rows, err := s.pool.Query(ctx, q.sql, q.args...)
	if err != nil {
		return idemkv.ScanPage{}, s.dbErr("scan", err)
	}
	defer rows.Close()
	var page idemkv.ScanPage
	for rows.Next() {
		var id idemkv.ID
		rec, err := scanRecord(rowPrefix{rows, []any{&id.Tenant, &id.Endpoint, &id.Key}}, idemkv.ID{})
		if err != nil {
			return idemkv.ScanPage{}, s.dbErr("scan", err)
		}
		rec.ID = id
		page.Records = append(page.Records, rec)
	}
	if err := rows.Err(); err != nil {
		return idemkv.ScanPage{}, s.dbErr("scan", err)
	}
	if len(page.Records) == limit {
		last := page.Records[limit-1].ID
		b, _ := json.Marshal([3]string{last.Tenant, last.Endpoint, last.Key})
		page.Next = base64.RawURLEncoding.EncodeToString(b)
	}
	return page, nil
}

// evictSQL makes an evictable record absent in place (absentSQL, so that
// a claim waiting on its row takes it over with a token drawn under the
// lock) and returns it as it was: $1 now, $2-$4 id, $5 token or 0, $6
// since or NULL. The effects of a completed one stay, under its token
// (Check accepts effects whose record is absent).
var evictSQL = `UPDATE idemkv_records r SET ` + absentSQL + `
FROM (SELECT tenant, endpoint, key, ` + recordColumns + ` FROM idemkv_records
	WHERE tenant = $2 AND endpoint = $3 AND key = $4 FOR UPDATE) old
WHERE r.tenant = old.tenant AND r.endpoint = old.endpoint AND r.key = old.key
	AND ($5 = 0 OR old.token = $5)
	AND (old.state = 2 OR (old.state = 1 AND old.mode = 1 AND old.lease_expires <= $1)
		OR (old.state = 3 AND old.expires > $1))
	AND ` + notMovedSinceSQL("$6", "old.") + ` AND ($6::timestamptz IS NULL OR old.state <> 3)
RETURNING old.state, old.mode, old.fingerprint, old.token, old.attempt, old.operation_id, old.created,
	old.lease_expires, old.expires, old.class, old.status, old.pointer, old.body, old.effects, old.note, old.escalated,
	old.marked`

// Evict implements idemkv.Evicter. When nothing was evicted, a read says
// why, as of just after; if the read finds the record evictable, it
// changed in between (a holder completed it), and the eviction runs again
// on the record as it now stands.
func (s *Store) Evict(ctx context.Context, req idemkv.EvictRequest) (idemkv.Record, error) {
	if err := validateID(req.ID); err != nil {
		return idemkv.Record{}, err
	}
	if err := s.open(); err != nil {
		return idemkv.Record{}, err
	}
	var rec idemkv.Record
	err := settleRuns(func() error {
		var err error
		rec, err = s.evictOnce(ctx, req)
		return err
	})
	return rec, err
}

// evictOnce is one run of Evict: errChanged if nothing was evicted but
// the record, read just after, could be.
func (s *Store) evictOnce(ctx context.Context, req idemkv.EvictRequest) (idemkv.Record, error) {
	id := req.ID
	now := s.now()
	rec, err := scanRecord(s.pool.QueryRow(ctx, evictSQL, now, id.Tenant, id.Endpoint, id.Key, int64(req.Token), sinceArg(req.Since)), id)
	if err == nil {
		return rec, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return idemkv.Record{}, s.dbErr("evict", err)
	}
	cur, err := s.get(ctx, s.pool, id, now)
	switch {
	case err != nil:
		return idemkv.Record{}, err
	case cur.State == idemkv.StateInProgress && (cur.Mode != idemkv.ModeRemote || now.Before(cur.LeaseExpires)):
		return idemkv.Record{}, fmt.Errorf("%w: key_hash %s is in progress under a live lease", idemkv.ErrWrongState, id.Hash())
	case req.Token != 0 && cur.Token != req.Token:
		return idemkv.Record{}, fmt.Errorf("%w: token %d, record has %d", idemkv.ErrFenced, req.Token, cur.Token)
	case !req.Since.IsZero() && cur.MovedSince(req.Since):
		return idemkv.Record{}, fmt.Errorf("%w: key_hash %s: its holder renewed it or marked it after %v", idemkv.ErrFenced, id.Hash(), req.Since)
	case !req.Since.IsZero() && cur.State == idemkv.StateCompleted:
		return idemkv.Record{}, fmt.Errorf("%w: key_hash %s has completed since it was judged unsettled", idemkv.ErrFenced, id.Hash())
	}
	return idemkv.Record{}, errChanged
}
