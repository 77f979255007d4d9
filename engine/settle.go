package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine/internal/record"
)

// The writes that settle an attempt: the holder's Complete, Release,
// MarkUncertain and Renew (which writes only a remote claim's record),
// and a reconciler's Resolve. Each is a compare-and-set on the record's
// token. It runs in three steps: under the key's stripe mutex it checks
// the token and marks the key busy (so that nothing else changes the key
// meanwhile, and duplicates answer InProgress rather than read a write
// that is not yet durable); it commits with a synced write, no lock
// held; then it removes the busy slot under the mutex again
// (commitRecord), or, for a renewal, keeps it as the holder's (renew).
//
// Every stripe mutex is released by a defer, and every write that marked a
// slot busy is guarded by abandonOnPanic, so that a panic out of Pebble
// (building a batch, reading the store) leaves no mutex held and no slot
// busy with waiters asleep on it.

// Complete implements idemkv.Store. The outcome and the effects commit in
// one Pebble batch with a synced write, so after a crash either both are
// present or neither is. A duplicate claim made while the commit is in
// flight answers InProgress, never a replay of a result not yet durable.
func (e *Engine) Complete(ctx context.Context, l idemkv.Lease, r idemkv.Result, apply func(idemkv.Effects) error) (err error) {
	if err := l.Validate(); err != nil {
		return err
	}
	if err := e.validateResult(&r); err != nil {
		return err
	}
	if err := e.writable(); err != nil {
		return err
	}
	if err := e.gate.begin(ctx); err != nil {
		return err
	}
	defer e.gate.exit()
	return e.runConflicts(func() error { return e.complete(ctx, l, &r, apply) })
}

// runConflicts runs one attempt of a write whose apply function reads,
// and again while its reads conflict, up to maxConflictRuns times.
func (e *Engine) runConflicts(attempt func() error) error {
	for run := 1; ; run++ {
		err := attempt()
		if !errors.Is(err, errConflict) {
			return err
		}
		e.counters.conflicts.Add(1)
		if run == maxConflictRuns {
			return fmt.Errorf("%w: the data it read changed %d times in a row", idemkv.ErrConflict, run)
		}
	}
}

// complete is one attempt of Complete.
func (e *Engine) complete(ctx context.Context, l idemkv.Lease, r *idemkv.Result, apply func(idemkv.Effects) error) (err error) {
	fx := e.newEffects()
	defer fx.close()
	if apply != nil {
		if err := apply(fx); err != nil {
			return fx.failed(err)
		}
	}
	now := e.clock.Now()
	h, err := e.hold(ctx, l)
	if err != nil {
		return err
	}
	defer e.abandonOnPanic(h.s, &err)
	done := h.rec
	done.State = idemkv.StateCompleted
	done.LeaseExpires = time.Time{}
	done.Expires = e.expiresAt(now, done.Class)
	if fx.result != nil {
		r = fx.result
	}
	done.Result = idemkv.Result{Status: r.Status, Pointer: r.Pointer, Body: r.Body}
	b := e.db.NewBatch()
	done.Effects = fx.writeTo(b, done.Token, done.Expires)
	if err := e.commitRecordTxn(h.st, h.k, h.s, h.prev(), &done, b, fx.txn(done.Token, now)); err != nil {
		return err
	}
	e.counters.completed.Add(1)
	return nil
}

// Release implements idemkv.Store. A local claim was never written, so
// releasing it without compensations writes nothing; a remote claim's
// record is deleted with a synced write, so a released claim does not come
// back after a crash. Compensations (apply) commit in the batch that
// deletes the record, or, for a local claim, in a batch of their own
// written while the key is busy under the holder's token.
func (e *Engine) Release(ctx context.Context, l idemkv.Lease, apply func(idemkv.Effects) error) error {
	if err := l.Validate(); err != nil {
		return err
	}
	if err := e.writable(); err != nil {
		return err
	}
	if err := e.gate.begin(ctx); err != nil {
		return err
	}
	defer e.gate.exit()
	if apply != nil {
		return e.runConflicts(func() error { return e.releaseWith(ctx, l, apply) })
	}
	k := appendRecordKey(nil, l.ID)
	st := e.table.stripe(k)
	s, stored, err := e.release(ctx, st, k, l)
	if err != nil {
		return err
	}
	e.counters.released.Add(1)
	if !stored {
		return nil
	}
	prev := s.rec // s is busy: nothing else changes it
	return e.commitRecord(st, k, s, &prev, nil, nil)
}

// releaseWith is one attempt of a Release with compensations: the
// holder's key is marked busy, so the token check and the writes are one
// compare-and-set, and the compensations are stamped as ending now (as a
// resolution with no effect stamps its writes): no outcome pairs with
// them.
func (e *Engine) releaseWith(ctx context.Context, l idemkv.Lease, apply func(idemkv.Effects) error) (err error) {
	fx := e.newEffects()
	defer fx.close()
	fx.noResult = true
	if err := apply(fx); err != nil {
		return fx.failed(err)
	}
	now := e.clock.Now()
	h, err := e.hold(ctx, l)
	if err != nil {
		return err
	}
	defer e.abandonOnPanic(h.s, &err)
	b := e.db.NewBatch()
	fx.writeTo(b, h.rec.Token, time.Unix(now.Unix(), 0))
	if err := e.commitRecordTxn(h.st, h.k, h.s, h.prev(), nil, b, fx.txn(h.rec.Token, now)); err != nil {
		return err
	}
	e.counters.released.Add(1)
	return nil
}

// release checks that l holds k and, for a local claim, drops its slot: it
// reports whether a record is stored, which the caller must then delete
// (k's slot is busy for it).
func (e *Engine) release(ctx context.Context, st *stripe, k []byte, l idemkv.Lease) (*slot, bool, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	s, err := e.holdLocked(ctx, st, k, l)
	if err != nil {
		return nil, false, err
	}
	if !s.durable {
		st.dropLocked(k, s) // a local claim: nothing was written
		return s, false, nil
	}
	return s, true, nil
}

// MarkUncertain implements idemkv.Store. The uncertain record is written
// with a synced write, keeping the token, attempt and operation id, so a
// reconciler can settle it with Resolve, and the time it was marked
// (Record.Marked, to the millisecond), which a reconciler's grace runs
// from.
func (e *Engine) MarkUncertain(ctx context.Context, l idemkv.Lease, note string) error {
	if err := l.Validate(); err != nil {
		return err
	}
	if len(note) > idemkv.MaxNoteLen {
		return fmt.Errorf("%w: note is %d bytes, limit %d", idemkv.ErrInvalidArgument, len(note), idemkv.MaxNoteLen)
	}
	if err := e.writable(); err != nil {
		return err
	}
	if err := e.gate.begin(ctx); err != nil {
		return err
	}
	defer e.gate.exit()
	now := e.clock.Now()
	h, err := e.hold(ctx, l)
	if err != nil {
		return err
	}
	unc := h.rec
	unc.State = idemkv.StateUncertain
	unc.Marked = record.Milliseconds(now)
	unc.LeaseExpires = time.Time{}
	unc.Expires = e.expiresAt(now, unc.Class)
	unc.Note = note
	e.counters.uncertain.Add(1)
	return e.commitRecord(h.st, h.k, h.s, h.prev(), &unc, nil)
}

// Renew implements idemkv.Store. A remote claim's renewal is written
// with a synced write, as the claim was, so that after a crash the stored
// lease is still the last moment its holder could have called downstream,
// which a reconciler waits for. A local claim's renewal is held in
// memory: after a crash its holder is gone, and so is the claim.
func (e *Engine) Renew(ctx context.Context, l idemkv.Lease, d time.Duration) (idemkv.Lease, error) {
	if err := l.Validate(); err != nil {
		return idemkv.Lease{}, err
	}
	if d < 0 {
		return idemkv.Lease{}, fmt.Errorf("%w: negative lease %v", idemkv.ErrInvalidArgument, d)
	}
	if d == 0 {
		d = e.opts.Lease
	}
	if err := e.writable(); err != nil {
		return idemkv.Lease{}, err
	}
	if err := e.gate.begin(ctx); err != nil {
		return idemkv.Lease{}, err
	}
	defer e.gate.exit()
	now := e.clock.Now()
	h, err := e.hold(ctx, l)
	if err != nil {
		return idemkv.Lease{}, err
	}
	next := h.rec
	next.LeaseExpires = now.Add(d)
	if err := e.renew(&h, &next); err != nil {
		return idemkv.Lease{}, err
	}
	e.counters.renewed.Add(1)
	return leaseOf(&next), nil
}

// renew ends the holder's write on h.s that renews its lease to next's:
// for a stored record, with a synced write of next in place of h.rec.
// The slot stays the holder's, with the new lease.
func (e *Engine) renew(h *held, next *idemkv.Record) (err error) {
	defer e.abandonOnPanic(h.s, &err)
	if h.stored {
		if e.testHookWrite != nil {
			e.testHookWrite()
		}
		b := e.db.NewBatch()
		e.putRecord(b, h.k, &h.rec, next)
		err = e.commits.commit(b)
		_ = b.Close()
		if err != nil {
			err = e.fail(fmt.Errorf("engine: durable renewal: %w", err))
			h.s.abandonWrite()
			return err
		}
	}
	h.st.mu.Lock()
	defer h.st.mu.Unlock()
	h.s.rec.LeaseExpires = next.LeaseExpires
	h.s.clearBusy()
	return nil
}

// Resolve implements idemkv.Store. An abandoned record (a remote record
// in progress past its lease, as renewed) is settled like an uncertain
// one: its holder, if it is still running, is fenced off, as it would be
// by a takeover.
func (e *Engine) Resolve(ctx context.Context, req idemkv.ResolveRequest) (err error) {
	if !req.NoEffect {
		if err := e.validateResult(&req.Result); err != nil {
			return err
		}
	}
	if err := e.validateSettle(req.ID, req.Note); err != nil {
		return err
	}
	if err := e.gate.begin(ctx); err != nil {
		return err
	}
	defer e.gate.exit()
	return e.runConflicts(func() error { return e.resolve(ctx, &req) })
}

// resolve is one attempt of Resolve.
func (e *Engine) resolve(ctx context.Context, req *idemkv.ResolveRequest) (err error) {
	fx := e.newEffects()
	defer fx.close()
	if req.Apply != nil {
		if err := req.Apply(fx); err != nil {
			return fx.failed(err)
		}
	}
	w, err := e.beginSettle(ctx, req.ID, req.Token, req.Since)
	if err != nil {
		return err
	}
	cur, now := w.cur, w.now
	defer e.abandonOnPanic(w.s, &err)
	b := e.db.NewBatch()
	if req.NoEffect {
		// The record goes; effects committed with its removal are stamped
		// as ending now, rounded down so that the stamp is already past
		// (AppendStamp rounds up).
		fx.writeTo(b, cur.Token, time.Unix(now.Unix(), 0))
		err = e.commitRecordTxn(w.st, w.k, w.s, &cur, nil, b, fx.txn(cur.Token, now))
	} else {
		done := cur
		done.State = idemkv.StateCompleted
		done.Escalated = false
		done.Marked = time.Time{}
		done.LeaseExpires = time.Time{}
		done.Note = req.Note
		done.Expires = e.expiresAt(now, done.Class)
		r := &req.Result
		if fx.result != nil {
			r = fx.result
		}
		done.Result = idemkv.Result{Status: r.Status, Pointer: r.Pointer, Body: r.Body}
		done.Effects = fx.writeTo(b, done.Token, done.Expires)
		err = e.commitRecordTxn(w.st, w.k, w.s, &cur, &done, b, fx.txn(done.Token, now))
	}
	if err == nil {
		e.counters.resolved.Add(1)
	}
	return err
}

// Escalate implements idemkv.Store. An uncertain record keeps the time
// it was marked; an abandoned one is marked uncertain now.
func (e *Engine) Escalate(ctx context.Context, req idemkv.EscalateRequest) (err error) {
	if err := e.validateSettle(req.ID, req.Note); err != nil {
		return err
	}
	if err := e.gate.begin(ctx); err != nil {
		return err
	}
	defer e.gate.exit()
	w, err := e.beginSettle(ctx, req.ID, req.Token, req.Since)
	if err != nil {
		return err
	}
	cur, now := w.cur, w.now
	defer e.abandonOnPanic(w.s, &err)
	e.counters.escalated.Add(1)
	esc := cur
	esc.State = idemkv.StateUncertain
	esc.Escalated = true
	esc.LeaseExpires = time.Time{}
	esc.Note = req.Note
	if cur.State != idemkv.StateUncertain {
		esc.Expires = e.expiresAt(now, esc.Class)
		esc.Marked = record.Milliseconds(now)
	}
	return e.commitRecord(w.st, w.k, w.s, &cur, &esc, nil)
}

// validateSettle checks the arguments every settling write shares, and
// that the store may be written.
func (e *Engine) validateSettle(id idemkv.ID, note string) error {
	if err := id.Validate(); err != nil {
		return err
	}
	if len(note) > idemkv.MaxNoteLen {
		return fmt.Errorf("%w: note is %d bytes, limit %d", idemkv.ErrInvalidArgument, len(note), idemkv.MaxNoteLen)
	}
	return e.writable()
}

// settlingWrite is a record marked busy for a settling write: where it
// is, its slot, the record it replaces and the time it was found so.
type settlingWrite struct {
	st  *stripe
	k   []byte
	s   *slot
	cur idemkv.Record
	now time.Time
}

// beginSettle finds id's record settleable under token and marks it busy
// (settleableLocked); the caller must end the write with commitRecord.
func (e *Engine) beginSettle(ctx context.Context, id idemkv.ID, token uint64, since time.Time) (settlingWrite, error) {
	w := settlingWrite{k: appendRecordKey(nil, id), now: e.clock.Now()}
	w.st = e.table.stripe(w.k)
	var err error
	w.cur, w.s, err = e.settleable(ctx, w.st, w.k, id, token, since, w.now)
	return w, err
}

// held is a holder's key marked busy for its write: where it is, its slot,
// a copy of its record, and whether that record is stored.
type held struct {
	st     *stripe
	k      []byte
	s      *slot
	rec    idemkv.Record
	stored bool
}

// prev is the record stored under h.k, or nil.
func (h *held) prev() *idemkv.Record {
	if !h.stored {
		return nil
	}
	return &h.rec
}

// hold is holdLocked for l's key, under its stripe mutex.
func (e *Engine) hold(ctx context.Context, l idemkv.Lease) (held, error) {
	h := held{k: appendRecordKey(nil, l.ID)}
	h.st = e.table.stripe(h.k)
	h.st.mu.Lock()
	defer h.st.mu.Unlock()
	s, err := e.holdLocked(ctx, h.st, h.k, l)
	if err != nil {
		return held{}, err
	}
	h.s, h.rec, h.stored = s, s.rec, s.durable
	return h, nil
}

// holdLocked checks that l is the current holder of k, and marks its slot
// busy so that nothing else changes k until the caller's write is done. A
// remote holder whose slot was reaped is found through its durable record.
// If another write to k is in flight (a takeover turning the record
// uncertain, say), it waits for that write and decides on its outcome, so
// that a holder is never told it is fenced before the change that fences
// it has happened.
//
// REQUIRES: st.mu held (released and reacquired while waiting).
func (e *Engine) holdLocked(ctx context.Context, st *stripe, k []byte, l idemkv.Lease) (*slot, error) {
	s := st.slotLocked(k)
	for s != nil && s.busy {
		if err := e.waitLocked(ctx, st, s); err != nil {
			return nil, err
		}
		s = st.slotLocked(k)
	}
	if s == nil {
		rec, found, err := e.readLocked(k, e.clock.Now())
		if err != nil {
			return nil, err
		}
		if !found || rec.State != idemkv.StateInProgress || rec.Token != l.Token {
			return nil, e.fenced(l)
		}
		rec.ID = l.ID
		return e.table.beginWriteLocked(st, k, nil, rec), nil
	}
	if s.rec.Token != l.Token || s.rec.State != idemkv.StateInProgress {
		return nil, e.fenced(l)
	}
	s.markBusy()
	return s, nil
}

// settleable is settleableLocked under k's stripe mutex.
func (e *Engine) settleable(ctx context.Context, st *stripe, k []byte, id idemkv.ID, token uint64, since, now time.Time) (idemkv.Record, *slot, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	return e.settleableLocked(ctx, st, k, id, token, since, now)
}

// settleableLocked checks that k's record can be settled under token (it
// is uncertain, or abandoned at now, and stored, and, if since is set,
// has not moved since: ResolveRequest.Since), and returns it with k
// marked busy for the settling write. It waits out a write in flight
// (another resolution, say) and decides on the record that write leaves.
//
// REQUIRES: st.mu held (released and reacquired while waiting).
func (e *Engine) settleableLocked(ctx context.Context, st *stripe, k []byte, id idemkv.ID, token uint64, since, now time.Time) (idemkv.Record, *slot, error) {
	s := st.slotLocked(k)
	for s != nil && s.busy {
		if err := e.waitLocked(ctx, st, s); err != nil {
			return idemkv.Record{}, nil, err
		}
		s = st.slotLocked(k)
	}
	var (
		cur   idemkv.Record
		found bool
		err   error
	)
	if s != nil {
		cur, found = s.rec, true // a holder's, in memory, with its lease as renewed
		cur.Fingerprint = bytes.Clone(cur.Fingerprint)
	} else {
		cur, found, err = e.readLocked(k, now)
		if found && cur.State == idemkv.StateCompleted && !now.Before(cur.Expires) {
			found = false // past retention: absent to every read
		}
	}
	switch {
	case err != nil:
	case !found:
		err = fmt.Errorf("%w: key_hash %s", idemkv.ErrNotFound, id.Hash())
	case cur.State == idemkv.StateCompleted:
		err = fmt.Errorf("%w: key_hash %s is completed", idemkv.ErrWrongState, id.Hash())
	case cur.State == idemkv.StateInProgress && !abandoned(&cur, now),
		s != nil && !s.durable:
		err = fmt.Errorf("%w: key_hash %s is in progress under a live lease", idemkv.ErrWrongState, id.Hash())
	case cur.Token != token:
		e.counters.fenced.Add(1)
		err = fmt.Errorf("%w: token %d, record has %d", idemkv.ErrFenced, token, cur.Token)
	case !since.IsZero() && cur.MovedSince(since):
		e.counters.fenced.Add(1)
		err = fmt.Errorf("%w: key_hash %s: its holder renewed it or marked it after %v", idemkv.ErrFenced, id.Hash(), since)
	}
	if err != nil {
		return idemkv.Record{}, nil, err
	}
	cur.ID = id
	return cur, e.table.beginWriteLocked(st, k, s, cur), nil
}

// commitRecord durably replaces k's record with next (nil: deletes it)
// together with the writes already in b (nil: none), then ends the write
// on k's busy slot s. prev is k's current record if it is stored under
// its record key, else nil. On failure the engine is poisoned and s stays
// busy: nothing may answer for k any more.
func (e *Engine) commitRecord(st *stripe, k []byte, s *slot, prev, next *idemkv.Record, b *pebble.Batch) (err error) {
	return e.commitRecordTxn(st, k, s, prev, next, b, nil)
}

// commitRecordTxn is commitRecord for a batch with reads to check and
// events to number (t, if not nil). If t's reads have changed, nothing is
// written, the write on s is aborted (abortWriteLocked), and it returns
// errConflict.
func (e *Engine) commitRecordTxn(st *stripe, k []byte, s *slot, prev, next *idemkv.Record, b *pebble.Batch, t *txn) (err error) {
	defer e.abandonOnPanic(s, &err)
	if e.testHookWrite != nil {
		e.testHookWrite()
	}
	if b == nil {
		b = e.db.NewBatch()
	}
	e.putRecord(b, k, prev, next)
	err = e.commits.commitTxn(b, t)
	_ = b.Close()
	if errors.Is(err, errConflict) {
		e.pending.move(next, prev) // as putRecord counted it, undone
		st.mu.Lock()
		defer st.mu.Unlock()
		e.table.abortWriteLocked(st, k, s)
		return err
	}
	if err != nil {
		err = e.fail(fmt.Errorf("engine: commit: %w", err))
		s.abandonWrite()
		return err
	}
	now := e.clock.Now()
	st.mu.Lock()
	defer st.mu.Unlock()
	e.table.endWriteLocked(st, k, s, next, now)
	return nil
}

// abandonOnPanic, deferred once k's slot s is busy for a write, turns a
// panic before the write ended into ErrFailed, as a failed commit is: the
// write's fate is unknown, so the engine fails, s stays busy, and its
// waiters wake to the failure instead of sleeping forever.
func (e *Engine) abandonOnPanic(s *slot, err *error) {
	r := recover()
	if r == nil {
		return
	}
	*err = e.fail(fmt.Errorf("engine: write panicked: %v", r))
	select {
	case <-s.done: // already abandoned by a guard further in
	default:
		s.abandonWrite()
	}
}

func (e *Engine) fenced(l idemkv.Lease) error {
	e.counters.fenced.Add(1)
	return fmt.Errorf("%w: token %d for key_hash %s", idemkv.ErrFenced, l.Token, l.ID.Hash())
}

func (e *Engine) validateResult(r *idemkv.Result) error { return r.Validate(e.opts.MaxBodySize) }
