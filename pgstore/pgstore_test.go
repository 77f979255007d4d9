package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/pgstore"
	"github.com/idemkv/idemkv/pgstore/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

var ctx = context.Background()

func open(t *testing.T, dsn string) *pgstore.Store {
	t.Helper()
	s, err := pgstore.Open(ctx, dsn, &pgstore.Options{NoBackgroundSweep: true,
		Clock: fakeclock.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func claim(t *testing.T, s *pgstore.Store, key string) idemkv.Lease {
	t.Helper()
	c, err := s.Claim(ctx, idemkv.ClaimRequest{ID: idemkv.ID{Tenant: "t", Endpoint: "POST /x", Key: key}, Fingerprint: []byte{1}})
	require.NoError(t, err)
	require.Equal(t, idemkv.Acquired, c.Outcome)
	return c.Lease
}

// TestCheck: after concurrent completions with effects and events, part
// of them acknowledged, Check finds nothing wrong; an effect written
// under the token of a record that has no outcome is found.
func TestCheck(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	s := open(t, dsn)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 10 {
				l := claim(t, s, fmt.Sprintf("w%d-%d", w, i))
				require.NoError(t, s.Complete(ctx, l, idemkv.Result{Status: 201}, func(fx idemkv.Effects) error {
					if err := fx.Set(fmt.Appendf(nil, "v/%d/%d", w, i), []byte("x")); err != nil {
						return err
					}
					return fx.Emit(idemkv.Event{Topic: "things.created", Key: fmt.Sprint("e", i%3), Payload: []byte("p")})
				}))
			}
		})
	}
	wg.Wait()
	require.NoError(t, s.Update(ctx, func(fx idemkv.Effects) error { return fx.Set([]byte("seed"), []byte("1")) }))
	require.NoError(t, s.Update(ctx, func(fx idemkv.Effects) error {
		return fx.Emit(idemkv.Event{Topic: "things.seeded", Payload: []byte("p")})
	}))
	evs, err := s.ReadOutbox(ctx, 0, 50)
	require.NoError(t, err)
	require.Len(t, evs, 50)
	require.NoError(t, s.AckOutbox(ctx, evs[49].Seq, evs[49].ID))
	rep, err := s.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%v", rep.Problems)
	require.Equal(t, 80, rep.Completed)
	require.Equal(t, 80, rep.EffectsPaired)
	require.Equal(t, 1, rep.EffectsStandalone)
	require.Equal(t, 31, rep.Events)
	require.Equal(t, uint64(81), rep.OutboxLast)

	held := claim(t, s, "held")
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `INSERT INTO idemkv_data (k, v, token) VALUES ('stray', 'x', $1)`, int64(held.Token))
	require.NoError(t, err)
	rep, err = s.Check(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, rep.ProblemCount, "%v", rep.Problems)
}

// TestCompleteTx: a service's own table commits with the outcome, or
// neither does (an error, or a fenced holder).
func TestCompleteTx(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	s := open(t, dsn)
	_, err := s.Pool().Exec(ctx, `CREATE TABLE orders (id TEXT PRIMARY KEY, amount INT NOT NULL)`)
	require.NoError(t, err)
	insert := func(id string) func(context.Context, pgx.Tx) error {
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO orders (id, amount) VALUES ($1, 5)`, id)
			return err
		}
	}
	count := func() (n int) {
		require.NoError(t, s.Pool().QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n))
		return n
	}

	l := claim(t, s, "o1")
	boom := errors.New("boom")
	err = s.CompleteTx(ctx, l, idemkv.Result{Status: 201}, func(ctx context.Context, tx pgx.Tx) error {
		if err := insert("o1")(ctx, tx); err != nil {
			return err
		}
		return boom
	})
	require.ErrorIs(t, err, boom)
	require.Zero(t, count(), "an error writes nothing")
	require.NoError(t, s.CompleteTx(ctx, l, idemkv.Result{Status: 201}, insert("o1")))
	require.Equal(t, 1, count())
	rec, err := s.Get(ctx, l.ID)
	require.NoError(t, err)
	require.Equal(t, idemkv.StateCompleted, rec.State)

	err = s.CompleteTx(ctx, l, idemkv.Result{Status: 201}, insert("o2"))
	require.ErrorIs(t, err, idemkv.ErrFenced)
	require.Equal(t, 1, count(), "a fenced holder's statements roll back")
}

// TestOpenMigratesOnceWhenManyOpenAtOnce: eight processes' worth of
// concurrent Opens of an empty database all succeed, on one schema and
// one secret.
func TestOpenMigratesOnceWhenManyOpenAtOnce(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	secrets := make([][]byte, len(errs))
	for i := range errs {
		wg.Go(func() {
			s, err := pgstore.Open(ctx, dsn, &pgstore.Options{NoBackgroundSweep: true})
			if err == nil {
				secrets[i] = pgstore.Secret(s)
				err = s.Close()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.Len(t, secrets[0], 32)
	require.NotEqual(t, make([]byte, 32), secrets[0])
	for _, secret := range secrets[1:] {
		require.Equal(t, secrets[0], secret, "every process derives under one secret")
	}
	s := open(t, dsn)
	require.Equal(t, secrets[0], pgstore.Secret(s), "the secret is kept")
	var v int
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT version FROM idemkv_schema WHERE id = 1`).Scan(&v))
	require.Equal(t, pgstore.SchemaVersion, v)
}

// TestMigrateFromVersion1: a database left at schema version 1 with an
// event in its outbox opens at the current version, and the event is
// claimed and published by a shared relay.
func TestMigrateFromVersion1(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	pool, err := pgxpool.New(ctx, dsn)
	require.NoError(t, err)
	defer pool.Close()
	require.NoError(t, pgstore.MigrateTo(ctx, pool, 1))
	_, err = pool.Exec(ctx, `INSERT INTO idemkv_outbox (batch, ord, seq, event_id, topic, entity, entity_seq, payload, created)
		VALUES (1, 1, 1, 'ev1', 'things.created', 'e', 1, 'x', now())`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO idemkv_entities (topic, entity, seq) VALUES ('things.created', 'e', 1)`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE idemkv_outbox_cursor SET last = 1`)
	require.NoError(t, err)

	s := open(t, dsn)
	var v int
	require.NoError(t, pool.QueryRow(ctx, `SELECT version FROM idemkv_schema`).Scan(&v))
	require.Equal(t, pgstore.SchemaVersion, v)
	c, err := s.ClaimOutbox(ctx, 10)
	require.NoError(t, err)
	require.Len(t, c.Events(), 1)
	require.Equal(t, "ev1", c.Events()[0].ID)
	require.NoError(t, c.Finish(ctx, 1))
	acked, last, err := s.OutboxCursor(ctx)
	require.NoError(t, err)
	require.Equal(t, [2]uint64{1, 1}, [2]uint64{acked, last})
	rep, err := s.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%v", rep.Problems)
}

// TestMigrationGivesWayToLongTransactions: an older build's relay holds
// a claim on the outbox (an open transaction that locked its rows) while
// a new process migrates from version 3. The migration to version 4
// commits on its own, and the one to version 5, which needs the outbox's
// lock, waits a bounded time and tries again, so that it never holds the
// records' lock while it queues: the fleet's reads of records go on, and
// the migration ends once the claim does.
func TestMigrationGivesWayToLongTransactions(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	pool, err := pgxpool.New(ctx, dsn)
	require.NoError(t, err)
	defer pool.Close()
	require.NoError(t, pgstore.MigrateTo(ctx, pool, 3))
	claim, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = claim.Rollback(ctx) }()                         // also when a check fails: the migration then ends
	_, err = claim.Exec(ctx, `SELECT * FROM idemkv_outbox FOR UPDATE`) // an older relay's claim
	require.NoError(t, err)

	migrated := make(chan error, 1)
	go func() { migrated <- pgstore.MigrateTo(ctx, pool, pgstore.SchemaVersion) }()
	// Once version 4 has committed, a read of the records, from another
	// process of the fleet, is not held up by the migration.
	for v, deadline := 3, time.Now().Add(10*time.Second); v < 4; {
		require.False(t, time.Now().After(deadline), "version 4 did not commit on its own")
		require.NoError(t, pool.QueryRow(ctx, `SELECT version FROM idemkv_schema`).Scan(&v))
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var n int
	require.NoError(t, pool.QueryRow(rctx, `SELECT count(*) FROM idemkv_records`).Scan(&n),
		"a read of the records waited behind the migration")
	var v int
	require.NoError(t, pool.QueryRow(ctx, `SELECT version FROM idemkv_schema`).Scan(&v))
	require.Equal(t, 4, v, "version 5 waits for the claim")
	require.NoError(t, claim.Rollback(ctx))
	require.NoError(t, <-migrated)
	require.NoError(t, pool.QueryRow(ctx, `SELECT version FROM idemkv_schema`).Scan(&v))
	require.Equal(t, pgstore.SchemaVersion, v)
}

// TestLeastPrivilegesOpenAndCheck: a role with SELECT, INSERT, UPDATE and
// DELETE on the store's tables and USAGE on its sequences, and no CREATE
// (PostgreSQL 15 grants none on public), opens a migrated store, works
// on it, and checks it, as docs/operations.md says.
func TestLeastPrivilegesOpenAndCheck(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	owner := open(t, dsn)
	require.NoError(t, owner.Close())
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	role := fmt.Sprintf("app_%d", time.Now().UnixNano())
	pool, err := pgxpool.New(ctx, dsn)
	require.NoError(t, err)
	defer pool.Close()
	for _, stmt := range []string{
		"CREATE ROLE " + role + " LOGIN",
		"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO " + role,
		"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO " + role,
	} {
		_, err := pool.Exec(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	u.User = url.User(role)
	s, err := pgstore.Open(ctx, u.String(), &pgstore.Options{NoBackgroundSweep: true})
	require.NoError(t, err)
	defer s.Close()
	c, err := s.Claim(ctx, idemkv.ClaimRequest{ID: idemkv.ID{Tenant: "t", Endpoint: "e", Key: "k"}, Fingerprint: []byte{1}})
	require.NoError(t, err)
	require.NoError(t, s.Complete(ctx, c.Lease, idemkv.Result{Status: 200}, nil))
	rep, err := s.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%v", rep.Problems)
}
