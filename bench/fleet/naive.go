package fleet

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/bench"
	"github.com/idemkv/idemkv/pgstore"
	"github.com/jackc/pgx/v5/pgxpool"
)

// naiveSchema is the baseline's: the columns of pgstore's records that
// the unique workload fills, and its data table.
var naiveSchema = []string{
	`DROP TABLE IF EXISTS naive_records, naive_data, naive2_records`,
	`CREATE TABLE naive_records (
		tenant TEXT NOT NULL, endpoint TEXT NOT NULL, key TEXT NOT NULL,
		state SMALLINT NOT NULL, fingerprint BYTEA NOT NULL,
		created TIMESTAMPTZ NOT NULL DEFAULT now(), lease_expires TIMESTAMPTZ, expires TIMESTAMPTZ,
		status INT NOT NULL DEFAULT 0, pointer TEXT NOT NULL DEFAULT '', body BYTEA,
		PRIMARY KEY (tenant, endpoint, key))`,
	`CREATE TABLE naive_data (k BYTEA PRIMARY KEY, v BYTEA NOT NULL)`,
	`CREATE TABLE naive2_records (LIKE naive_records INCLUDING ALL)`,
}

// naive is the baseline: three autocommit statements a request.
type naive struct{ pool *pgxpool.Pool }

func openNaive(ctx context.Context, dsn string, conns int32) (*naive, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = conns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	for _, q := range naiveSchema {
		if _, err := pool.Exec(ctx, q); err != nil {
			pool.Close()
			return nil, fmt.Errorf("naive baseline schema: %w", err)
		}
	}
	return &naive{pool}, nil
}

var errTaken = errors.New("naive baseline: a new key was already taken")

// request runs request i of stream as a service writes it by hand,
// autocommit statements on tables of the store's shape: insert the key if
// absent (with a lease), write the effect if effect (naive_ tables; else
// naive2_), complete the record.
func (n *naive) request(ctx context.Context, stream, i uint64, tenants int, effect bool) error {
	records := "naive2_records"
	if effect {
		records = "naive_records"
	}
	id := bench.Key(stream, i, tenants)
	tag, err := n.pool.Exec(ctx, `INSERT INTO `+records+` (tenant, endpoint, key, state, fingerprint, lease_expires)
		VALUES ($1, $2, $3, 1, $4, now() + interval '30 seconds') ON CONFLICT DO NOTHING`,
		id.Tenant, id.Endpoint, id.Key, bench.Fingerprint(stream, i, false))
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return errTaken
	}
	if effect {
		k, v := bench.Effect(id, stream, i)
		if _, err := n.pool.Exec(ctx, `INSERT INTO naive_data (k, v) VALUES ($1, $2)
			ON CONFLICT (k) DO UPDATE SET v = excluded.v`, k, v); err != nil {
			return err
		}
	}
	r := bench.Result(stream, i, nil)
	_, err = n.pool.Exec(ctx, `UPDATE `+records+` SET state = 3, status = $4, pointer = $5, body = $6,
		lease_expires = NULL, expires = now() + interval '24 hours'
		WHERE tenant = $1 AND endpoint = $2 AND key = $3`, id.Tenant, id.Endpoint, id.Key, r.Status, r.Pointer, r.Body)
	return err
}

// storeRequest is the same request through an idemkv.Store: a local
// claim, the effect, Complete.
func storeRequest(ctx context.Context, s idemkv.Store, stream, i uint64, tenants int, effect bool) error {
	c, err := bench.ClaimNew(ctx, s, stream, i, tenants, idemkv.ModeLocal)
	if err != nil {
		return err
	}
	if !effect {
		return s.Complete(ctx, c.Lease, bench.Result(stream, i, nil), nil)
	}
	k, v := bench.Effect(c.Lease.ID, stream, i)
	return s.Complete(ctx, c.Lease, bench.Result(stream, i, nil), func(fx idemkv.Effects) error { return fx.Set(k, v) })
}

// runLocal is the same request through pgstore's RunLocal: one
// statement.
func runLocal(ctx context.Context, s *pgstore.Store, stream, i uint64, tenants int, effect bool) error {
	id := bench.Key(stream, i, tenants)
	var apply func(idemkv.Effects) error
	if effect {
		k, v := bench.Effect(id, stream, i)
		apply = func(fx idemkv.Effects) error { return fx.Set(k, v) }
	}
	c, err := s.RunLocal(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: bench.Fingerprint(stream, i, false), Mode: idemkv.ModeLocal},
		bench.Result(stream, i, nil), apply)
	if err == nil && c.Outcome != idemkv.Acquired {
		err = bench.Violation("run of new key %v: %v", id, c.Outcome)
	}
	return err
}
