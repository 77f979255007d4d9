package engine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine/internal/record"
)

// The outbox: events emitted through Effects.Emit are written, numbered
// by the committer (txn.go), in the batch of their operation's outcome,
// under 0x06 'e' and their sequence; a relay reads them in order and
// acknowledges what the broker has, which deletes them with one range
// deletion and moves a cursor, in one batch.

var _ idemkv.Outbox = (*Engine)(nil)

// outboxState is the acknowledged cursor. mu serializes acks.
type outboxState struct {
	mu    sync.Mutex
	acked uint64
}

// loadOutbox reads the cursor and the last event's sequence, from which
// the committer numbers new events.
func (e *Engine) loadOutbox() error {
	v, closer, err := e.db.Get(record.OutboxCursorKey)
	switch {
	case errors.Is(err, pebble.ErrNotFound):
	case err != nil:
		return err
	default:
		if len(v) != 8 {
			closer.Close()
			return fmt.Errorf("%w: outbox cursor of %d bytes", record.ErrCorrupt, len(v))
		}
		e.outbox.acked = binary.BigEndian.Uint64(v)
		closer.Close()
	}
	last := e.outbox.acked
	it, err := e.db.NewIter(&pebble.IterOptions{LowerBound: record.OutboxEventPrefix, UpperBound: prefixEnd(record.OutboxEventPrefix)})
	if err != nil {
		return err
	}
	if it.Last() {
		if last, err = record.OutboxEventSeq(it.Key()); err != nil {
			it.Close()
			return err
		}
	}
	if err := it.Close(); err != nil {
		return err
	}
	e.commits.mu.outboxSeq, e.commits.mu.outboxCommitted = last, last
	return e.commits.loadEntityFilter()
}

// ReadOutbox implements idemkv.Outbox. It reads only committed events,
// up to the last the committer has counted (OutboxCursor's last).
func (e *Engine) ReadOutbox(ctx context.Context, after uint64, limit int) ([]idemkv.StoredEvent, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("%w: outbox read limit %d", idemkv.ErrInvalidArgument, limit)
	}
	if err := e.gate.begin(ctx); err != nil {
		return nil, err
	}
	defer e.gate.exit()
	// Up to the last event the committer counts as committed: a later
	// one may be visible already, but an acknowledgement must never pass
	// what AckOutbox can check.
	_, committed := e.outboxSeqs()
	if committed <= after {
		return nil, nil
	}
	it, err := e.db.NewIter(&pebble.IterOptions{LowerBound: record.OutboxEventKey(after + 1), UpperBound: record.OutboxEventKey(committed + 1)})
	if err != nil {
		return nil, fmt.Errorf("engine: read outbox: %w", err)
	}
	var evs []idemkv.StoredEvent
	for valid := it.First(); valid && len(evs) < limit; valid = it.Next() {
		seq, err := record.OutboxEventSeq(it.Key())
		var v []byte
		if err == nil {
			v, err = it.ValueAndErr()
		}
		var ev idemkv.StoredEvent
		if err == nil {
			ev, _, err = record.DecodeEvent(seq, v)
		}
		if err != nil {
			it.Close()
			return nil, fmt.Errorf("engine: read outbox: %w", err)
		}
		evs = append(evs, ev)
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("engine: read outbox: %w", err)
	}
	return evs, nil
}

// AckOutbox implements idemkv.Outbox: the events up to through go with
// one range deletion, in the batch that moves the cursor. The batch is not
// synced (see below): an acknowledgement is durable once a later synced
// commit, or Pebble's own log rotation, has synced it.
func (e *Engine) AckOutbox(ctx context.Context, through uint64, id string) error {
	if err := e.writable(); err != nil {
		return err
	}
	if err := e.gate.begin(ctx); err != nil {
		return err
	}
	defer e.gate.exit()
	e.outbox.mu.Lock()
	defer e.outbox.mu.Unlock()
	if through <= e.outbox.acked {
		return nil
	}
	if _, last := e.outboxSeqs(); through > last {
		return fmt.Errorf("%w: ack through event %d, but the last committed is %d", idemkv.ErrConflict, through, last)
	}
	if err := e.outboxEventIs(through, id); err != nil {
		return err
	}
	b := e.db.NewBatch()
	defer b.Close()
	_ = b.DeleteRange(record.OutboxEventKey(e.outbox.acked+1), record.OutboxEventKey(through+1), nil)
	_ = b.Set(record.OutboxCursorKey, binary.BigEndian.AppendUint64(nil, through), nil)
	// Unsynced, like the sweeper's deletes: it rides in the next synced
	// group, or in a commit of its own that waits for no fsync. A crash
	// can lose the last acknowledgements; the relay then publishes those
	// events again, with their ids, which is what at least once allows
	// and what a deduplicating broker absorbs. No event is lost by it.
	g, first, err := e.commits.enqueue(b, false, nil)
	if werr := e.commits.wait(g, first); err == nil {
		err = werr
	}
	if err != nil {
		return e.fail(fmt.Errorf("engine: ack outbox: %w", err))
	}
	e.outbox.acked = through
	return nil
}

// outboxEventIs checks that the event numbered seq, unacknowledged and
// committed, has id. The acknowledging goroutine holds outbox.mu, so the
// event stays as read until its batch commits.
func (e *Engine) outboxEventIs(seq uint64, id string) error {
	v, closer, err := e.db.Get(record.OutboxEventKey(seq))
	switch {
	case errors.Is(err, pebble.ErrNotFound):
		return fmt.Errorf("%w: ack through event %d: the outbox does not hold it", idemkv.ErrConflict, seq)
	case err != nil:
		return fmt.Errorf("engine: ack outbox: event %d: %w", seq, err)
	}
	ev, _, err := record.DecodeEvent(seq, v)
	closer.Close()
	if err != nil {
		return fmt.Errorf("engine: ack outbox: %w", err)
	}
	if ev.ID != id {
		return fmt.Errorf("%w: ack through event %d: it is %s, not %s", idemkv.ErrConflict, seq, ev.ID, id)
	}
	return nil
}

// OutboxCursor implements idemkv.Outbox.
func (e *Engine) OutboxCursor(ctx context.Context) (acked, last uint64, err error) {
	if err := e.gate.enter(); err != nil {
		return 0, 0, err
	}
	defer e.gate.exit()
	e.outbox.mu.Lock()
	acked = e.outbox.acked
	e.outbox.mu.Unlock()
	_, last = e.outboxSeqs()
	return acked, last, nil
}

// OutboxNotify implements idemkv.Outbox.
func (e *Engine) OutboxNotify() <-chan struct{} { return e.commits.outboxReady }

// outboxSeqs returns the sequence of the last event enqueued and of the
// last committed.
func (e *Engine) outboxSeqs() (enqueued, committed uint64) {
	e.commits.mu.Lock()
	defer e.commits.mu.Unlock()
	return e.commits.mu.outboxSeq, e.commits.mu.outboxCommitted
}

// Update runs fn as one durable transaction on the business data, outside
// any idempotency record: for seeding and administration. Its reads are
// checked at commit like an operation's (fn runs again if they changed,
// up to a bound, then idemkv.ErrConflict), and its events are emitted
// with it. If fn returns an error nothing is written and Update returns
// it. Values it writes belong to no outcome; Check counts them apart
// (CheckReport.EffectsStandalone).
func (e *Engine) Update(ctx context.Context, fn func(idemkv.Effects) error) error {
	if err := e.writable(); err != nil {
		return err
	}
	if err := e.gate.begin(ctx); err != nil {
		return err
	}
	defer e.gate.exit()
	return e.runConflicts(func() error {
		fx := e.newEffects()
		fx.noResult = true
		defer fx.close()
		if err := fn(fx); err != nil {
			return fx.failed(err)
		}
		token, err := e.nextToken()
		if err != nil {
			return err
		}
		b := e.db.NewBatch()
		defer b.Close()
		fx.writeTo(b, token, time.Time{})
		err = e.commits.commitTxn(b, fx.txn(token, e.clock.Now()))
		if err != nil && !errors.Is(err, errConflict) {
			err = e.fail(fmt.Errorf("engine: update: %w", err))
		}
		return err
	})
}
