package pgstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The outbox on PostgreSQL. A commit's events are inserted with their
// operation, under one batch id (eventsSQL). Ids drawn from a sequence
// are not in commit order, and a transaction that drew a lower id may
// commit later, so the relay does not read by id: the sequencer gives
// each event, once it is visible, its Seq, the next number after the
// last one given, in batch order, and its EntitySeq, the next of its
// entity's. Seq is then gapless and in the order events became visible,
// and an entity's events are numbered in that order too: an event that
// depends on another (its operation read what the other's wrote) was
// committed after the other was, so it drew the higher batch id and is
// visible no earlier. Numbering entities in the sequencer, one at a time,
// rather than in the commits keeps commits of one entity's events from
// writing one row, where they would conflict.

// The relays of several processes may read one outbox. So that no two
// publish the same events at once, the outbox is held by one store at a
// time, for Options.RelayLease, renewed as its relay reads: ReadOutbox of
// another store returns nothing meanwhile. The relay publishes what one
// read returned only for OutboxHold, the least a read leaves of the
// lease, and then reads again, so that the lease never runs out under a
// relay that is publishing. When the holder stops (or closes, which gives
// the outbox up at once), another takes over from the last acknowledged
// event: what the holder published and had not acknowledged (at most the
// relay's AckInterval's worth) is published again, which the broker's
// duplicate window absorbs.

// OutboxHold implements idemkv.OutboxHolder: what a read leaves of the
// relay's lease at least (holdRelay renews it once less than half is
// left), well within a claim's idle limit (claimIdle).
func (s *Store) OutboxHold() time.Duration { return min(s.opts.RelayLease/2, claimIdle/2) }

// holdRelay reports whether this store holds the outbox, taking or
// renewing the hold when less than half of it is left.
func (s *Store) holdRelay(ctx context.Context) (bool, error) {
	now := s.now()
	s.relayMu.Lock()
	defer s.relayMu.Unlock()
	if now.Before(s.relayUntil.Add(-s.opts.RelayLease / 2)) {
		return true, nil
	}
	until := now.Add(s.opts.RelayLease)
	tag, err := s.pool.Exec(ctx, `UPDATE idemkv_outbox_cursor SET relay = $1, relay_until = $2
		WHERE id = 1 AND (relay = $1 OR relay_until IS NULL OR relay_until <= $3)`, s.relayID, until, now)
	if err != nil {
		return false, s.dbErr("outbox: hold", err)
	}
	if tag.RowsAffected() == 0 {
		s.relayUntil = time.Time{}
		return false, nil
	}
	s.relayUntil = until
	return true, nil
}

// releaseRelay gives the outbox up, if this store holds it.
func (s *Store) releaseRelay() {
	s.relayMu.Lock()
	defer s.relayMu.Unlock()
	if s.relayUntil.IsZero() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = s.pool.Exec(ctx, `UPDATE idemkv_outbox_cursor SET relay_until = NULL WHERE id = 1 AND relay = $1`, s.relayID)
	s.relayUntil = time.Time{}
}

// sequenceBatch bounds the events one sequencing numbers.
const sequenceBatch = 10000

// sequenceSQL numbers the first $2 visible events without a Seq (head,
// read off the partial index in batch order), after $1, the cursor's
// last: each gets its Seq and, unless a build before schema version 5
// gave it one in its commit, its entity's next EntitySeq (en counts the
// events of an entity that need one, in order), and the entities'
// counters move past them.
const sequenceSQL = `
WITH head AS (
	SELECT batch, ord, topic, entity, entity_seq
	FROM idemkv_outbox WHERE seq IS NULL ORDER BY batch, ord LIMIT $2
),
todo AS (
	SELECT batch, ord, topic, entity, entity_seq,
		row_number() OVER (ORDER BY batch, ord) AS n,
		row_number() OVER (PARTITION BY topic, entity, entity_seq IS NULL ORDER BY batch, ord) AS en
	FROM head
),
cnt AS (
	SELECT topic, entity, count(*) AS c FROM todo WHERE entity_seq IS NULL GROUP BY topic, entity
),
ents AS (
	INSERT INTO idemkv_entities AS e (topic, entity, seq)
	SELECT topic, entity, c FROM cnt
	ON CONFLICT (topic, entity) DO UPDATE SET seq = e.seq + excluded.seq
	RETURNING topic, entity, seq
),
upd AS (
	UPDATE idemkv_outbox o SET seq = $1 + t.n,
		entity_seq = COALESCE(o.entity_seq, ents.seq - cnt.c + t.en)
	FROM todo t
		LEFT JOIN cnt ON cnt.topic = t.topic AND cnt.entity = t.entity
		LEFT JOIN ents ON ents.topic = t.topic AND ents.entity = t.entity
	WHERE o.batch = t.batch AND o.ord = t.ord
	RETURNING 1
)
SELECT count(*) FROM upd`

// sequence numbers the visible events that have no Seq yet. One
// sequencer runs at a time across every process (the cursor row is
// locked); its second statement reads a snapshot taken after that lock
// was granted, so it sees what the previous sequencer numbered.
func (s *Store) sequence(ctx context.Context) error {
	var pending bool
	if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM idemkv_outbox WHERE seq IS NULL)`).Scan(&pending); err != nil {
		return s.dbErr("outbox: look for new events", err)
	}
	if !pending {
		return nil
	}
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		var last int64
		if err := tx.QueryRow(ctx, `SELECT last FROM idemkv_outbox_cursor WHERE id = 1 FOR UPDATE`).Scan(&last); err != nil {
			return err
		}
		var n int64
		err := tx.QueryRow(ctx, sequenceSQL, last, sequenceBatch).Scan(&n)
		if err != nil || n == 0 {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE idemkv_outbox_cursor SET last = last + $1 WHERE id = 1`, n)
		return err
	})
	if err != nil {
		return s.dbErr("outbox: sequence", err)
	}
	return nil
}

// ReadOutbox implements idemkv.Outbox. While another store's relay holds
// the outbox (see holdRelay), it returns no events.
func (s *Store) ReadOutbox(ctx context.Context, after uint64, limit int) ([]idemkv.StoredEvent, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("%w: outbox read limit %d", idemkv.ErrInvalidArgument, limit)
	}
	if err := s.open(); err != nil {
		return nil, err
	}
	if held, err := s.holdRelay(ctx); err != nil || !held {
		return nil, err
	}
	if err := s.sequence(ctx); err != nil {
		return nil, err
	}
	return s.PeekOutbox(ctx, after, limit)
}

// PeekOutbox returns up to limit events numbered after after, in Seq
// order, as ReadOutbox does, but without holding the outbox for this
// store's relay or numbering new events: a look for an operator (the
// admin console, an export) that keeps the relays of the fleet
// publishing. Events committed but not yet numbered are not among them.
func (s *Store) PeekOutbox(ctx context.Context, after uint64, limit int) ([]idemkv.StoredEvent, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("%w: outbox read limit %d", idemkv.ErrInvalidArgument, limit)
	}
	if err := s.open(); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, `SELECT `+eventColumns+` FROM idemkv_outbox WHERE seq > $1 ORDER BY seq LIMIT $2`,
		int64(after), limit)
	if err != nil {
		return nil, s.dbErr("outbox: read", err)
	}
	evs, err := scanEvents(rows)
	if err != nil {
		return nil, s.dbErr("outbox: read", err)
	}
	return evs, nil
}

// eventColumns are the columns scanEvents reads, in its order.
const eventColumns = `seq, event_id, topic, entity, entity_seq, payload, headers, created`

// scanEvents reads rows of eventColumns, and closes rows.
func scanEvents(rows pgx.Rows) ([]idemkv.StoredEvent, error) {
	defer rows.Close()
	var evs []idemkv.StoredEvent
	for rows.Next() {
		var (
			ev          idemkv.StoredEvent
			seq, entSeq int64
			headers     []byte
		)
		if err := rows.Scan(&seq, &ev.ID, &ev.Topic, &ev.Key, &entSeq, &ev.Payload, &headers, &ev.Created); err != nil {
			return nil, err
		}
		ev.Seq, ev.EntitySeq = uint64(seq), uint64(entSeq)
		ev.Created = ev.Created.UTC()
		var err error
		if ev.Headers, err = decodeHeaders(headers); err != nil {
			return nil, fmt.Errorf("event %d's headers: %w", seq, err)
		}
		evs = append(evs, ev)
	}
	return evs, rows.Err()
}

// AckOutbox implements idemkv.Outbox. The acknowledged events are deleted
// in one statement, by a range of Seq.
func (s *Store) AckOutbox(ctx context.Context, through uint64, id string) error {
	if err := s.open(); err != nil {
		return err
	}
	// Numbered first, as OutboxCursor does: a store failed over since the
	// relay read may hold events no sequencer has numbered yet.
	if err := s.sequence(ctx); err != nil {
		return err
	}
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		var last, acked int64
		if err := tx.QueryRow(ctx, `SELECT last, acked FROM idemkv_outbox_cursor WHERE id = 1 FOR UPDATE`).Scan(&last, &acked); err != nil {
			return s.dbErr("outbox: ack", err)
		}
		switch {
		case through > uint64(last):
			return fmt.Errorf("%w: ack through %d, past the last event %d", idemkv.ErrConflict, through, last)
		case through <= uint64(acked):
			return nil
		}
		// The cursor's row lock keeps other acknowledgements out until
		// the commit, and a sequenced event is never changed: the event
		// read is the one acknowledged.
		var have string
		err := tx.QueryRow(ctx, `SELECT event_id FROM idemkv_outbox WHERE seq = $1`, int64(through)).Scan(&have)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return fmt.Errorf("%w: ack through event %d: the outbox does not hold it", idemkv.ErrConflict, through)
		case err != nil:
			return s.dbErr("outbox: ack", err)
		case have != id:
			return fmt.Errorf("%w: ack through event %d: it is %s, not %s", idemkv.ErrConflict, through, have, id)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM idemkv_outbox WHERE seq > $1 AND seq <= $2`, acked, int64(through)); err != nil {
			return s.dbErr("outbox: ack", err)
		}
		if _, err := tx.Exec(ctx, `UPDATE idemkv_outbox_cursor SET acked = $1 WHERE id = 1`, int64(through)); err != nil {
			return s.dbErr("outbox: ack", err)
		}
		return nil
	})
	return err
}

// OutboxCursor implements idemkv.Outbox.
func (s *Store) OutboxCursor(ctx context.Context) (acked, last uint64, err error) {
	if err := s.open(); err != nil {
		return 0, 0, err
	}
	if err := s.sequence(ctx); err != nil {
		return 0, 0, err
	}
	var a, l int64
	if err := s.pool.QueryRow(ctx, `SELECT acked, last FROM idemkv_outbox_cursor WHERE id = 1`).Scan(&a, &l); err != nil {
		return 0, 0, s.dbErr("outbox: cursor", err)
	}
	return uint64(a), uint64(l), nil
}

// OutboxNotify implements idemkv.Outbox. It fires after this process
// commits events, on a notification from another process's commit
// (LISTEN idemkv_outbox), and every Options.OutboxPoll.
func (s *Store) OutboxNotify() <-chan struct{} { return s.outbox }

func (s *Store) kickOutbox() {
	select {
	case s.outbox <- struct{}{}:
	default:
	}
}

// eventsCommitted wakes this process's relay after a commit added
// events, and has the notifier tell the other processes' relays.
func (s *Store) eventsCommitted() {
	s.kickOutbox()
	select {
	case s.announce <- struct{}{}:
	default: // one is waiting: it covers this commit too
	}
}

// announceEvents is the notifier: it sends one NOTIFY idemkv_outbox for
// the commits with events made since it last sent one, in a statement of
// its own. A NOTIFY in the commit itself would serialize the cluster's
// commits with events (PostgreSQL takes one lock for every notifying
// commit, held through its WAL flush), and those commits hold their
// rows meanwhile; one NOTIFY at a time per process never piles up. A
// NOTIFY that fails is not retried: the relays' poll (OutboxPoll) covers.
func (s *Store) announceEvents(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			// The store closes: a commit just made is still announced,
			// or other processes would learn of it only at their poll.
			select {
			case <-s.announce:
				s.sendAnnouncement(context.WithoutCancel(ctx))
			default:
			}
			return
		case <-s.announce:
			s.sendAnnouncement(context.WithoutCancel(ctx))
		}
	}
}

// announceTimeout bounds one NOTIFY of the notifier, which runs on past
// Close's cancellation.
const announceTimeout = 2 * time.Second

func (s *Store) sendAnnouncement(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, announceTimeout)
	defer cancel()
	_, _ = s.pool.Exec(ctx, `SELECT pg_notify('idemkv_outbox', '')`)
}

// listenCheck is how long the listener waits for a notification before
// it checks that its connection still answers: a connection that died
// without a word (a NAT that forgot it, a proxy that stopped forwarding)
// would otherwise leave every watch waiting out its whole timeout.
const listenCheck = 10 * time.Second

// waitForNotification returns conn's next notification, or nil after
// listenCheck without one if conn still answers a ping within
// listenCheck; an error if it does not.
func (s *Store) waitForNotification(ctx context.Context, conn *pgx.Conn) (*pgconn.Notification, error) {
	check := cmp.Or(s.opts.listenCheck, listenCheck)
	wctx, cancel := context.WithTimeout(ctx, check)
	n, err := conn.WaitForNotification(wctx)
	cancel()
	if err == nil || ctx.Err() != nil || !pgconn.Timeout(err) {
		return n, err
	}
	pctx, cancel := context.WithTimeout(ctx, check)
	defer cancel()
	if err := conn.Ping(pctx); err != nil {
		return nil, fmt.Errorf("pgstore: the listener's connection does not answer: %w", err)
	}
	return nil, nil
}

// startNotifier starts the goroutines behind OutboxNotify and Watch: a
// poll, and unless Options.NoListen, a connection listening on
// idemkv_outbox and idemkv_settled, on bgctx. It returns once the listener
// listens, or its first attempt failed, or openCtx is done, so that an
// open store can watch records (its listener retries in the background).
func (s *Store) startNotifier(openCtx, bgctx context.Context) {
	s.bg.Go(func() {
		t := time.NewTicker(s.opts.OutboxPoll)
		defer t.Stop()
		for {
			select {
			case <-bgctx.Done():
				return
			case <-t.C:
				s.kickOutbox()
			}
		}
	})
	if s.opts.NoListen {
		return
	}
	s.bg.Go(func() { s.announceEvents(bgctx) })
	ready := make(chan struct{})
	var once sync.Once
	s.bg.Go(func() {
		for bgctx.Err() == nil {
			listened := false
			err := s.listen(bgctx, func() {
				listened = true
				once.Do(func() { close(ready) })
			})
			once.Do(func() { close(ready) })
			if err != nil && !listened && bgctx.Err() == nil {
				// The database is away: the poll covers, try again later.
				// A connection that listened and then dropped is replaced
				// at once: watches are refused until it is.
				select {
				case <-bgctx.Done():
				case <-time.After(s.opts.OutboxPoll):
				}
			}
		}
	})
	select {
	case <-ready:
	case <-openCtx.Done():
	}
}

// listen waits for notifications on a connection of its own: a listener
// holds its connection for as long as the store is open, and taking it
// from the pool would leave a pool of one (Options.MaxConns) none for
// statements. It listens for the outbox's events and for settled records
// (watch.go); listening is called once it listens.
func (s *Store) listen(ctx context.Context, listening func()) error {
	conn, err := pgx.ConnectConfig(ctx, s.listenConfig)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	// The listener idles by design: a server or role setting that ends
	// idle sessions would cut it off on a schedule (a server without the
	// setting refuses it, and then has no such limit).
	var pgErr *pgconn.PgError
	if _, err := conn.Exec(ctx, "SET idle_session_timeout = 0"); err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "42704") {
		return err
	}
	for _, ch := range []string{"idemkv_outbox", "idemkv_settled"} {
		if _, err := conn.Exec(ctx, "LISTEN "+ch); err != nil {
			return err
		}
	}
	s.watches.setListening(true)
	defer s.watches.setListening(false)
	listening()
	s.kickOutbox() // events committed before the LISTEN
	for {
		n, err := s.waitForNotification(ctx, conn)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if n == nil {
			continue // quiet, and the connection answers
		}
		if n.Channel == "idemkv_settled" {
			s.watches.wakePayload(n.Payload)
			continue
		}
		s.kickOutbox()
	}
}
