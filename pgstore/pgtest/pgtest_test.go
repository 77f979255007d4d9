package pgtest_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv/internal/tier"
	"github.com/idemkv/idemkv/pgstore/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// A row committed in one database of the shared server is not in another.
func TestDatabasesAreIsolated(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	srv := pgtest.Shared(t)
	require.Same(t, srv, pgtest.Shared(t), "one shared server per test binary")

	a := connect(t, srv.CreateDatabase(t))
	b := connect(t, srv.CreateDatabase(t))
	_, err := a.Exec(ctx, `CREATE TABLE kv (k text PRIMARY KEY, v text NOT NULL)`)
	require.NoError(t, err)
	_, err = a.Exec(ctx, `INSERT INTO kv VALUES ('x', 'in a')`)
	require.NoError(t, err)

	var v string
	require.NoError(t, a.QueryRow(ctx, `SELECT v FROM kv WHERE k = 'x'`).Scan(&v))
	require.Equal(t, "in a", v)
	var table *string
	require.NoError(t, b.QueryRow(ctx, `SELECT to_regclass('kv')::text`).Scan(&table))
	require.Nil(t, table, "b sees a's table")
}

// Databases created concurrently get distinct names, and each is dropped
// when its test ends.
func TestCreateDatabaseConcurrently(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	srv := pgtest.Shared(t)
	const n = 8
	names := make(chan string, n)
	t.Run("group", func(t *testing.T) {
		for i := range n {
			t.Run(strconv.Itoa(i), func(t *testing.T) {
				t.Parallel()
				var name string
				require.NoError(t, connect(t, srv.CreateDatabase(t)).QueryRow(ctx, `SELECT current_database()`).Scan(&name))
				names <- name
			})
		}
	})
	close(names)
	var created []string
	for name := range names {
		created = append(created, name)
	}
	require.Len(t, created, n)

	var left int
	require.NoError(t, connect(t, srv.DSN("postgres")).QueryRow(ctx,
		`SELECT count(DISTINCT datname) FROM pg_database WHERE datname = ANY($1)`, created).Scan(&left))
	require.Zero(t, left, "databases left after their tests: %v", created)
}

// A committed row survives a crash of the server, and an uncommitted one
// does not: after Kill (no shutdown checkpoint) Restart replays the WAL.
// It survives a clean Stop and Restart too.
//
// Kill loses nothing the server wrote to the page cache, so the row would
// survive it even with fsync off; the test checks fsync is on by asking.
func TestCommittedRowSurvivesKill(t *testing.T) {
	tier.Require(t, "PostgreSQL servers started and killed")
	t.Parallel()
	ctx := testContext(t)
	srv := pgtest.Start(t)
	dsn, port := srv.CreateDatabase(t), srv.Port()

	c := connect(t, dsn)
	var fsync string
	require.NoError(t, c.QueryRow(ctx, `SHOW fsync`).Scan(&fsync))
	require.Equal(t, "on", fsync)
	_, err := c.Exec(ctx, `CREATE TABLE kv (k text PRIMARY KEY)`)
	require.NoError(t, err)
	_, err = c.Exec(ctx, `INSERT INTO kv VALUES ('committed')`)
	require.NoError(t, err)
	tx, err := c.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO kv VALUES ('uncommitted')`)
	require.NoError(t, err)

	srv.Kill()
	require.Error(t, c.Ping(ctx), "a connection to a killed server")
	srv.Restart(t)
	require.Equal(t, port, srv.Port())
	require.Equal(t, []string{"committed"}, keys(t, dsn))
	log, err := os.ReadFile(filepath.Join(srv.Dir(), "postgres.log"))
	require.NoError(t, err)
	require.Contains(t, string(log), "redo starts at", "Restart after Kill ran crash recovery")

	srv.Stop()
	srv.Stop() // a second Stop does nothing
	srv.Restart(t)
	require.Equal(t, []string{"committed"}, keys(t, dsn))
}

// WithoutFsync turns fsync off, and only on the server it is given to.
func TestWithoutFsync(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	var fsync string
	require.NoError(t, connect(t, pgtest.Start(t, pgtest.WithoutFsync()).DSN("postgres")).QueryRow(ctx, `SHOW fsync`).Scan(&fsync))
	require.Equal(t, "off", fsync)
	require.NoError(t, connect(t, pgtest.Shared(t).DSN("postgres")).QueryRow(ctx, `SHOW fsync`).Scan(&fsync))
	require.Equal(t, "on", fsync)
}

// keys returns the keys in table kv of the database at dsn, in order.
func keys(t *testing.T, dsn string) []string {
	t.Helper()
	ctx := testContext(t)
	rows, err := connect(t, dsn).Query(ctx, `SELECT k FROM kv ORDER BY k`)
	require.NoError(t, err)
	ks, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return ks
}

// connect returns a connection to dsn, closed when the test ends.
func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(testContext(t), dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// testContext bounds a test's calls to the server, so that a hung server
// fails the test rather than the whole binary's timeout.
func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
