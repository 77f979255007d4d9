package pgtest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv/internal/tier"
	"github.com/idemkv/idemkv/pgstore/pgtest"
)

// A row committed on a primary with a synchronous standby is on the
// standby once the primary is crashed (Kill) and the standby promoted;
// before, the standby refuses writes, and after, it takes them.
func TestPromotedStandbyHasWhatThePrimaryCommitted(t *testing.T) {
	tier.Require(t, "PostgreSQL servers started and killed")
	t.Parallel()
	ctx := testContext(t)
	primary := pgtest.Start(t)
	p := connect(t, primary.DSN("postgres"))
	_, err := p.Exec(ctx, `CREATE TABLE kv (k text PRIMARY KEY)`)
	require.NoError(t, err)

	standby := primary.StartStandby(t, true)
	require.NotEqual(t, primary.Port(), standby.Port())
	var name, state string
	require.NoError(t, p.QueryRow(ctx, `SELECT application_name, sync_state FROM pg_stat_replication`).Scan(&name, &state))
	require.Regexp(t, `^standby\d+$`, name)
	require.Equal(t, "sync", state)

	_, err = p.Exec(ctx, `INSERT INTO kv VALUES ('committed')`)
	require.NoError(t, err)
	_, err = connect(t, standby.DSN("postgres")).Exec(ctx, `INSERT INTO kv VALUES ('on the standby')`)
	requireSQLState(t, "25006", err) // read_only_sql_transaction

	primary.Kill()
	standby.Promote(t)
	require.Equal(t, []string{"committed"}, keys(t, standby.DSN("postgres")))
	_, err = connect(t, standby.DSN("postgres")).Exec(ctx, `INSERT INTO kv VALUES ('after the promotion')`)
	require.NoError(t, err)
	require.Equal(t, []string{"after the promotion", "committed"}, keys(t, standby.DSN("postgres")))
}

// With a synchronous standby, a commit does not return while the standby
// is stopped: it waits (wait event SyncRep) for the standby, and returns
// once the standby is back and has the commit.
func TestSyncCommitWaitsForTheStandby(t *testing.T) {
	tier.Require(t, "PostgreSQL servers started and killed")
	t.Parallel()
	ctx := testContext(t)
	primary := pgtest.Start(t)
	p := connect(t, primary.DSN("postgres"))
	_, err := p.Exec(ctx, `CREATE TABLE kv (k text PRIMARY KEY)`)
	require.NoError(t, err)
	standby := primary.StartStandby(t, true)
	_, err = p.Exec(ctx, `INSERT INTO kv VALUES ('while up')`)
	require.NoError(t, err, "a commit with the standby up returns")

	standby.Stop()
	committed := make(chan error, 1)
	go func() {
		_, err := p.Exec(ctx, `INSERT INTO kv VALUES ('while down')`)
		committed <- err
	}()
	// The commit reaches the wait for the standby (within the test's
	// context), and stays there: a commit that returned would not be
	// listed.
	admin := connect(t, primary.DSN("postgres"))
	waitUntil(t, ctx, func() bool {
		var n int
		require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'`).Scan(&n))
		return n == 1
	})
	select {
	case err := <-committed:
		t.Fatalf("a commit returned while the synchronous standby was stopped: %v", err)
	default:
	}
	// A commit with a deadline is still waiting when the deadline ends.
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	_, err = connect(t, primary.DSN("postgres")).Exec(short, `INSERT INTO kv VALUES ('given up')`)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	standby.Restart(t)
	require.NoError(t, <-committed, "the commit returns once the standby is back")
	waitUntil(t, ctx, func() bool {
		return len(keys(t, standby.DSN("postgres"))) == 3 // 'given up' too: its backend waited on
	})
	require.Equal(t, []string{"given up", "while down", "while up"}, keys(t, standby.DSN("postgres")))
}

// waitUntil calls cond until it holds, failing the test if ctx ends first.
func waitUntil(t *testing.T, ctx context.Context, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("condition not met: %v", ctx.Err())
		case <-tick.C:
		}
	}
}

// requireSQLState fails unless err is a PostgreSQL error with SQLSTATE code.
func requireSQLState(t *testing.T, code string, err error) {
	t.Helper()
	var pe *pgconn.PgError
	require.True(t, errors.As(err, &pe), "want SQLSTATE %s, got %v", code, err)
	require.Equal(t, code, pe.Code, pe.Message)
}
