package pgstore

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// SchemaVersion is the version of the schema this code reads and writes.
// Open migrates an older schema to it and refuses a newer one.
const SchemaVersion = 5

// A migration takes the schema from one version to the next: its
// statements, then fill, if set, which writes what the statements cannot
// compute (a secret drawn in this process).
type migration struct {
	stmts []string
	fill  func(ctx context.Context, tx pgx.Tx) error
}

// migrations[v-1] takes the schema from version v-1 to v. Each runs in
// one transaction with the version row, so a migration is applied whole
// or not at all. The statements are the SQL subset PostgreSQL and
// CockroachDB share (docs/design.md, "The PostgreSQL store").
var migrations = []migration{
	{stmts: []string{
		// Fencing tokens: unique and increasing for the life of the
		// database, across every process.
		`CREATE SEQUENCE idemkv_tokens`,
		// One row per idempotency record. state: 1 in progress, 2
		// uncertain, 3 completed; mode: 0 local, 1 remote.
		`CREATE TABLE idemkv_records (
			tenant        TEXT NOT NULL,
			endpoint      TEXT NOT NULL,
			key           TEXT NOT NULL,
			state         SMALLINT NOT NULL,
			mode          SMALLINT NOT NULL,
			fingerprint   BYTEA NOT NULL,
			token         BIGINT NOT NULL,
			attempt       INT NOT NULL,
			operation_id  BYTEA,
			created       TIMESTAMPTZ NOT NULL,
			lease_expires TIMESTAMPTZ,
			expires       TIMESTAMPTZ NOT NULL,
			class         TEXT NOT NULL,
			status        INT NOT NULL DEFAULT 0,
			pointer       TEXT NOT NULL DEFAULT '',
			body          BYTEA,
			effects       INT NOT NULL DEFAULT 0,
			note          TEXT NOT NULL DEFAULT '',
			escalated     BOOL NOT NULL DEFAULT false,
			PRIMARY KEY (tenant, endpoint, key)
		)`,
		// The sweeper deletes completed records by expiry.
		`CREATE INDEX idemkv_records_expiry ON idemkv_records (expires) WHERE state = 3`,
		// The records that may need settling, oldest first (List).
		`CREATE INDEX idemkv_records_unsettled ON idemkv_records (escalated, created, tenant, endpoint, key)
			WHERE state = 2 OR (state = 1 AND mode = 1)`,
		// Business data written through Effects; token is the writer's.
		`CREATE TABLE idemkv_data (
			k     BYTEA PRIMARY KEY,
			v     BYTEA NOT NULL,
			token BIGINT NOT NULL
		)`,
		// The outbox. A commit's events share a batch id; seq, the
		// order a relay reads them in, is given by the sequencer
		// (outbox.go) as they become visible, and (from version 5) so
		// is entity_seq.
		`CREATE SEQUENCE idemkv_event_ids`,
		`CREATE TABLE idemkv_outbox (
			batch      BIGINT NOT NULL,
			ord        INT NOT NULL,
			seq        BIGINT UNIQUE,
			event_id   TEXT NOT NULL,
			topic      TEXT NOT NULL,
			entity     TEXT NOT NULL,
			entity_seq BIGINT NOT NULL,
			payload    BYTEA NOT NULL,
			headers    BYTEA,
			created    TIMESTAMPTZ NOT NULL,
			PRIMARY KEY (batch, ord)
		)`,
		`CREATE INDEX idemkv_outbox_unsequenced ON idemkv_outbox (batch, ord) WHERE seq IS NULL`,
		// Each entity's last event sequence (the sequencer's, from
		// version 5).
		`CREATE TABLE idemkv_entities (
			topic  TEXT NOT NULL,
			entity TEXT NOT NULL,
			seq    BIGINT NOT NULL,
			PRIMARY KEY (topic, entity)
		)`,
		// The outbox's cursor: the last sequenced and the last
		// acknowledged event, and which store's relay has the outbox
		// until when (outbox.go).
		`CREATE TABLE idemkv_outbox_cursor (
			id          INT PRIMARY KEY,
			last        BIGINT NOT NULL,
			acked       BIGINT NOT NULL,
			relay       TEXT NOT NULL,
			relay_until TIMESTAMPTZ
		)`,
		`INSERT INTO idemkv_outbox_cursor (id, last, acked, relay) VALUES (1, 0, 0, '')`,
	}},
	{stmts: []string{
		// Relays that share the outbox (ClaimOutbox) mark what they
		// published; the acknowledged prefix is deleted. The index finds
		// each entity's earliest unpublished event.
		`ALTER TABLE idemkv_outbox ADD COLUMN published BOOL NOT NULL DEFAULT false`,
		`CREATE INDEX idemkv_outbox_entity ON idemkv_outbox (topic, entity, entity_seq) WHERE NOT published`,
	}},
	{stmts: []string{
		// The store's secret, which every process sharing the database
		// derives remote operation ids under (idemkv.DeriveOperationID):
		// one row, written once, by the migration that creates it (fill).
		`CREATE TABLE idemkv_secret (
			id     INT PRIMARY KEY,
			secret BYTEA NOT NULL CHECK (octet_length(secret) = 32)
		)`,
		// When an uncertain record was marked (Record.Marked); NULL in
		// every other state, and on records marked before version 3.
		// Nullable without a default, so adding it rewrites nothing.
		`ALTER TABLE idemkv_records ADD COLUMN marked TIMESTAMPTZ`,
	}, fill: createSecret},
	{stmts: []string{
		// How many duplicates in other processes wait for the record's
		// attempt to settle (watch.go); a new attempt starts at none. A
		// constant default, so adding it rewrites nothing.
		`ALTER TABLE idemkv_records ADD COLUMN waiters INT NOT NULL DEFAULT 0`,
	}},
	{stmts: []string{
		// An event's EntitySeq is given by the sequencer, with its Seq,
		// not by the commit that stores it (outbox.go). The check makes
		// a sequencer of an earlier build, which sets seq alone, fail on
		// such an event rather than leave it numbered without an
		// EntitySeq.
		// NOT VALID: every row already has its entity_seq (the column
		// was NOT NULL), so nothing needs scanning under the table's
		// lock; new and updated rows are checked all the same.
		`ALTER TABLE idemkv_outbox ALTER COLUMN entity_seq DROP NOT NULL`,
		`ALTER TABLE idemkv_outbox ADD CONSTRAINT idemkv_outbox_sequenced CHECK (seq IS NULL OR entity_seq IS NOT NULL) NOT VALID`,
	}},
}

// secretLen is the length of the store's secret, in bytes.
const secretLen = 32

// createSecret draws the store's secret (crypto/rand, not the server's
// random(), which is no cryptographic generator) and stores it.
func createSecret(ctx context.Context, tx pgx.Tx) error {
	secret := make([]byte, secretLen)
	if _, err := rand.Read(secret); err != nil {
		return fmt.Errorf("pgstore: draw the store's secret: %w", err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO idemkv_secret (id, secret) VALUES (1, $1)`, secret); err != nil {
		return fmt.Errorf("pgstore: store the store's secret: %w", err)
	}
	return nil
}

// readSecret reads the store's secret, which the migration to version 3
// wrote.
func readSecret(ctx context.Context, pool *pgxpool.Pool) ([]byte, error) {
	var secret []byte
	if err := pool.QueryRow(ctx, `SELECT secret FROM idemkv_secret WHERE id = 1`).Scan(&secret); err != nil {
		return nil, fmt.Errorf("pgstore: read the store's secret: %w", err)
	}
	if len(secret) != secretLen {
		return nil, fmt.Errorf("pgstore: the store's secret is %d bytes, want %d", len(secret), secretLen)
	}
	return secret, nil
}

// migrate brings the schema to SchemaVersion. Several processes may open
// the same database at once: the version row is locked (FOR UPDATE) while
// a version is applied, so one migrates and the others wait and then find
// the work done. Each version commits on its own, and waits for the locks
// it needs at most migrateLockWait: a migration queued behind a long
// transaction of a process still serving (an older build's relay holding
// a claim, say) would hold every claim of the fleet queued behind it, so
// it gives way and tries again. Creating the version table itself can
// race; a process that loses that race retries.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return migrateTo(ctx, pool, SchemaVersion)
}

const (
	// migrateLockWait bounds a migration's wait for a table's lock.
	migrateLockWait = 2 * time.Second
	// migrateTries bounds the tries of a migration that meets a race or
	// a lock it could not get.
	migrateTries = 30
)

// migrateTo brings the schema to version to.
func migrateTo(ctx context.Context, pool *pgxpool.Pool, to int) error {
	for try := 1; ; try++ {
		err := migrateOnce(ctx, pool, to)
		if err == nil || try == migrateTries || !retryableDDL(err) {
			return err
		}
		if perr := pauseAfterConflict(ctx, try); perr != nil {
			return errors.Join(err, perr)
		}
	}
}

func migrateOnce(ctx context.Context, pool *pgxpool.Pool, to int) error {
	// CREATE TABLE IF NOT EXISTS needs CREATE on the schema even when the
	// table exists, which a role that only uses the store lacks.
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('idemkv_schema') IS NOT NULL`).Scan(&exists); err != nil {
		return fmt.Errorf("pgstore: look for the schema table: %w", err)
	}
	if !exists {
		if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS idemkv_schema (
			id INT PRIMARY KEY, version INT NOT NULL)`); err != nil {
			return fmt.Errorf("pgstore: create schema table: %w", err)
		}
	}
	if _, err := pool.Exec(ctx, `INSERT INTO idemkv_schema (id, version) VALUES (1, 0) ON CONFLICT (id) DO NOTHING`); err != nil {
		return fmt.Errorf("pgstore: schema version row: %w", err)
	}
	for {
		done, err := migrateStep(ctx, pool, to)
		if err != nil || done {
			return err
		}
	}
}

// migrateStep applies the next version short of to, in a transaction of
// its own; done says there was none.
func migrateStep(ctx context.Context, pool *pgxpool.Pool, to int) (done bool, err error) {
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var v int
		if err := tx.QueryRow(ctx, `SELECT version FROM idemkv_schema WHERE id = 1 FOR UPDATE`).Scan(&v); err != nil {
			return fmt.Errorf("pgstore: read schema version: %w", err)
		}
		if v > SchemaVersion {
			return fmt.Errorf("%w: the database's idemkv schema is version %d; this build knows up to %d", errNewerSchema, v, SchemaVersion)
		}
		if v >= to {
			done = true
			return nil
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", migrateLockWait.Milliseconds())); err != nil {
			return fmt.Errorf("pgstore: migrate to schema version %d: %w", v+1, err)
		}
		m := migrations[v]
		for _, stmt := range m.stmts {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("pgstore: migrate to schema version %d: %w", v+1, err)
			}
		}
		if m.fill != nil {
			if err := m.fill(ctx, tx); err != nil {
				return fmt.Errorf("pgstore: migrate to schema version %d: %w", v+1, err)
			}
		}
		if _, err := tx.Exec(ctx, `UPDATE idemkv_schema SET version = $1 WHERE id = 1`, v+1); err != nil {
			return fmt.Errorf("pgstore: record schema version %d: %w", v+1, err)
		}
		return nil
	})
	return done, err
}

var errNewerSchema = errors.New("pgstore: schema newer than this build")

// retryableDDL reports a race between processes creating the same
// object: unique_violation (on the catalog), duplicate_table, or a
// serialization failure; duplicate_object (42710) is the table's row
// type. Or a lock not got within migrateLockWait (lock_not_available).
func retryableDDL(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	switch pe.Code {
	case "23505", "42P07", "42710", "40001", "40P01", "55P03":
		return true
	}
	return false
}
