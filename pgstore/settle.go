package pgstore

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/jackc/pgx/v5"
)

// settleableSQL is the condition on a record a reconciler or an operator
// may settle under token $3 at $5: uncertain, or abandoned (a remote
// record in progress past its lease), and not moved since the moment in
// the parameter since, if it is not NULL (idemkv.Record.MovedSince).
func settleableSQL(since string) string {
	return `tenant = $6 AND endpoint = $7 AND key = $8 AND token = $3
	AND (state = 2 OR (state = 1 AND mode = 1 AND lease_expires <= $5::timestamptz))
	AND ` + notMovedSinceSQL(since, "")
}

// notMovedSinceSQL is the condition that a settleable record (its
// columns named with prefix: "" or "old.") has not moved since the moment
// in the parameter since, if it is not NULL (idemkv.Record.MovedSince).
func notMovedSinceSQL(since, prefix string) string {
	moved := `CASE WHEN ` + prefix + `state = 1 THEN ` + prefix + `lease_expires WHEN ` + prefix + `state = 2 THEN ` + prefix + `marked END`
	return `(` + since + `::timestamptz IS NULL OR ` + moved + ` IS NULL
		OR ` + moved + ` <= ` + since + `::timestamptz + interval '1 millisecond')`
}

// resolveRecSQL completes a settleable record with the reconciler's
// result ($9 status, $10 pointer, $11 body, $12 values set, $13 note, $14
// since; %s: expiresSQL); resolveNoEffectRecSQL makes it absent
// (absentSQL; $9 since).
var (
	resolveRecSQL = `
	UPDATE idemkv_records SET state = 3, escalated = false, lease_expires = NULL, expires = %s,
		status = $9, pointer = $10, body = $11, effects = $12, note = $13, marked = NULL
	WHERE ` + settleableSQL("$14") + `
	RETURNING 1`

	resolveNoEffectRecSQL = `
	UPDATE idemkv_records SET ` + absentSQL + ` WHERE ` + settleableSQL("$9") + `
	RETURNING 1`
)

// escalateSQL: $1 now, $2-$4 id, $5 token, $6 note, $7 since. An
// uncertain record keeps its expiry and the moment it was marked; an
// abandoned one is marked now, as a claim that found it would have
// marked it.
var escalateSQL = `
UPDATE idemkv_records SET escalated = true, lease_expires = NULL, note = $6,
	expires = CASE WHEN state = 2 THEN expires ELSE %s END,
	marked = CASE WHEN state = 2 THEN marked ELSE $1::timestamptz END, state = 2
WHERE tenant = $2 AND endpoint = $3 AND key = $4 AND token = $5
	AND (state = 2 OR (state = 1 AND mode = 1 AND lease_expires <= $1))
	AND ` + notMovedSinceSQL("$7", "")

// Resolve implements idemkv.Store.
func (s *Store) Resolve(ctx context.Context, req idemkv.ResolveRequest) error {
	if !req.NoEffect {
		if err := s.validateResult(&req.Result); err != nil {
			return err
		}
	}
	if err := validateSettle(req.ID, req.Note); err != nil {
		return err
	}
	if err := s.open(); err != nil {
		return err
	}
	var events int64
	err := settleRuns(func() error {
		return s.transact(ctx, req.Apply, func(fx *effects, q querier) error {
			a, err := fx.args()
			if err != nil {
				return err
			}
			now := s.now()
			id := req.ID
			since := sinceArg(req.Since)
			var row pgx.Row
			if req.NoEffect {
				row = q.QueryRow(ctx, s.sql.resolveNoEffect.pick(&a), a.args(req.Token, now, id.Tenant, id.Endpoint, id.Key, since)...)
			} else {
				r := req.Result
				if fx.result != nil {
					r = *fx.result
				}
				row = q.QueryRow(ctx, s.sql.resolve.pick(&a), a.args(req.Token, now, id.Tenant, id.Endpoint, id.Key,
					int32(r.Status), r.Pointer, r.Body, int32(len(a.setKeys)), req.Note, since)...)
			}
			var n int64
			if err := row.Scan(&n, &events, new(int64)); err != nil {
				return s.dbErr("resolve", err)
			}
			if n == 0 {
				return s.whyNotSettleable(ctx, q, id, req.Token, req.Since, now)
			}
			return nil
		})
	})
	if err == nil && events > 0 {
		s.eventsCommitted()
	}
	return err
}

// Escalate implements idemkv.Store.
func (s *Store) Escalate(ctx context.Context, req idemkv.EscalateRequest) error {
	if err := validateSettle(req.ID, req.Note); err != nil {
		return err
	}
	if err := s.open(); err != nil {
		return err
	}
	return settleRuns(func() error {
		now := s.now()
		id := req.ID
		tag, err := s.pool.Exec(ctx, s.sql.escalate, now, id.Tenant, id.Endpoint, id.Key, int64(req.Token), req.Note, sinceArg(req.Since))
		if err != nil {
			return s.dbErr("escalate", err)
		}
		if tag.RowsAffected() == 0 {
			return s.whyNotSettleable(ctx, s.pool, id, req.Token, req.Since, now)
		}
		return nil
	})
}

// sinceArg is a settling request's Since as a query argument: NULL, no
// check, when it is zero.
func sinceArg(since time.Time) *time.Time {
	if since.IsZero() {
		return nil
	}
	return &since
}

func validateSettle(id idemkv.ID, note string) error {
	if err := validateID(id); err != nil {
		return err
	}
	return validateNote(note)
}

// whyNotSettleable says why a settling write changed nothing, from the
// record as it is now: absent, completed, in progress under a live lease
// (or local), or under another token. q is the settling write's
// transaction, if it has one: the read must not wait for a second
// connection from the pool while it holds one.
func (s *Store) whyNotSettleable(ctx context.Context, q querier, id idemkv.ID, token uint64, since, now time.Time) error {
	cur, err := s.get(ctx, q, id, now)
	switch {
	case err != nil:
		return err
	case cur.State == idemkv.StateCompleted:
		return fmt.Errorf("%w: key_hash %s is completed", idemkv.ErrWrongState, id.Hash())
	case cur.State == idemkv.StateInProgress && (cur.Mode == idemkv.ModeLocal || now.Before(cur.LeaseExpires)):
		return fmt.Errorf("%w: key_hash %s is in progress under a live lease", idemkv.ErrWrongState, id.Hash())
	case cur.Token != token:
		s.counter.fenced.Add(1)
		return fmt.Errorf("%w: token %d, record has %d", idemkv.ErrFenced, token, cur.Token)
	case !since.IsZero() && cur.MovedSince(since):
		s.counter.fenced.Add(1)
		return fmt.Errorf("%w: key_hash %s: its holder renewed it or marked it after %v", idemkv.ErrFenced, id.Hash(), since)
	}
	// It is settleable now: it changed between the write and this read
	// (a holder marked it uncertain, say). The write runs again.
	return errChanged
}

// errChanged: a settling write found nothing to change, and then a
// record it may change; it runs again.
var errChanged = errors.New("pgstore: the record changed during a settling write")

// maxSettleRuns bounds the runs of a settling write that keeps finding
// the record changed.
const maxSettleRuns = 100

// settleRuns runs a settling write again while it finds the record
// changed under it.
func settleRuns(write func() error) error {
	for run := 1; ; run++ {
		err := write()
		if !errors.Is(err, errChanged) || run == maxSettleRuns {
			return err
		}
	}
}

// Get implements idemkv.Store. A completed record past its expiry is
// absent, whether or not the sweeper has deleted it yet.
func (s *Store) Get(ctx context.Context, id idemkv.ID) (idemkv.Record, error) {
	if err := validateID(id); err != nil {
		return idemkv.Record{}, err
	}
	if err := s.open(); err != nil {
		return idemkv.Record{}, err
	}
	return s.get(ctx, s.pool, id, s.now())
}

func (s *Store) get(ctx context.Context, q querier, id idemkv.ID, now time.Time) (idemkv.Record, error) {
	row := q.QueryRow(ctx, `SELECT `+recordColumns+` FROM idemkv_records
		WHERE tenant = $1 AND endpoint = $2 AND key = $3 AND NOT (state = 3 AND expires <= $4)`,
		id.Tenant, id.Endpoint, id.Key, now)
	rec, err := scanRecord(row, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return idemkv.Record{}, fmt.Errorf("%w: key_hash %s", idemkv.ErrNotFound, id.Hash())
	}
	if err != nil {
		return idemkv.Record{}, s.dbErr("get", err)
	}
	return rec, nil
}

const maxListLimit = 1000

// List implements idemkv.Store.
func (s *Store) List(ctx context.Context, req idemkv.ListRequest) (idemkv.ListPage, error) {
	if err := req.Validate(); err != nil {
		return idemkv.ListPage{}, err
	}
	if !pgText(req.Tenant) {
		return idemkv.ListPage{}, fmt.Errorf("%w: a tenant with a NUL byte", idemkv.ErrInvalidScope)
	}
	if err := s.open(); err != nil {
		return idemkv.ListPage{}, err
	}
	limit := req.Limit
	if limit == 0 {
		limit = 100
	}
	limit = min(limit, maxListLimit)
	var after *listCursor
	if req.After != "" {
		c, err := parseListCursor(req.After)
		if err != nil {
			return idemkv.ListPage{}, err
		}
		after = &c
	}
	q := listStmt(&req, after, s.now(), limit)
	rows, err := s.pool.Query(ctx, q.sql, q.args...)
	if err != nil {
		return idemkv.ListPage{}, s.dbErr("list", err)
	}
	defer rows.Close()
	var page idemkv.ListPage
	for rows.Next() {
		var id idemkv.ID
		rec, err := scanRecord(rowPrefix{rows, []any{&id.Tenant, &id.Endpoint, &id.Key}}, idemkv.ID{})
		if err != nil {
			return idemkv.ListPage{}, s.dbErr("list", err)
		}
		rec.ID = id
		page.Records = append(page.Records, rec)
	}
	if err := rows.Err(); err != nil {
		return idemkv.ListPage{}, s.dbErr("list", err)
	}
	if len(page.Records) == limit {
		last := page.Records[limit-1]
		page.Next = listCursor{Created: last.Created.UnixMicro(), Tenant: last.ID.Tenant,
			Endpoint: last.ID.Endpoint, Key: last.ID.Key}.String()
	}
	return page, nil
}

// rowPrefix scans leading columns into prefix, then the rest as asked.
type rowPrefix struct {
	pgx.Row
	prefix []any
}

func (r rowPrefix) Scan(dest ...any) error { return r.Row.Scan(append(r.prefix, dest...)...) }

// listCursor is where a List page ended.
type listCursor struct {
	Created               int64     `json:"c"`
	Tenant, Endpoint, Key string    `json:"-"`
	Parts                 [3]string `json:"id"`
}

func (c listCursor) String() string {
	c.Parts = [3]string{c.Tenant, c.Endpoint, c.Key}
	b, _ := json.Marshal(c)
	return base64.RawURLEncoding.EncodeToString(b)
}

func parseListCursor(s string) (listCursor, error) {
	var c listCursor
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		err = json.Unmarshal(b, &c)
	}
	if err != nil {
		return listCursor{}, fmt.Errorf("%w: malformed list cursor", idemkv.ErrInvalidArgument)
	}
	c.Tenant, c.Endpoint, c.Key = c.Parts[0], c.Parts[1], c.Parts[2]
	return c, nil
}
