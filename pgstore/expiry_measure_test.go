package pgstore_test

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/idemkv/idemkv/pgstore/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestMeasureExpiry measures what giving back the space of a million
// expired records costs, two ways: the store's sweeper (batched deletes
// along the expiry index, then a vacuum), and dropping a time partition
// that holds the same rows whole. It prints its figures and asserts only
// that both leave no expired row; docs/benchmarks.md keeps them. Set
// IDEMKV_PG_EXPIRY_ROWS (for example 1000000) to run it.
func TestMeasureExpiry(t *testing.T) {
	rows, _ := strconv.Atoi(os.Getenv("IDEMKV_PG_EXPIRY_ROWS"))
	if rows <= 0 {
		t.Skip("set IDEMKV_PG_EXPIRY_ROWS to measure")
	}
	dsn := pgtest.Shared(t).CreateDatabase(t)
	s := open(t, dsn)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	wal := func() (lsn int64) {
		require.NoError(t, conn.QueryRow(ctx, `SELECT pg_current_wal_lsn() - '0/0'`).Scan(&lsn))
		return lsn
	}
	exec := func(q string, args ...any) time.Duration {
		start := time.Now()
		_, err := conn.Exec(ctx, q, args...)
		require.NoError(t, err, q)
		return time.Since(start)
	}
	// A million completed records, expired an hour before the store's
	// clock, in the shape a payment leaves (no body, a pointer).
	fill := `INSERT INTO %s (tenant, endpoint, key, state, mode, fingerprint, token, attempt, created, expires, class, status, pointer, effects)
		SELECT 'acct_' || (g %% 1000), 'POST /v1/payments', 'order-' || g, 3, 0, '\x0102030405060708091011121314151617181920212223242526272829303132'::bytea,
			g, 1, $1::timestamptz - interval '25 hours', $1::timestamptz - interval '1 hour', '', 201, '/v1/payments/pay_' || g, 1
		FROM generate_series(1, $2) g`
	now := s.Now()
	t.Logf("fill %d records: %v", rows, exec(fmt.Sprintf(fill, "idemkv_records"), now, rows).Round(time.Millisecond))
	exec(`CHECKPOINT`)

	w0 := wal()
	start := time.Now()
	pass, err := s.Sweep(ctx)
	require.NoError(t, err)
	sweep := time.Since(start)
	sweepWAL := wal() - w0
	require.Equal(t, rows, pass.Deleted)
	w0 = wal()
	vacuum := exec(`VACUUM idemkv_records`)
	t.Logf("batched deletes: %d rows in %v (%.0f rows/s), %.1f MiB of WAL; vacuum %v, %.1f MiB of WAL",
		rows, sweep.Round(time.Millisecond), float64(rows)/sweep.Seconds(), float64(sweepWAL)/(1<<20),
		vacuum.Round(time.Millisecond), float64(wal()-w0)/(1<<20))

	// The same rows in a partition of a table partitioned by expiry.
	exec(`CREATE TABLE part_records (LIKE idemkv_records INCLUDING DEFAULTS) PARTITION BY RANGE (expires)`)
	exec(`CREATE TABLE part_records_old PARTITION OF part_records FOR VALUES FROM (MINVALUE) TO ('` + now.Format(time.RFC3339) + `')`)
	exec(`CREATE TABLE part_records_new PARTITION OF part_records FOR VALUES FROM ('` + now.Format(time.RFC3339) + `') TO (MAXVALUE)`)
	exec(`ALTER TABLE part_records ADD PRIMARY KEY (tenant, endpoint, key, expires)`)
	t.Logf("fill the partition: %v", exec(fmt.Sprintf(fill, "part_records"), now, rows).Round(time.Millisecond))
	exec(`CHECKPOINT`)
	w0 = wal()
	drop := exec(`DROP TABLE part_records_old`)
	t.Logf("partition drop: %d rows in %v, %.3f MiB of WAL", rows, drop.Round(time.Millisecond), float64(wal()-w0)/(1<<20))
	var left int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM part_records`).Scan(&left))
	require.Zero(t, left)
}
