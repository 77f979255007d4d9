package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Relays that share the outbox (idemkv.SharedOutbox). A claim is a
// transaction that locks, with FOR UPDATE SKIP LOCKED, the heads of some
// entities (the earliest event of each not yet published) and reads the
// events that follow them. Another relay cannot take a locked head, and
// the events after it are not heads while it is in the outbox unpublished,
// so no event is held by two claims, and an entity's events are
// published in order. Finish marks the published events and commits,
// which gives the rest back; then the prefix of the outbox that is all
// published is deleted and the cursor's acked moves past it, as a single
// relay's AckOutbox would.

// claimHeadsSQL locks up to $1 heads that no other claim holds, in Seq
// order. While a single relay holds the outbox (holdRelay, after $2) it
// takes none.
const claimHeadsSQL = `
SELECT o.topic, o.entity FROM idemkv_outbox o
WHERE o.seq IS NOT NULL AND NOT o.published
	AND NOT EXISTS (SELECT 1 FROM idemkv_outbox p
		WHERE p.topic = o.topic AND p.entity = o.entity AND p.entity_seq < o.entity_seq AND NOT p.published)
	AND NOT EXISTS (SELECT 1 FROM idemkv_outbox_cursor WHERE id = 1 AND relay_until > $2)
ORDER BY o.seq LIMIT $1
FOR UPDATE OF o SKIP LOCKED`

// claimEventsSQL reads the unpublished events of the claimed entities
// (those whose heads this transaction locked), in Seq order.
const claimEventsSQL = `
SELECT ` + eventColumns + ` FROM idemkv_outbox
WHERE seq IS NOT NULL AND NOT published
	AND (topic, entity) IN (SELECT * FROM unnest($1::text[], $2::text[]))
ORDER BY seq LIMIT $3`

// claimIdle bounds how long a claim's transaction may wait, idle, for its
// relay to publish: a relay that takes longer (a process paused, say) has
// its claim ended, and its Finish fails. A relay stops publishing a
// claim's events long before (OutboxHold) and claims again, so that a
// claim ended under it is one whose process stopped.
const claimIdle = 5 * time.Minute

// advanceLockTimeout bounds how long an advance waits for a row lock. The
// claims of other relays can hold locks on published rows they met and
// skipped (FOR UPDATE re-checks a row it has locked and keeps the lock),
// and an advance that waited for them would hold the cursor row, and so
// every sequencer, meanwhile. One that times out leaves the prefix to the
// next.
const advanceLockTimeout = "100ms"

// advanceSQL deletes the published prefix of the outbox and moves acked
// past it. Its subqueries read one snapshot: events published by claims
// that commit after it look unpublished and end the prefix early (the
// next advance takes them), and events numbered after it have Seq past
// that snapshot's last.
const advanceSQL = `
WITH bound AS (
	SELECT COALESCE((SELECT min(seq) - 1 FROM idemkv_outbox WHERE seq IS NOT NULL AND NOT published),
		(SELECT last FROM idemkv_outbox_cursor WHERE id = 1)) AS through
),
gone AS (
	DELETE FROM idemkv_outbox WHERE seq <= (SELECT through FROM bound) AND published
)
UPDATE idemkv_outbox_cursor SET acked = GREATEST(acked, (SELECT through FROM bound)) WHERE id = 1`

// ClaimOutbox implements idemkv.SharedOutbox. The claim holds a
// connection of the pool until it is finished.
func (s *Store) ClaimOutbox(ctx context.Context, limit int) (idemkv.OutboxClaim, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("%w: outbox claim limit %d", idemkv.ErrInvalidArgument, limit)
	}
	if err := s.open(); err != nil {
		return nil, err
	}
	if err := s.sequence(ctx); err != nil {
		return nil, err
	}
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return nil, s.dbErr("outbox: claim", err)
	}
	c := &outboxClaim{s: s, tx: tx}
	// A relay that hangs with its claim open (its host stalls, its network
	// goes) would hold its entities until the server noticed the dead
	// connection: the server ends the claim's session after this long
	// idle instead, and the events are claimed again.
	_, err = tx.Exec(ctx, fmt.Sprintf("SET LOCAL idle_in_transaction_session_timeout = %d", claimIdle.Milliseconds()))
	if err == nil {
		c.events, err = claimEvents(ctx, tx, limit, s.now())
	}
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, s.dbErr("outbox: claim", err)
	}
	return c, nil
}

// claimEvents locks heads and reads the events of their entities.
func claimEvents(ctx context.Context, tx pgx.Tx, limit int, now time.Time) ([]idemkv.StoredEvent, error) {
	rows, err := tx.Query(ctx, claimHeadsSQL, limit, now)
	if err != nil {
		return nil, err
	}
	var topics, entities []string
	for rows.Next() {
		var t, e string
		if err := rows.Scan(&t, &e); err != nil {
			rows.Close()
			return nil, err
		}
		topics, entities = append(topics, t), append(entities, e)
	}
	if rows.Close(); rows.Err() != nil {
		return nil, rows.Err()
	}
	if len(topics) == 0 {
		return nil, nil
	}
	rows, err = tx.Query(ctx, claimEventsSQL, topics, entities, limit)
	if err != nil {
		return nil, err
	}
	return scanEvents(rows)
}

type outboxClaim struct {
	s      *Store
	tx     pgx.Tx
	events []idemkv.StoredEvent
	done   bool
}

func (c *outboxClaim) Events() []idemkv.StoredEvent { return c.events }

// Finish implements idemkv.OutboxClaim.
func (c *outboxClaim) Finish(ctx context.Context, published int) error {
	if c.done {
		return fmt.Errorf("%w: outbox claim finished twice", idemkv.ErrInvalidArgument)
	}
	c.done = true
	bg := context.WithoutCancel(ctx)
	if published < 0 || published > len(c.events) {
		_ = c.tx.Rollback(bg)
		return fmt.Errorf("%w: %d of a claim of %d events published", idemkv.ErrInvalidArgument, published, len(c.events))
	}
	if published == 0 {
		return c.tx.Rollback(bg)
	}
	seqs := make([]int64, published)
	for i := range seqs {
		seqs[i] = int64(c.events[i].Seq)
	}
	// What the broker has is marked even if ctx has ended (a relay
	// stopping): otherwise it would all be published again.
	if _, err := c.tx.Exec(bg, `UPDATE idemkv_outbox SET published = true WHERE seq = ANY($1)`, seqs); err != nil {
		_ = c.tx.Rollback(bg)
		return c.s.dbErr("outbox: mark published", err)
	}
	if err := c.tx.Commit(bg); err != nil {
		return c.s.dbErr("outbox: mark published", err)
	}
	return c.s.advance(bg)
}

// advance deletes the outbox's published prefix (advanceSQL), unless a
// row lock held elsewhere would make it wait: the events stay marked, and
// the next advance deletes them.
func (s *Store) advance(ctx context.Context) error {
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+advanceLockTimeout+"'"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, advanceSQL)
		return err
	})
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "55P03" { // lock_not_available
		return nil
	}
	if err != nil {
		return s.dbErr("outbox: advance", err)
	}
	return nil
}
