package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/jackc/pgx/v5"
)

// The holder's writes: each a compare-and-set on the record's token, in
// one statement (a Complete whose apply function read: in the transaction
// its reads began).

// completeRecSQL stores the outcome if the record is still in progress
// under the holder's token ($3): $6-$8 the id, $9 status, $10 pointer,
// $11 body, $12 the count of values set. The expiry is the record's
// class's window from now (%s: expiresSQL).
const completeRecSQL = `
	UPDATE idemkv_records SET state = 3, lease_expires = NULL, expires = %s,
		status = $9, pointer = $10, body = $11, effects = $12
	WHERE tenant = $6 AND endpoint = $7 AND key = $8 AND token = $3 AND state = 1
	RETURNING waiters, token`

// expiresSQL returns the SQL expression of a record's expiry when it
// settles at the time parameter at ("$5"): its class's window from then.
// Class names are [a-z0-9_-] (package ttl), so they can be written into
// the statement.
func expiresSQL(o *Options, at string) string { return expiresOf(o, at, "class") }

// expiresOf is expiresSQL of the class in the column reference class.
func expiresOf(o *Options, at, class string) string {
	var b []byte
	b = fmt.Appendf(b, "(%s::timestamptz + (CASE %s WHEN '' THEN %d", at, class, o.Retention.Microseconds())
	for _, n := range o.RetentionClasses.Names() {
		b = fmt.Appendf(b, " WHEN '%s' THEN %d", n, o.RetentionClasses[n].Microseconds())
	}
	return string(fmt.Appendf(b, " ELSE %d END) * INTERVAL '1 microsecond')", o.RetentionClasses.Longest().Microseconds()))
}

// Complete implements idemkv.Store. The outcome, the effects and the
// events commit in one transaction; it returns once PostgreSQL has
// committed it (as durably as the server's synchronous_commit makes a
// commit: docs/operations.md).
func (s *Store) Complete(ctx context.Context, l idemkv.Lease, r idemkv.Result, apply func(idemkv.Effects) error) error {
	if err := validateLease(&l); err != nil {
		return err
	}
	if err := s.validateResult(&r); err != nil {
		return err
	}
	if err := s.open(); err != nil {
		return err
	}
	var events int64
	err := s.transact(ctx, apply, func(fx *effects, q querier) (err error) {
		events, err = s.writeOutcome(ctx, q, l, r, fx)
		return err
	})
	if err != nil {
		return err
	}
	s.completed(events)
	return nil
}

// writeOutcome runs the statement that completes l's record with r (or
// the result fx's run set) and fx's writes and events, and returns how
// many events it stored.
func (s *Store) writeOutcome(ctx context.Context, q querier, l idemkv.Lease, r idemkv.Result, fx *effects) (events int64, err error) {
	if fx.result != nil {
		r = *fx.result
	}
	a, err := fx.args()
	if err != nil {
		return 0, err
	}
	var n int64
	err = q.QueryRow(ctx, s.sql.complete.pick(&a), a.args(l.Token, s.now(), l.ID.Tenant, l.ID.Endpoint, l.ID.Key,
		int32(r.Status), r.Pointer, r.Body, int32(len(a.setKeys)))...).Scan(&n, &events, new(int64))
	if err != nil {
		return 0, s.dbErr("complete", err)
	}
	if n == 0 {
		return 0, s.fenced(l)
	}
	return events, nil
}

// completed counts a committed completion and wakes the relay if it
// stored events.
func (s *Store) completed(events int64) {
	s.counter.completed.Add(1)
	if events > 0 {
		s.eventsCommitted()
	}
}

// absentSQL makes a record absent to every read without deleting its
// row: completed, expired long ago (before any time a concurrent call
// read), with nothing of its outcome. The sweeper deletes it in time. A claim waiting on a row that another
// transaction deletes inserts its own row when the delete commits, with
// the token and lease it computed before it waited, which may be lower
// than the token of a holder acquired meanwhile; a row made absent in
// place is instead taken over under its lock, with a token drawn there.
const absentSQL = `state = 3, escalated = false, lease_expires = NULL, expires = '1970-01-01 00:00:00+00',
	status = 0, pointer = '', body = NULL, effects = 0, note = '', marked = NULL`

// releaseRecSQL makes the holder's record absent (absentSQL) if it is
// still in progress under the holder's token ($3; $6-$8 the id). It
// returns the commit's time ($5) too: nothing else in a release without
// events names $5, and PostgreSQL refuses a statement with a parameter
// whose type it cannot tell.
const releaseRecSQL = `
	UPDATE idemkv_records SET ` + absentSQL + `
	WHERE tenant = $6 AND endpoint = $7 AND key = $8 AND token = $3 AND state = 1
	RETURNING $5::timestamptz AS at, waiters, token`

// releaseBareSQL is a release without compensations: $1-$3 the id, $4
// the token.
const releaseBareSQL = `UPDATE idemkv_records SET ` + absentSQL + `
	WHERE tenant = $1 AND endpoint = $2 AND key = $3 AND token = $4 AND state = 1
	RETURNING waiters, token`

// Release implements idemkv.Store: the record becomes absent (absentSQL)
// if the lease still holds it, and its compensations (apply) commit in
// the same statement, written only if the record changed.
func (s *Store) Release(ctx context.Context, l idemkv.Lease, apply func(idemkv.Effects) error) error {
	if err := validateLease(&l); err != nil {
		return err
	}
	if err := s.open(); err != nil {
		return err
	}
	if apply != nil {
		return s.releaseWith(ctx, l, apply)
	}
	var n int64
	err := s.pool.QueryRow(ctx, s.sql.releaseBare, l.ID.Tenant, l.ID.Endpoint, l.ID.Key, int64(l.Token)).Scan(&n, new(int64))
	if err != nil {
		return s.dbErr("release", err)
	}
	if n == 0 {
		return s.fenced(l)
	}
	return nil
}

// releaseWith is Release with compensations.
func (s *Store) releaseWith(ctx context.Context, l idemkv.Lease, apply func(idemkv.Effects) error) error {
	var events int64
	err := s.transact(ctx, apply, func(fx *effects, q querier) error {
		if fx.result != nil { // as the engine's Effects refuse it
			return fmt.Errorf("%w: a release stores no result (SetResult in its apply function)", idemkv.ErrInvalidArgument)
		}
		a, err := fx.args()
		if err != nil {
			return err
		}
		var n int64
		err = q.QueryRow(ctx, s.sql.release.pick(&a), a.args(l.Token, s.now(), l.ID.Tenant, l.ID.Endpoint, l.ID.Key)...).
			Scan(&n, &events, new(int64))
		if err != nil {
			return s.dbErr("release", err)
		}
		if n == 0 {
			return s.fenced(l)
		}
		return nil
	})
	if err == nil && events > 0 {
		s.eventsCommitted()
	}
	return err
}

// MarkUncertain implements idemkv.Store.
func (s *Store) MarkUncertain(ctx context.Context, l idemkv.Lease, note string) error {
	if err := validateLease(&l); err != nil {
		return err
	}
	if err := validateNote(note); err != nil {
		return err
	}
	if err := s.open(); err != nil {
		return err
	}
	var n int64
	err := s.pool.QueryRow(ctx, s.sql.uncertain, s.now(), l.ID.Tenant, l.ID.Endpoint, l.ID.Key, int64(l.Token), note).Scan(&n, new(int64))
	if err != nil {
		return s.dbErr("mark uncertain", err)
	}
	if n == 0 {
		return s.fenced(l)
	}
	return nil
}

// markUncertainSQL: $1 now, $2-$4 id, $5 token, $6 note. The record is
// marked now (Record.Marked): its holder sends nothing downstream after
// it.
const markUncertainSQL = `UPDATE idemkv_records SET state = 2, lease_expires = NULL, expires = %s, note = $6, marked = $1
	WHERE tenant = $2 AND endpoint = $3 AND key = $4 AND token = $5 AND state = 1
	RETURNING waiters, token`

// Renew implements idemkv.Store. The renewed lease is stored: every
// process sharing the database sees it.
func (s *Store) Renew(ctx context.Context, l idemkv.Lease, d time.Duration) (idemkv.Lease, error) {
	if err := validateLease(&l); err != nil {
		return idemkv.Lease{}, err
	}
	if d < 0 {
		return idemkv.Lease{}, fmt.Errorf("%w: negative lease %v", idemkv.ErrInvalidArgument, d)
	}
	if d == 0 {
		d = s.opts.Lease
	}
	if err := s.open(); err != nil {
		return idemkv.Lease{}, err
	}
	row := s.pool.QueryRow(ctx, `UPDATE idemkv_records SET lease_expires = $5
		WHERE tenant = $1 AND endpoint = $2 AND key = $3 AND token = $4 AND state = 1
		RETURNING `+recordColumns, l.ID.Tenant, l.ID.Endpoint, l.ID.Key, int64(l.Token), s.now().Add(d))
	rec, err := scanRecord(row, l.ID)
	if errors.Is(err, pgx.ErrNoRows) {
		return idemkv.Lease{}, s.fenced(l)
	}
	if err != nil {
		return idemkv.Lease{}, s.dbErr("renew", err)
	}
	return leaseOf(&rec), nil
}
