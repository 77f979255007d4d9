package pgstore_test

import (
	"syscall"
	"testing"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/pgstore"
	"github.com/idemkv/idemkv/pgstore/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestReviewTokenReissuedAfterCrash: in the committed code a local claim
// commits through the pool with synchronous_commit off, and draws its
// fencing token there with nextval. If the database crashes before that
// WAL is flushed, the claim is lost, as the design allows, but so is the
// sequence's advance: after recovery nextval hands out the same token
// again. The lost claim's holder, still running, then completes under the
// new claim's token: a Complete the design says fails with ErrFenced is
// accepted, on a record claimed by another request (another fingerprint),
// whose own holder is then fenced. Two holders acquired one record under
// one token. (With claims committed synchronously the claim survives the
// crash, B's claim is a Mismatch, and the test passes.)
//
// The window is the WAL writer's (up to 3 x wal_writer_delay, 600 ms by
// default; the test also fails without the SIGSTOP below). The test pins
// it by stopping the WAL writer and the background writer (SIGSTOP)
// before the claim; the crash is pgtest's Kill (SIGKILL to every server
// process).
func TestReviewTokenReissuedAfterCrash(t *testing.T) {
	srv := pgtest.Start(t)
	dsn := srv.CreateDatabase(t)
	opts := func(o *pgstore.Options) { o.NoListen = true }
	a := reviewOpenOn(t, dsn, opts) // process A

	// Some durable history first: a remote claim (synchronous), completed.
	l0 := reviewClaim(t, a, reviewID("earlier"), idemkv.ModeRemote)
	require.NoError(t, a.Complete(ctx, l0, idemkv.Result{Status: 200}, nil))

	admin, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	// Use up the values the sequence has logged ahead (each of these
	// commits is synchronous), so that the next nextval, the claim's,
	// writes the sequence's next WAL record.
	for {
		var logCnt int64
		require.NoError(t, admin.QueryRow(ctx, `SELECT log_cnt FROM idemkv_tokens`).Scan(&logCnt))
		if logCnt == 0 {
			break
		}
		_, err := admin.Exec(ctx, `SELECT nextval('idemkv_tokens')`)
		require.NoError(t, err)
	}
	rows, err := admin.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE backend_type IN ('walwriter', 'background writer')`)
	require.NoError(t, err)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	require.Len(t, pids, 2)
	for _, pid := range pids {
		require.NoError(t, syscall.Kill(int(pid), syscall.SIGSTOP))
	}
	_ = admin.Close(ctx)

	id := reviewID("pay-1")
	ca, err := a.Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: []byte("request A"), Mode: idemkv.ModeLocal})
	require.NoError(t, err)
	require.Equal(t, idemkv.Acquired, ca.Outcome)

	srv.Kill() // the database crashes; A keeps running
	srv.Restart(t)

	b := reviewOpenOn(t, dsn, opts) // process B, after recovery
	// Another request with the same key (a client reusing it, say).
	cb, err := b.Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: []byte("request B"), Mode: idemkv.ModeLocal})
	require.NoError(t, err)
	if cb.Outcome == idemkv.Acquired { // A's claim was lost in the crash (the design allows that)
		t.Logf("lost claim's token %d, new claim's token %d", ca.Lease.Token, cb.Lease.Token)
		require.NotEqual(t, ca.Lease.Token, cb.Lease.Token, "a fencing token was issued twice")
	}

	a2 := reviewOpenOn(t, dsn, opts) // A's pool, reconnected
	errA := a2.Complete(ctx, ca.Lease, idemkv.Result{Status: 201, Pointer: "/v1/payments/from-A"}, nil)
	rec, err := b.Get(ctx, id)
	require.NoError(t, err)
	t.Logf("B's claim: %v; A's Complete: %v; record: fingerprint %q, pointer %q", cb.Outcome, errA, rec.Fingerprint, rec.Result.Pointer)
	if errA == nil {
		require.Equal(t, "request A", string(rec.Fingerprint), "A's outcome was stored on another request's record")
	} else {
		require.ErrorIs(t, errA, idemkv.ErrFenced)
	}
}
