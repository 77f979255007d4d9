package pgstore_test

import (
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReviewAbandonAfterRenew: a claim that finds a remote record past its
// lease and cannot resume it turns it uncertain with abandonedSQL, whose
// condition is the token and state only, not that the lease has still run
// out (claim.go). The claim decides from its statement's snapshot; a
// Renew by the holder that commits after that snapshot (before the ON
// CONFLICT arm or the second statement) is not seen, and the record is
// turned uncertain under a lease the store has just renewed: Renew
// succeeded, the claim answers Reconciling, and the holder, whose lease
// is live and which nobody took over, is fenced. In the engine the claim's
// decision and its write happen under the key's mutex: the claim would
// answer InProgress.
//
// To order the steps without sleeps, a third transaction holds the row
// (FOR NO KEY UPDATE); Renew queues for it first, then the claim (its
// statement read the expired lease from its snapshot and wrote nothing,
// and its abandonedSQL queues); the third transaction commits, Renew
// commits, and abandonedSQL must see the renewed lease.
func TestReviewAbandonAfterRenew(t *testing.T) {
	clock := fakeclock.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	s, dsn := reviewStore(t, func(o *pgstore.Options) { o.Clock = clock; o.NoListen = true })
	id := reviewID("charge-1")
	c, err := s.Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: []byte{1}, Mode: idemkv.ModeRemote, Lease: 10 * time.Second})
	require.NoError(t, err)
	require.Equal(t, idemkv.Acquired, c.Outcome)
	clock.Advance(11 * time.Second) // the holder is slow: its lease ran out

	locker, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer locker.Close(ctx)
	// pg_stat_activity is read outside any transaction: within one, it is
	// a snapshot taken at its first read.
	watcher, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer watcher.Close(ctx)
	waitFor := func(what, query string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			if !time.Now().Before(deadline) {
				rows, _ := watcher.Query(ctx, `SELECT coalesce(wait_event_type,''), coalesce(wait_event,''), state, left(query, 60) FROM pg_stat_activity WHERE datname = current_database()`)
				for rows.Next() {
					var a, b, c, d string
					_ = rows.Scan(&a, &b, &c, &d)
					t.Logf("%s %s %s %q", a, b, c, d)
				}
				rows.Close()
				t.Fatalf("%s never waited for the row lock", what)
			}
			var waiting bool
			require.NoError(t, watcher.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
				WHERE wait_event_type = 'Lock' AND query LIKE $1)`, query).Scan(&waiting))
			if waiting {
				return
			}
		}
	}
	tx, err := locker.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM idemkv_records WHERE key = $1 FOR NO KEY UPDATE`, id.Key)
	require.NoError(t, err)

	// The holder renews; its UPDATE queues for the row.
	type renewal struct {
		l   idemkv.Lease
		err error
	}
	renewedc := make(chan renewal, 1)
	go func() {
		l, err := s.Renew(ctx, c.Lease, 30*time.Second)
		renewedc <- renewal{l, err}
	}()
	waitFor("Renew", "%UPDATE idemkv_records SET lease_expires%")

	// A retry that cannot resume the operation (not Resumable) takes its
	// snapshot now, and queues behind the renewal.
	type answer struct {
		c   idemkv.Claim
		err error
	}
	claimed := make(chan answer, 1)
	go func() {
		c, err := s.Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: []byte{1}, Mode: idemkv.ModeRemote})
		claimed <- answer{c, err}
	}()
	waitFor("Claim", "%UPDATE idemkv_records SET state = 2%") // abandonedSQL
	require.NoError(t, tx.Commit(ctx))

	r := <-renewedc
	require.NoError(t, r.err)
	renewed := r.l
	require.True(t, clock.Now().Before(renewed.Expires), "the renewed lease is live")
	a := <-claimed
	t.Logf("claim: %v, record %v, lease expires %v, renewed to %v", a.c.Outcome, a.c.Record.State, a.c.Record.LeaseExpires, renewed.Expires)
	require.NoError(t, a.err)
	assert.Equal(t, idemkv.InProgress, a.c.Outcome, "the record's lease was renewed before the claim changed it")
	err = s.Complete(ctx, renewed, idemkv.Result{Status: 201}, nil)
	assert.NoError(t, err, "the holder's renewed lease is live and nobody took the record over")
}
