package pgstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/idemkv/idemkv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// effects collects what an apply function writes, and reads through the
// operation's transaction. The transaction is begun at the first read, at
// SERIALIZABLE isolation: PostgreSQL then refuses to commit it (SQLSTATE
// 40001) if anything it read was changed by a transaction that committed
// since, which is the contract's check of an apply function's reads. A
// function that reads nothing needs no such check, and its writes go out
// in one statement with the outcome.
type effects struct {
	s   *Store
	ctx context.Context
	tx  pgx.Tx
	// writes is each key's last write, in the order the keys were first
	// written.
	keys   [][]byte
	writes map[string]write
	size   int
	events []idemkv.Event
	result *idemkv.Result
	// blind: the writes go out in RunLocal's statement, which cannot
	// check reads (Get refuses, and says so in readRefused).
	blind, readRefused bool
	// serialErr is a read's failure to serialize: the run must be run
	// again, whatever the apply function made of the error.
	serialErr error
}

func (s *Store) newEffects(ctx context.Context) *effects {
	return &effects{s: s, ctx: ctx, writes: map[string]write{}}
}

// write is a key's last write: a value, or a deletion.
type write struct {
	value   []byte
	deleted bool
}

func (fx *effects) fits(n int) error {
	if fx.size+n > fx.s.opts.MaxEffectsSize {
		return fmt.Errorf("%w: effects of one operation would be %d bytes, limit %d (Options.MaxEffectsSize)",
			idemkv.ErrInvalidArgument, fx.size+n, fx.s.opts.MaxEffectsSize)
	}
	return nil
}

// Get implements idemkv.Effects.
func (fx *effects) Get(key []byte) ([]byte, error) {
	if err := idemkv.ValidateEffectKey(key); err != nil {
		return nil, err
	}
	if w, ok := fx.writes[string(key)]; ok {
		if w.deleted {
			return nil, fmt.Errorf("%w: data key %q (deleted by this operation)", idemkv.ErrNotFound, key)
		}
		return bytes.Clone(w.value), nil
	}
	if fx.blind {
		fx.readRefused = true
		return nil, errReads
	}
	if err := fx.begin(); err != nil {
		return nil, err
	}
	var v []byte
	err := fx.tx.QueryRow(fx.ctx, `SELECT v FROM idemkv_data WHERE k = $1`, key).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: data key %q", idemkv.ErrNotFound, key)
	}
	if err != nil {
		err = fx.s.dbErr("read data", err)
		if serialization(err) {
			fx.serialErr = err
		}
		return nil, err
	}
	return v, nil
}

// begin begins the operation's transaction, if it has none yet.
func (fx *effects) begin() error {
	if fx.tx != nil {
		return nil
	}
	tx, err := fx.s.pool.BeginTx(fx.ctx, pgx.TxOptions{IsoLevel: pgx.Serializable})
	if err != nil {
		return fx.s.dbErr("begin", err)
	}
	fx.tx = tx
	return nil
}

// Set implements idemkv.Effects.
func (fx *effects) Set(key, value []byte) error {
	if err := idemkv.ValidateEffectKey(key); err != nil {
		return err
	}
	if err := fx.fits(len(key) + len(value)); err != nil {
		return err
	}
	fx.put(key, write{value: append([]byte{}, value...)}) // an empty value, not NULL
	return nil
}

// Delete implements idemkv.Effects.
func (fx *effects) Delete(key []byte) error {
	if err := idemkv.ValidateEffectKey(key); err != nil {
		return err
	}
	if err := fx.fits(len(key)); err != nil {
		return err
	}
	fx.put(key, write{deleted: true})
	return nil
}

func (fx *effects) put(key []byte, w write) {
	if _, ok := fx.writes[string(key)]; !ok {
		fx.keys = append(fx.keys, bytes.Clone(key))
	}
	fx.writes[string(key)] = w
	fx.size += len(key) + len(w.value)
}

// Emit implements idemkv.Effects.
func (fx *effects) Emit(ev idemkv.Event) error {
	if err := ev.Validate(); err != nil {
		return err
	}
	if !pgText(ev.Key) {
		return fmt.Errorf("%w: an event key that is not UTF-8 text without NUL (the PostgreSQL store keeps it as text)", idemkv.ErrInvalidArgument)
	}
	n := eventSize(&ev)
	if n > fx.s.opts.MaxEventSize {
		return fmt.Errorf("%w: event of %d bytes, limit %d (Options.MaxEventSize)", idemkv.ErrInvalidArgument, n, fx.s.opts.MaxEventSize)
	}
	if err := fx.fits(n); err != nil {
		return err
	}
	ev.Payload = bytes.Clone(ev.Payload)
	ev.Headers = maps.Clone(ev.Headers)
	fx.events = append(fx.events, ev)
	fx.size += n
	return nil
}

// SetResult implements idemkv.ResultSetter.
func (fx *effects) SetResult(r idemkv.Result) error {
	if err := fx.s.validateResult(&r); err != nil {
		return err
	}
	r.Body = bytes.Clone(r.Body)
	fx.result = &r
	return nil
}

func eventSize(ev *idemkv.Event) int {
	n := len(ev.Topic) + len(ev.Key) + len(ev.Payload)
	for k, v := range ev.Headers {
		n += len(k) + len(v)
	}
	return n
}

// Effects of an operation, as the arguments of writeSQL's parts: the keys
// set and their values, the keys deleted, the count of values set (what
// Record.Effects counts), and the events.
type writeArgs struct {
	setKeys, setVals, delKeys [][]byte
	topics, entities          []string
	payloads                  [][]byte
	headers                   [][]byte
	eventIDs                  []string
}

// args are the statement's parameters for fx's writes. The keys go in
// their order, so that two operations writing the same rows lock them in
// one order, not into a deadlock that PostgreSQL breaks only after
// deadlock_timeout.
func (fx *effects) args() (writeArgs, error) {
	var a writeArgs
	keys := slices.SortedFunc(slices.Values(fx.keys), bytes.Compare)
	for _, k := range keys {
		if w := fx.writes[string(k)]; !w.deleted {
			a.setKeys, a.setVals = append(a.setKeys, k), append(a.setVals, w.value)
		} else {
			a.delKeys = append(a.delKeys, k)
		}
	}
	for _, ev := range fx.events {
		a.topics = append(a.topics, ev.Topic)
		a.entities = append(a.entities, ev.Key)
		a.payloads = append(a.payloads, append([]byte{}, ev.Payload...)) // an empty payload, not NULL
		a.headers = append(a.headers, encodeHeaders(ev.Headers))
		a.eventIDs = append(a.eventIDs, newEventID())
	}
	return a, nil
}

// newEventID returns an event id: 16 random bytes in hex, as the engine's.
func newEventID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// transact runs one write that may carry an apply function's effects: it
// runs apply, then write with the effects (in the transaction apply's
// reads began, if any), and commits. A transaction that fails to
// serialize with another runs again from apply after a short random
// pause: if it read, up to maxConflictRuns times, then it fails with
// idemkv.ErrConflict; if it read nothing, up to maxBlindRuns times.
func (s *Store) transact(ctx context.Context, apply func(idemkv.Effects) error, write func(fx *effects, q querier) error) error {
	var reading, blind int
	for {
		read, err := s.transactOnce(ctx, apply, write)
		if !serialization(err) {
			return err
		}
		s.counter.conflicts.Add(1)
		if read {
			reading++
		} else {
			blind++
		}
		switch {
		case reading == maxConflictRuns:
			return fmt.Errorf("%w: its transaction failed to serialize %d times in a row: %w", idemkv.ErrConflict, reading+blind, err)
		case blind == maxBlindRuns:
			return fmt.Errorf("pgstore: a write that read nothing failed to serialize %d times in a row: %w", blind, err)
		}
		if perr := pauseAfterConflict(ctx, reading+blind); perr != nil {
			return perr
		}
	}
}

// transactOnce is one run of transact; read says that apply read (began
// the transaction).
func (s *Store) transactOnce(ctx context.Context, apply func(idemkv.Effects) error, write func(fx *effects, q querier) error) (read bool, err error) {
	fx := s.newEffects(ctx)
	defer func() {
		if fx.tx != nil {
			_ = fx.tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	if apply != nil {
		err := apply(fx)
		if fx.serialErr != nil { // a read failed to serialize: whatever apply made of it
			return true, fx.serialErr
		}
		if err != nil {
			return fx.tx != nil, err
		}
	}
	if fx.tx == nil {
		return false, write(fx, s.blind(len(fx.keys) > 0)) // one statement, its own transaction
	}
	if err := write(fx, fx.tx); err != nil {
		return true, err
	}
	if err := fx.tx.Commit(ctx); err != nil {
		return true, s.dbErr("commit", err)
	}
	fx.tx = nil
	return true, nil
}

// blind is where a statement without a transaction of its own runs: in
// a SERIALIZABLE transaction of its own if it writes data keys
// (serial.go), else as it is.
func (s *Store) blind(writesData bool) querier {
	if writesData && !s.opts.readCommittedData {
		return serialPool{s.pool}
	}
	return s.pool
}

// querier is a pool or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}
