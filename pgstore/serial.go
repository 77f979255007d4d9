package pgstore

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Writes of business data are serializable with every other operation's
// reads, whether they read or not. PostgreSQL checks serializability
// (SSI) only among SERIALIZABLE transactions: a write made at READ
// COMMITTED is invisible to the check of the transactions that read what
// it changed, and three operations, one of which read a key as absent,
// could then commit in no serial order. So a statement that writes data
// keys and has no transaction of its own (an apply function that only
// writes) runs in a SERIALIZABLE transaction too: BEGIN, the statement and
// COMMIT go in one pipeline, one round trip, as the statement alone did.
// A statement that writes no data key (a claim, an outcome without
// effects, the relay's) stays at READ COMMITTED: no operation reads what
// it writes through Effects.

// serialPool runs each statement in a SERIALIZABLE transaction of its own
// (a querier).
type serialPool struct{ pool *pgxpool.Pool }

func (p serialPool) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return serialRow{p: p, ctx: ctx, sql: sql, args: args}
}

func (p serialPool) Exec(ctx context.Context, sql string, args ...any) (tag pgconn.CommandTag, err error) {
	err = p.run(ctx, sql, args, func(br pgx.BatchResults) error {
		tag, err = br.Exec()
		return err
	})
	return tag, err
}

type serialRow struct {
	p    serialPool
	ctx  context.Context
	sql  string
	args []any
}

func (r serialRow) Scan(dest ...any) error {
	return r.p.run(r.ctx, r.sql, r.args, func(br pgx.BatchResults) error { return br.QueryRow().Scan(dest...) })
}

// run sends BEGIN, sql and COMMIT in one batch, reading sql's result with
// read. A statement that returns no row (pgx.ErrNoRows) still commits. A
// statement the server failed leaves its transaction aborted (the server
// skips the COMMIT): it is rolled back before the connection goes back
// to the pool. (The COMMIT is sent with the statement, so a result that
// failed to decode here, after the server ran it, has committed: the
// store's statements return counts and records of fixed types.)
func (p serialPool) run(ctx context.Context, sql string, args []any, read func(pgx.BatchResults) error) error {
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	b := &pgx.Batch{}
	b.Queue("BEGIN ISOLATION LEVEL SERIALIZABLE")
	b.Queue(sql, args...)
	b.Queue("COMMIT")
	br := conn.SendBatch(ctx, b)
	_, err = br.Exec()
	if err == nil {
		err = read(br)
		if err == nil || errors.Is(err, pgx.ErrNoRows) {
			if _, cerr := br.Exec(); cerr != nil {
				err = cerr
			}
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if conn.Conn().PgConn().TxStatus() != 'I' {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = conn.Exec(rctx, "ROLLBACK") // else the pool drops the connection
	}
	return err
}
