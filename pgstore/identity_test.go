package pgstore_test

import (
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/pgstore"
	"github.com/idemkv/idemkv/pgstore/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// The store's secret, the operation ids derived under it, and the
// moment a record was marked uncertain (the marked column), beyond what
// the conformance suite can see through the contract.

// TestOperationIDSharedByProcesses: two processes sharing a database
// derive the same operation id for a request (under the database's
// secret), so a retry that reaches another process after a release sends
// the same key downstream; a store on another database derives another.
func TestOperationIDSharedByProcesses(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	a, b := open(t, dsn), open(t, dsn)
	id := idemkv.ID{Tenant: "t", Endpoint: "POST /pay", Key: "pay-1"}
	req := idemkv.ClaimRequest{ID: id, Fingerprint: []byte("body"), Mode: idemkv.ModeRemote}
	c, err := a.Claim(ctx, req)
	require.NoError(t, err)
	require.Equal(t, idemkv.Acquired, c.Outcome)
	want := idemkv.DeriveOperationID(pgstore.Secret(a), id, req.Fingerprint, 0)
	require.Equal(t, want, c.Lease.OperationID)
	require.NoError(t, a.Release(ctx, c.Lease, nil))

	c, err = b.Claim(ctx, req)
	require.NoError(t, err)
	require.Equal(t, idemkv.Acquired, c.Outcome)
	require.Equal(t, want, c.Lease.OperationID, "another process, the same request")

	other := open(t, pgtest.Shared(t).CreateDatabase(t))
	require.NotEqual(t, pgstore.Secret(a), pgstore.Secret(other))
	c, err = other.Claim(ctx, req)
	require.NoError(t, err)
	require.NotEqual(t, want, c.Lease.OperationID, "another database's secret")
}

// TestMigrateFromVersion2: a database left at schema version 2, with an
// abandoned remote record and an uncertain one, opens at the current
// version with a secret. The records keep the operation ids they were drawn at random
// (a takeover resumes one), have no moment of marking, and a new record
// of the same request gets the derived id.
func TestMigrateFromVersion2(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	pool, err := pgxpool.New(ctx, dsn)
	require.NoError(t, err)
	defer pool.Close()
	require.NoError(t, pgstore.MigrateTo(ctx, pool, 2))
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	random := map[string][]byte{"abandoned": []byte("0123456789abcdef"), "uncertain": []byte("fedcba9876543210")}
	for key, state := range map[string]int{"abandoned": 1, "uncertain": 2} {
		var lease *time.Time
		if state == 1 {
			l := start.Add(-time.Minute)
			lease = &l
		}
		_, err := pool.Exec(ctx, `INSERT INTO idemkv_records (tenant, endpoint, key, state, mode, fingerprint, token,
			attempt, operation_id, created, lease_expires, expires, class)
			VALUES ('t', 'POST /pay', $1, $2, 1, 'fp', nextval('idemkv_tokens'), 1, $3, $4, $5, $6, '')`,
			key, state, random[key], start.Add(-time.Hour), lease, start.Add(time.Hour))
		require.NoError(t, err)
	}

	clock := fakeclock.New(start)
	s := reviewOpenOn(t, dsn, func(o *pgstore.Options) { o.Clock = clock })
	var v int
	require.NoError(t, pool.QueryRow(ctx, `SELECT version FROM idemkv_schema`).Scan(&v))
	require.Equal(t, pgstore.SchemaVersion, v)
	require.Len(t, pgstore.Secret(s), 32)

	id := func(key string) idemkv.ID { return idemkv.ID{Tenant: "t", Endpoint: "POST /pay", Key: key} }
	rec, err := s.Get(ctx, id("uncertain"))
	require.NoError(t, err)
	require.Equal(t, idemkv.StateUncertain, rec.State)
	require.Equal(t, random["uncertain"], rec.OperationID[:], "a record keeps the id it was drawn")
	require.True(t, rec.Marked.IsZero(), "marked before the store kept it: %v", rec.Marked)

	req := idemkv.ClaimRequest{ID: id("abandoned"), Fingerprint: []byte("fp"), Mode: idemkv.ModeRemote, Resumable: true}
	c, err := s.Claim(ctx, req)
	require.NoError(t, err)
	require.Equal(t, idemkv.Acquired, c.Outcome)
	require.True(t, c.Lease.Takeover())
	require.Equal(t, random["abandoned"], c.Lease.OperationID[:], "a takeover resumes the stored id")
	require.NoError(t, s.Release(ctx, c.Lease, nil))
	c, err = s.Claim(ctx, req)
	require.NoError(t, err)
	require.Equal(t, idemkv.Acquired, c.Outcome)
	require.Equal(t, idemkv.DeriveOperationID(pgstore.Secret(s), req.ID, req.Fingerprint, 0), c.Lease.OperationID)

	rep, err := s.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%v", rep.Problems)
}

// TestMarkedColumn: the marked column holds the statement's time, to the
// microsecond, from MarkUncertain, from a claim that turns an abandoned
// record uncertain, and from an escalation of an abandoned record; an
// escalation of an uncertain record keeps it; every way out of the
// uncertain state clears it.
func TestMarkedColumn(t *testing.T) {
	clock := fakeclock.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	s, _ := reviewStore(t, func(o *pgstore.Options) { o.Clock = clock })
	clock.Advance(1234567 * time.Microsecond)
	column := func(key string) *time.Time {
		t.Helper()
		var marked *time.Time
		require.NoError(t, s.Pool().QueryRow(ctx, `SELECT marked FROM idemkv_records WHERE key = $1`, key).Scan(&marked))
		return marked
	}
	remote := func(key string) idemkv.ClaimRequest {
		return idemkv.ClaimRequest{ID: reviewID(key), Fingerprint: []byte{1}, Mode: idemkv.ModeRemote, Lease: 10 * time.Second}
	}
	acquire := func(key string) idemkv.Lease {
		t.Helper()
		c, err := s.Claim(ctx, remote(key))
		require.NoError(t, err)
		require.Equal(t, idemkv.Acquired, c.Outcome)
		return c.Lease
	}
	requireMarked := func(key string, want time.Time) {
		t.Helper()
		got := column(key)
		require.NotNil(t, got, key)
		require.True(t, got.Equal(want), "%s: column %v, want %v", key, got, want)
		rec, err := s.Get(ctx, reviewID(key))
		require.NoError(t, err)
		require.True(t, rec.Marked.Equal(want), "%s: Marked %v, want %v", key, rec.Marked, want)
	}

	byHolder := acquire("by-holder")
	abandoned := acquire("by-claim")
	escalated := acquire("by-escalation")
	clock.Advance(3 * time.Second)
	markedAt := clock.Now()
	require.NoError(t, s.MarkUncertain(ctx, byHolder, "timeout"))
	requireMarked("by-holder", markedAt)

	clock.Advance(7*time.Second + 1001*time.Microsecond) // the other two are abandoned
	claimedAt := clock.Now()
	c, err := s.Claim(ctx, remote("by-claim"))
	require.NoError(t, err)
	require.Equal(t, idemkv.Reconciling, c.Outcome)
	require.True(t, c.Record.Marked.Equal(claimedAt))
	requireMarked("by-claim", claimedAt)

	clock.Advance(2 * time.Second)
	escalatedAt := clock.Now()
	require.NoError(t, s.Escalate(ctx, idemkv.EscalateRequest{ID: reviewID("by-escalation"), Token: escalated.Token, Note: "gave up"}))
	requireMarked("by-escalation", escalatedAt)
	clock.Advance(time.Second)
	require.NoError(t, s.Escalate(ctx, idemkv.EscalateRequest{ID: reviewID("by-holder"), Token: byHolder.Token, Note: "gave up"}))
	requireMarked("by-holder", markedAt)

	// Out of the uncertain state: resolved, resolved with no effect,
	// evicted.
	require.NoError(t, s.Resolve(ctx, idemkv.ResolveRequest{ID: reviewID("by-holder"), Token: byHolder.Token,
		Result: idemkv.Result{Status: 201}}))
	require.Nil(t, column("by-holder"))
	require.NoError(t, s.Resolve(ctx, idemkv.ResolveRequest{ID: reviewID("by-claim"), Token: abandoned.Token, NoEffect: true}))
	require.Nil(t, column("by-claim"))
	_, err = s.Evict(ctx, idemkv.EvictRequest{ID: reviewID("by-escalation"), Token: escalated.Token})
	require.NoError(t, err)
	require.Nil(t, column("by-escalation"))

	var stray int
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT count(*) FROM idemkv_records WHERE marked IS NOT NULL AND state <> 2`).Scan(&stray))
	require.Zero(t, stray)
}

// TestAnEarlierSequencerCannotNumberANewEvent: during a rolling upgrade to
// schema 5, a process of an earlier build numbers events by setting seq
// alone. An event a new process stored has no entity_seq until the new
// sequencer gives it one: the earlier sequencer's statement fails on it
// (the relay retries, and new relays publish it) instead of leaving it
// numbered with no entity_seq, which no reader could scan.
func TestAnEarlierSequencerCannotNumberANewEvent(t *testing.T) {
	// The store migrates the schema; its own sequencer must not run.
	_, dsn := reviewStore(t, func(o *pgstore.Options) { o.OutboxPoll, o.NoListen = time.Hour, true })
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `INSERT INTO idemkv_outbox (batch, ord, event_id, topic, entity, payload, created)
		VALUES (nextval('idemkv_event_ids'), 0, 'e1', 'things.changed', 'thing-1', '\x70', now())`)
	require.NoError(t, err, "a new build stores an event without entity_seq")
	_, err = conn.Exec(ctx, `UPDATE idemkv_outbox SET seq = 1 WHERE seq IS NULL`) // the earlier build's numbering
	var pe *pgconn.PgError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, "23514", pe.Code, "check_violation")
}
