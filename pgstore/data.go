package pgstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/idemkv/idemkv"
	"github.com/jackc/pgx/v5"
)

// Business data outside an operation: reads, scans and standalone
// transactions (Update), and the SQL-native way to complete an operation
// with a service's own statements (CompleteTx).

// GetData returns the value last committed under key through
// idemkv.Effects; the slice is the caller's. Errors: idemkv.ErrNotFound,
// idemkv.ErrInvalidArgument (a malformed key), idemkv.ErrClosed, or a
// database error.
func (s *Store) GetData(ctx context.Context, key []byte) ([]byte, error) {
	if err := idemkv.ValidateEffectKey(key); err != nil {
		return nil, err
	}
	if err := s.open(); err != nil {
		return nil, err
	}
	var v []byte
	err := s.pool.QueryRow(ctx, `SELECT v FROM idemkv_data WHERE k = $1`, key).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: data key %q", idemkv.ErrNotFound, key)
	}
	if err != nil {
		return nil, s.dbErr("read data", err)
	}
	return v, nil
}

// ScanData calls fn for each value written through Effects whose key
// starts with prefix, in key order, until fn returns false.
func (s *Store) ScanData(ctx context.Context, prefix []byte, fn func(key, value []byte) bool) error {
	return s.ScanDataAfter(ctx, prefix, nil, fn)
}

// scanPage is how many values one query of a scan reads.
const scanPage = 256

// ScanDataAfter is ScanData resuming after the key after, which must
// start with prefix; nil starts at the beginning. It reads in pages, each
// its own snapshot: keys written meanwhile are seen if they sort after
// the page being read.
func (s *Store) ScanDataAfter(ctx context.Context, prefix, after []byte, fn func(key, value []byte) bool) error {
	if err := idemkv.ValidateDataScan(prefix, after); err != nil {
		return err
	}
	if err := s.open(); err != nil {
		return err
	}
	lower, strict := prefix, false
	if after != nil {
		lower, strict = after, true
	}
	upper := prefixEnd(prefix) // nil: no upper bound
	for {
		q := scanDataStmt(lower, upper, strict)
		rows, err := s.pool.Query(ctx, q.sql, q.args...)
		if err != nil {
			return s.dbErr("scan data", err)
		}
		n := 0
		var k, v []byte
		stop := false
		for rows.Next() {
			if err := rows.Scan(&k, &v); err != nil {
				rows.Close()
				return s.dbErr("scan data", err)
			}
			n++
			if !fn(k, v) {
				stop = true
				break
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return s.dbErr("scan data", err)
		}
		if stop || n < scanPage {
			return nil
		}
		lower, strict = bytes.Clone(k), true
	}
}

// prefixEnd returns the smallest key after every key starting with p,
// or nil if there is none (p is all 0xff, or empty).
func prefixEnd(p []byte) []byte {
	end := bytes.Clone(p)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}

// Update runs apply as a durable transaction of business data outside any
// idempotency record, with the same reads, checks and events as an
// operation's effects (for seeding, administration, or a service's own
// bookkeeping). Its values carry no writer's token (0). apply may run more
// than once; after maxConflictRuns failures to serialize, Update fails
// with idemkv.ErrConflict.
func (s *Store) Update(ctx context.Context, apply func(idemkv.Effects) error) error {
	if apply == nil {
		return fmt.Errorf("%w: Update without an apply function", idemkv.ErrInvalidArgument)
	}
	if err := s.open(); err != nil {
		return err
	}
	var events int64
	err := s.transact(ctx, apply, func(fx *effects, q querier) error {
		if fx.result != nil { // as the engine's Effects refuse it
			return fmt.Errorf("%w: an Update completes no operation (SetResult in its apply function)", idemkv.ErrInvalidArgument)
		}
		a, err := fx.args()
		if err != nil {
			return err
		}
		if err := q.QueryRow(ctx, s.sql.update.pick(&a), a.args(0, s.now())...).Scan(new(int64), &events, new(int64)); err != nil {
			return s.dbErr("update", err)
		}
		return nil
	})
	if err == nil && events > 0 {
		s.eventsCommitted()
	}
	return err
}

// CompleteTx completes the lease's operation with r in one transaction
// with fn's own statements: a service's business tables commit with the
// outcome, or neither does. The transaction is SERIALIZABLE, so what fn
// reads is checked at commit as Effects' reads are; fn runs again if the
// transaction fails to serialize (up to maxConflictRuns times, then
// idemkv.ErrConflict), so it must do nothing but run statements on tx.
// If fn returns an error, nothing is written, the lease is still held,
// and the error is returned. Errors otherwise as Complete.
func (s *Store) CompleteTx(ctx context.Context, l idemkv.Lease, r idemkv.Result, fn func(ctx context.Context, tx pgx.Tx) error) error {
	if err := validateLease(&l); err != nil {
		return err
	}
	if err := s.validateResult(&r); err != nil {
		return err
	}
	if err := s.open(); err != nil {
		return err
	}
	apply := func(fx idemkv.Effects) error {
		e := fx.(*effects)
		if err := e.begin(); err != nil {
			return err
		}
		return fn(ctx, e.tx)
	}
	return s.Complete(ctx, l, r, apply)
}
