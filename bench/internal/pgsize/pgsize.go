// Package pgsize measures PostgreSQL tables at rest, for the benchmarks'
// bytes-per-key figures.
package pgsize

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
)

// AtRest vacuums each table and returns their total size with their
// indexes and TOAST: what the rows cost once dead versions are gone.
func AtRest(ctx context.Context, pool *pgxpool.Pool, tables ...string) (int64, error) {
	var total int64
	for _, t := range tables {
		if _, err := pool.Exec(ctx, "VACUUM ANALYZE "+t); err != nil {
			return 0, err
		}
		var n int64
		if err := pool.QueryRow(ctx, `SELECT pg_total_relation_size($1::regclass)`, t).Scan(&n); err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}
