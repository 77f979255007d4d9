package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine/internal/record"
)

// Business data: the values an operation writes through idemkv.Effects.
// They live in a namespace of their own (record.NSData), each value
// stamped with the token and expiry of the outcome it committed with, so
// that Check can pair every value with its outcome.

// GetData reads a value written through Effects. The returned slice is the
// caller's. It returns ErrNotFound if key is absent.
//
// Like any Pebble read, it may observe effects whose Complete is still
// syncing; a crash before that sync ends removes them together with their
// outcome.
func (e *Engine) GetData(ctx context.Context, key []byte) ([]byte, error) {
	if err := idemkv.ValidateEffectKey(key); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := e.gate.enter(); err != nil {
		return nil, err
	}
	defer e.gate.exit()
	v, closer, err := e.db.Get(dataKey(key))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, fmt.Errorf("%w: data key %q", idemkv.ErrNotFound, key)
	}
	if err != nil {
		return nil, fmt.Errorf("engine: read data: %w", err)
	}
	defer closer.Close()
	_, _, val, err := record.SplitStamp(v)
	if err != nil {
		return nil, fmt.Errorf("engine: read data %q: %w", key, err)
	}
	return bytes.Clone(val), nil
}

// effectBuf collects the writes an apply function makes through Effects.
// They go into the commit's batch only once the commit knows the token and
// expiry of the outcome they pair with, which every value is stamped with
// (record.AppendStamp).
type effectBuf struct {
	// limit bounds the arena and the events: Options.MaxEffectsSize.
	limit int
	ops   []effectOp
	arena []byte
	// e reads committed data for Get; nil: Get reads only the writes
	// made here.
	e *Engine
	// snap is the committed state Get reads, taken at its first read
	// from Pebble. A key that a group still committing writes is read
	// from that group instead (txn.go), so the reads need not be one
	// state: reads are the keys read and the versions seen, checked at
	// commit, and when the apply function fails (failed).
	snap  *pebble.Snapshot
	reads []readVersion
	// fromPending and fromSnap say where first reads came from: both,
	// and the reads may not be one state (failed).
	fromPending, fromSnap bool
	// result, if set, replaces the result the operation completes with
	// (idemkv.ResultSetter).
	result *idemkv.Result
	// noResult: there is no result to set (Update).
	noResult bool
	// events are the events emitted, in order; eventBytes their size.
	events     []idemkv.Event
	eventBytes int
	// Inline room for the common apply (a few small writes), so that
	// collecting them allocates nothing beyond the buffer itself.
	opsInline   [4]effectOp
	arenaInline [256]byte
}

// effectOp is one write, as offsets into the arena; a delete has val < 0.
type effectOp struct{ key, keyEnd, val, valEnd int }

func (w *effectBuf) init() {
	if w.ops == nil {
		w.ops, w.arena = w.opsInline[:0], w.arenaInline[:0]
	}
}

// fits reports whether n more bytes keep the writes within their limit.
func (w *effectBuf) fits(n int) error {
	if len(w.arena)+w.eventBytes+n > w.limit {
		return fmt.Errorf("%w: effects of one operation would be %d bytes, limit %d (Options.MaxEffectsSize)",
			idemkv.ErrInvalidArgument, len(w.arena)+w.eventBytes+n, w.limit)
	}
	return nil
}

// newEffects returns an effect buffer whose Get reads e's data.
func (e *Engine) newEffects() *effectBuf {
	return &effectBuf{limit: e.opts.MaxEffectsSize, e: e}
}

// Get returns key's value as the apply function sees it: its last write
// to key, else what its first read of key returned, else the value a
// group not yet committed writes to it (see txn.go), else the committed
// value as of its first read from Pebble; it remembers the version read,
// to check at commit.
func (w *effectBuf) Get(key []byte) ([]byte, error) {
	if err := idemkv.ValidateEffectKey(key); err != nil {
		return nil, err
	}
	for i := len(w.ops) - 1; i >= 0; i-- {
		op := w.ops[i]
		if !bytes.Equal(w.arena[op.key:op.keyEnd], key) {
			continue
		}
		if op.val < 0 {
			return nil, fmt.Errorf("%w: data key %q (deleted by this operation)", idemkv.ErrNotFound, key)
		}
		return bytes.Clone(w.arena[op.val:op.valEnd]), nil
	}
	if w.e == nil {
		return nil, fmt.Errorf("%w: these effects read only their own writes", idemkv.ErrInvalidArgument)
	}
	dk := dataKey(key)
	var (
		token   uint64
		val     []byte
		pending bool
		err     error
	)
	switch first, read := w.readBefore(dk); {
	case read && first.pending:
		token, val = first.token, bytes.Clone(first.value)
	case read:
		token, val, err = readStamped(w.snap, dk) // as the first read did
	default:
		if token, val, pending = w.e.commits.pendingRead(dk); pending {
			val = bytes.Clone(val)
			w.reads = append(w.reads, readVersion{key: dk, token: token, value: val, pending: true})
			val = bytes.Clone(val)
			w.fromPending = true
			break
		}
		w.fromSnap = true
		if w.snap == nil {
			w.snap = w.e.db.NewSnapshot()
		}
		token, val, err = readStamped(w.snap, dk)
		w.reads = append(w.reads, readVersion{key: dk, token: token})
	}
	if err != nil {
		return nil, err
	}
	if token == 0 {
		return nil, fmt.Errorf("%w: data key %q", idemkv.ErrNotFound, key)
	}
	return val, nil
}

// failed returns err, the apply function's error. Only when its reads may
// not have been one state (some from a group still committing, others
// from the snapshot, which that group may have changed since committing)
// and one has changed since, it returns errConflict instead, so that the
// function runs again: an error found in a state the data never had is
// not the function's answer. Otherwise the error is returned as it is,
// however the data has moved on.
func (w *effectBuf) failed(err error) error {
	if !w.fromPending || !w.fromSnap {
		return err
	}
	for _, r := range w.reads {
		token, _, pending := w.e.commits.pendingRead(r.key)
		if !pending {
			var rerr error
			if token, _, rerr = readStamped(w.e.db, r.key); rerr != nil {
				return err
			}
		}
		if token != r.token {
			return errConflict
		}
	}
	return err
}

// readBefore returns what the apply function's first read of the data
// key dk saw, if it read it. A later read returns the same: the first may
// have come from a group not yet committed (pending), newer than the
// snapshot, and a second read from the snapshot would go back to a
// version the commit's check would not catch; one from the snapshot
// reads the snapshot again.
func (w *effectBuf) readBefore(dk []byte) (readVersion, bool) {
	for _, r := range w.reads {
		if bytes.Equal(r.key, dk) {
			return r, true
		}
	}
	return readVersion{}, false
}

// readStamped reads the data key dk: the token its value is stamped with
// and a copy of the value; token 0 if dk is absent.
func readStamped(r pebble.Reader, dk []byte) (uint64, []byte, error) {
	v, closer, err := r.Get(dk)
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, nil, nil
	}
	if err != nil {
		return 0, nil, fmt.Errorf("engine: read data: %w", err)
	}
	defer closer.Close()
	token, _, val, err := record.SplitStamp(v)
	if err != nil {
		return 0, nil, fmt.Errorf("engine: read data %q: %w", dk[1:], err)
	}
	return token, bytes.Clone(val), nil
}

// Emit buffers ev for the outbox; the committer numbers it (outbox.go).
func (w *effectBuf) Emit(ev idemkv.Event) error {
	if err := validateEvent(&ev, w.e); err != nil {
		return err
	}
	n := record.EventSize(&ev)
	if err := w.fits(n); err != nil {
		return err
	}
	ev.Payload = bytes.Clone(ev.Payload)
	ev.Headers = maps.Clone(ev.Headers)
	w.events = append(w.events, ev)
	w.eventBytes += n
	return nil
}

// SetResult implements idemkv.ResultSetter.
func (w *effectBuf) SetResult(r idemkv.Result) error {
	if w.e == nil || w.noResult {
		return fmt.Errorf("%w: these effects complete no operation", idemkv.ErrInvalidArgument)
	}
	if err := w.e.validateResult(&r); err != nil {
		return err
	}
	r.Body = bytes.Clone(r.Body)
	w.result = &r
	return nil
}

// close releases the snapshot Get read from.
func (w *effectBuf) close() {
	if w.snap != nil {
		_ = w.snap.Close()
		w.snap = nil
	}
}

func (w *effectBuf) Set(key, value []byte) error {
	if err := idemkv.ValidateEffectKey(key); err != nil {
		return err
	}
	if err := w.fits(len(key) + len(value)); err != nil {
		return err
	}
	w.init()
	op := effectOp{key: len(w.arena)}
	w.arena = append(w.arena, key...)
	op.keyEnd, op.val = len(w.arena), len(w.arena)
	w.arena = append(w.arena, value...)
	op.valEnd = len(w.arena)
	w.ops = append(w.ops, op)
	return nil
}

func (w *effectBuf) Delete(key []byte) error {
	if err := idemkv.ValidateEffectKey(key); err != nil {
		return err
	}
	if err := w.fits(len(key)); err != nil {
		return err
	}
	w.init()
	op := effectOp{key: len(w.arena), val: -1}
	w.arena = append(w.arena, key...)
	op.keyEnd = len(w.arena)
	w.ops = append(w.ops, op)
	return nil
}

// writeTo puts the collected writes into b, each value stamped with token
// and expires, and returns how many distinct keys end up set.
func (w *effectBuf) writeTo(b *pebble.Batch, token uint64, expires time.Time) int {
	var stamp [record.StampLen]byte
	record.AppendStamp(stamp[:0], token, expires)
	for _, op := range w.ops {
		key := w.arena[op.key:op.keyEnd]
		// Written in place in the batch: no copy of key or value here.
		var d *pebble.DeferredBatchOp
		if op.val < 0 {
			d = b.DeleteDeferred(1 + len(key))
		} else {
			val := w.arena[op.val:op.valEnd]
			d = b.SetDeferred(1+len(key), len(stamp)+len(val))
			copy(d.Value[copy(d.Value, stamp[:]):], val)
		}
		d.Key[0] = nsData
		copy(d.Key[1:], key)
		_ = d.Finish()
	}
	switch len(w.ops) {
	case 0:
		return 0
	case 1:
		if w.ops[0].val < 0 {
			return 0
		}
		return 1
	}
	last := make(map[string]bool, len(w.ops))
	for _, op := range w.ops {
		last[string(w.arena[op.key:op.keyEnd])] = op.val >= 0
	}
	n := 0
	for _, set := range last {
		if set {
			n++
		}
	}
	return n
}

// ScanData implements idemkv.DataReader. Like GetData, it may observe
// effects whose Complete is still syncing.
func (e *Engine) ScanData(ctx context.Context, prefix []byte, fn func(key, value []byte) bool) error {
	return e.ScanDataAfter(ctx, prefix, nil, fn)
}

// ScanDataAfter implements idemkv.DataReader. It reads one Pebble
// snapshot-less iterator: keys written meanwhile are seen if they sort
// after the point it has reached.
func (e *Engine) ScanDataAfter(ctx context.Context, prefix, after []byte, fn func(key, value []byte) bool) error {
	if err := idemkv.ValidateDataScan(prefix, after); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := e.gate.enter(); err != nil {
		return err
	}
	defer e.gate.exit()
	first := dataKey(prefix)
	upper := prefixEnd(first)
	lower := first
	if after != nil {
		lower = append(dataKey(after), 0) // the first key after it
	}
	it, err := e.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return fmt.Errorf("engine: scan data: %w", err)
	}
	n := len(first) - len(prefix)
	for i, valid := 0, it.First(); valid; i, valid = i+1, it.Next() {
		v, err := it.ValueAndErr()
		if err == nil && i%scanCheckEvery == 0 {
			err = ctx.Err()
		}
		if err == nil {
			_, _, v, err = record.SplitStamp(v)
		}
		if err != nil {
			it.Close()
			return fmt.Errorf("engine: scan data: %w", err)
		}
		if !fn(it.Key()[n:], v) {
			break
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("engine: scan data: %w", err)
	}
	return nil
}

// scanCheckEvery is how many values a scan reads between looks at its
// context.
const scanCheckEvery = 256

// prefixEnd returns the smallest key greater than every key with prefix p,
// or nil if there is none (p is all 0xff).
func prefixEnd(p []byte) []byte {
	end := bytes.Clone(p)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] != 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}
