// Package baseline is the reference the benchmark harness measures the
// engine against: the idemkv.Store contract implemented the way a careful
// user would write it by hand on raw Pebble, with nothing clever in the
// commit path. It lives beside the engine because it writes the engine's
// record format (engine/internal/record), so that bytes per record and
// the cost of encoding compare like for like. It is not meant for
// production: use package engine.
//
// # Basics
//
// Every operation takes the mutex of the key's stripe (one of
// Options.Shards, picked by a hash of the record key), reads the record with
// DB.Get, decides, commits a one-key batch with pebble.Sync, and only then
// unlocks. So a request costs:
//
//   - Claim of an absent key: one synced batch (the in-progress record), in
//     both modes. Unlike the engine, a local claim is written to disk.
//   - Complete: one synced batch holding the completed record and the
//     caller's effects.
//   - Release, MarkUncertain, Resolve, Escalate, expiry to uncertain: one
//     synced batch.
//   - Renew of a remote claim: one synced batch (the record with its new
//     lease), as in the engine. A local claim's renewal is held in memory.
//   - Replays, mismatches, in-progress answers and Get: one DB.Get, no write.
//
// A unique local request therefore makes two synced writes and a remote one
// two as well, where the engine makes one and two. Holding the stripe mutex
// across the fsync is what makes the design simple and obviously correct —
// no reader can see a record before it is durable — and is also its cost:
// requests for unrelated keys that share a stripe wait for each other's
// fsyncs. Concurrent fsyncs on different stripes still share Pebble's group
// commit.
//
// It is opened with the Pebble options the engine derives from the same
// engine.Options (block cache, memtable size, bloom filters on every level,
// compression, compaction concurrency, format version), and stores the same
// key and value bytes as the engine, so that the comparison isolates the
// commit path. Open writes one synced batch, as the engine's does: the next
// epoch and, in a new store, the secret under which a new remote record's
// operation id is derived from the request (idemkv.DeriveOperationID, an
// HMAC computed before the stripe mutex is taken).
//
// # What survives a crash
//
// Everything acknowledged: every write that changes a record is synced
// before the call returns, and reads take the stripe mutex, so nothing not
// yet durable is ever answered from, a remote claim's renewal included: a
// reconciler waits for the lease as last renewed. The renewal of a local
// claim is the one exception, as in the engine: it is held in memory and a
// restart falls back to the lease the claim was written with (a local
// claim's effects commit only with its outcome, so a takeover is safe).
//
// # Caveats
//
//   - DB.Get, not a prefix iterator: Pebble's Get skips the bloom filters of
//     L6, where most records of a large store live, so claims of new keys in
//     a large store read a data block. That is what a straightforward
//     implementation does; the engine does better.
//   - It passes the same conformance suite as the engine (package storetest),
//     but it is a benchmark reference, not a product: it has no TTL sweep, and
//     renewals of local holders that vanish stay in memory until the key is
//     next written.
package baseline

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/ttl"
)

// DB is the baseline store. It implements idemkv.Store.
type DB struct {
	o     *engine.Options // with defaults applied
	db    *pebble.DB
	cache *pebble.Cache

	epoch uint64
	seq   atomic.Uint64
	// secret keys the operation ids of new remote records
	// (idemkv.DeriveOperationID); stored at the first Open, read at every
	// other.
	secret []byte

	stripes []stripe

	// gate: operations hold it shared, Close exclusively, so Close waits
	// for operations in flight.
	gate   sync.RWMutex
	closed bool // guarded by gate

	// failed holds the error of a synced write that failed: its outcome is
	// unknown, so the store refuses all further work (idemkv.ErrFailed).
	failed atomic.Pointer[error]

	// commits counts synced batches committed since Open.
	commits atomic.Int64
}

var _ idemkv.Store = (*DB)(nil)

// stripe is one of the per-key mutexes. Every read and write of a record
// key happens with its stripe's mutex held.
type stripe struct {
	mu sync.Mutex
	// renewed holds the in-memory lease renewals of local claims by
	// record key, valid only while the stored token is still the one
	// renewed.
	renewed map[string]renewal
}

type renewal struct {
	token   uint64
	expires time.Time
}

const tokenSeqBits = 40

// Open opens (creating if needed) a baseline store in dir. It reads the
// same engine.Options as engine.Open (nil means defaults): the filesystem,
// clock, randomness, lease, retention, body limit and every Pebble setting,
// and Shards as its number of stripes. ReadOnly is not supported.
func Open(dir string, opts *engine.Options) (*DB, error) {
	o := opts.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.ReadOnly {
		return nil, errors.New("baseline: read-only stores are not supported")
	}
	c := pebble.NewCache(o.CacheSize)
	po := o.PebbleOptions()
	po.Cache = c
	db, err := pebble.Open(dir, po)
	if err != nil {
		c.Unref()
		return nil, fmt.Errorf("baseline: open %s: %w", dir, err)
	}
	s := &DB{o: o, db: db, cache: c, stripes: make([]stripe, o.Shards)}
	for i := range s.stripes {
		s.stripes[i].renewed = map[string]renewal{}
	}
	if err := s.advanceEpoch(); err != nil {
		_ = db.Close()
		c.Unref()
		return nil, err
	}
	return s, nil
}

// advanceEpoch durably bumps the stored epoch, so that tokens keep growing
// across restarts (tokens are epoch<<40 | sequence, as in the engine), and
// reads the store's secret. A store without one (a new store) draws it
// from Options.Rand and writes it in the epoch's synced batch, as the
// engine does: it keys the operation ids of new remote records, so it is
// never drawn again.
func (s *DB) advanceEpoch() error {
	var epoch uint64
	v, err := s.getMeta(epochKey)
	switch {
	case err != nil:
		return fmt.Errorf("baseline: read epoch: %w", err)
	case v != nil && len(v) != 8:
		return fmt.Errorf("baseline: read epoch: %w: %d bytes", errCorrupt, len(v))
	case v != nil:
		epoch = binary.BigEndian.Uint64(v)
	}
	secret, err := s.getMeta(secretKey)
	switch {
	case err != nil:
		return fmt.Errorf("baseline: read the store's secret: %w", err)
	case secret != nil && len(secret) != secretLen:
		return fmt.Errorf("baseline: read the store's secret: %w: %d bytes", errCorrupt, len(secret))
	}
	epoch++
	b := s.db.NewBatch()
	defer b.Close()
	_ = b.Set(epochKey, binary.BigEndian.AppendUint64(nil, epoch), nil)
	if secret == nil {
		secret = make([]byte, secretLen)
		if _, err := io.ReadFull(s.o.Rand, secret); err != nil {
			return fmt.Errorf("baseline: draw the store's secret: %w", err)
		}
		_ = b.Set(secretKey, secret, nil)
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("baseline: write epoch: %w", err)
	}
	s.commits.Add(1)
	s.epoch, s.secret = epoch, secret
	return nil
}

// getMeta returns a copy of the value of key, or nil if it is absent.
func (s *DB) getMeta(key []byte) ([]byte, error) {
	v, closer, err := s.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	return bytes.Clone(v), nil
}

// Close waits for operations in flight and closes the store.
func (s *DB) Close() error {
	s.gate.Lock()
	defer s.gate.Unlock()
	if s.closed {
		return idemkv.ErrClosed
	}
	s.closed = true
	err := s.db.Close()
	s.cache.Unref()
	return err
}

// enter admits an operation; a nil error must be paired with s.gate.RUnlock.
func (s *DB) enter(ctx context.Context) error {
	if p := s.failed.Load(); p != nil {
		return fmt.Errorf("%w: %w", idemkv.ErrFailed, *p)
	}
	s.gate.RLock()
	if s.closed {
		s.gate.RUnlock()
		return idemkv.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		s.gate.RUnlock()
		return err
	}
	return nil
}

func (s *DB) stripe(k []byte) *stripe {
	return &s.stripes[xxhash.Sum64(k)%uint64(len(s.stripes))]
}

// get reads the record under k. REQUIRES: k's stripe mutex held.
func (s *DB) get(st *stripe, k []byte, now time.Time) (idemkv.Record, bool, error) {
	v, closer, err := s.db.Get(k)
	if errors.Is(err, pebble.ErrNotFound) {
		return idemkv.Record{}, false, nil
	}
	if err != nil {
		return idemkv.Record{}, false, fmt.Errorf("baseline: read record: %w", err)
	}
	rec, err := decode(v)
	closer.Close()
	if err != nil {
		return idemkv.Record{}, false, err
	}
	if rec.State == idemkv.StateCompleted && !now.Before(rec.Expires) {
		return idemkv.Record{}, false, nil // past retention: absent
	}
	if r, ok := st.renewed[string(k)]; ok && rec.State == idemkv.StateInProgress && r.token == rec.Token {
		rec.LeaseExpires = r.expires
	}
	return rec, true, nil
}

// commit commits b with a synced write. REQUIRES: k's stripe mutex held.
func (s *DB) commit(st *stripe, k []byte, b *pebble.Batch) error {
	delete(st.renewed, string(k))
	err := b.Commit(pebble.Sync)
	_ = b.Close()
	if err != nil {
		err = fmt.Errorf("baseline: commit: %w", err)
		s.failed.CompareAndSwap(nil, &err)
		return fmt.Errorf("%w: %w", idemkv.ErrFailed, err)
	}
	s.commits.Add(1)
	return nil
}

// put durably replaces k's record, prev (nil: none), with rec, or deletes
// it if rec is nil. REQUIRES: k's stripe mutex held.
func (s *DB) put(st *stripe, k []byte, prev, rec *idemkv.Record) error {
	b := s.db.NewBatch()
	putRecord(b, k, prev, rec)
	return s.commit(st, k, b)
}

func (s *DB) nextToken() uint64 { return s.epoch<<tokenSeqBits | s.seq.Add(1) }

// Claim implements idemkv.Store.
func (s *DB) Claim(ctx context.Context, req idemkv.ClaimRequest) (idemkv.Claim, error) {
	if err := req.Validate(); err != nil {
		return idemkv.Claim{}, err
	}
	if err := s.enter(ctx); err != nil {
		return idemkv.Claim{}, err
	}
	defer s.gate.RUnlock()
	leaseDur := req.Lease
	if leaseDur == 0 {
		leaseDur = s.o.Lease
	}
	// The downstream identity of the logical request, used if the claim
	// starts a new remote record: the same for every claim of it. A
	// takeover keeps the stored id.
	var opID idemkv.OperationID
	if req.Mode == idemkv.ModeRemote {
		opID = idemkv.DeriveOperationID(s.secret, req.ID, req.Fingerprint, req.Generation)
	}
	class := req.Retention
	if class == ttl.DefaultClass {
		class = ""
	}
	if _, err := s.o.RetentionClasses.Lookup(class); err != nil {
		return idemkv.Claim{}, fmt.Errorf("%w: %w", idemkv.ErrInvalidArgument, err)
	}
	k := recordKey(req.ID)
	st := s.stripe(k)
	st.mu.Lock()
	defer st.mu.Unlock()
	now := s.o.Clock.Now()
	cur, found, err := s.get(st, k, now)
	if err != nil {
		return idemkv.Claim{}, err
	}
	cur.ID = req.ID
	var prev *idemkv.Record
	if found {
		prev = &cur
	}
	acquire := func(next idemkv.Record) (idemkv.Claim, error) {
		next.ID, next.State = req.ID, idemkv.StateInProgress
		next.Token = s.nextToken()
		next.LeaseExpires = now.Add(leaseDur)
		if err := s.put(st, k, prev, &next); err != nil {
			return idemkv.Claim{}, err
		}
		return idemkv.Claim{Outcome: idemkv.Acquired, Lease: idemkv.Lease{
			ID: req.ID, Mode: next.Mode, Token: next.Token, Expires: next.LeaseExpires,
			Attempt: next.Attempt, OperationID: next.OperationID,
		}}, nil
	}
	switch {
	case !found:
		return acquire(idemkv.Record{Mode: req.Mode, Fingerprint: append([]byte(nil), req.Fingerprint...),
			Attempt: 1, OperationID: opID, Created: now, Expires: now.Add(s.window(class)), Class: class})
	case string(cur.Fingerprint) != string(req.Fingerprint):
		cur.Result = idemkv.Result{}
		return idemkv.Claim{Outcome: idemkv.Mismatch, Record: cur}, nil
	case cur.State == idemkv.StateCompleted:
		return idemkv.Claim{Outcome: idemkv.Replay, Record: cur}, nil
	case cur.State == idemkv.StateUncertain:
		return idemkv.Claim{Outcome: idemkv.Reconciling, Record: cur}, nil
	case now.Before(cur.LeaseExpires):
		return idemkv.Claim{Outcome: idemkv.InProgress, Record: cur, RetryAfter: cur.LeaseExpires.Sub(now)}, nil
	case cur.Mode == idemkv.ModeLocal:
		// An expired local lease: the stale holder's effects can commit only
		// with its outcome, under its token, which this takeover fences off.
		next := cur
		next.Mode, next.OperationID, next.Attempt = req.Mode, opID, cur.Attempt+1
		return acquire(next)
	case req.Mode == idemkv.ModeRemote && req.Resumable:
		next := cur
		next.Attempt++
		if next.OperationID.IsZero() {
			next.OperationID = opID
		}
		return acquire(next)
	}
	// An expired remote lease, and the caller cannot resume it: the
	// downstream outcome is unknown.
	unc := cur
	unc.State = idemkv.StateUncertain
	unc.Marked = marked(now) // its holder sends nothing past its lease
	unc.LeaseExpires = time.Time{}
	unc.Expires = now.Add(s.window(unc.Class))
	unc.Note = fmt.Sprintf("lease of attempt %d expired before its remote outcome was recorded", cur.Attempt)
	if err := s.put(st, k, &cur, &unc); err != nil {
		return idemkv.Claim{}, err
	}
	return idemkv.Claim{Outcome: idemkv.Reconciling, Record: unc}, nil
}

// hold runs fn with l's record if l is its current holder, else returns
// ErrFenced. fn runs with the stripe mutex held.
func (s *DB) hold(ctx context.Context, l idemkv.Lease, fn func(st *stripe, k []byte, cur idemkv.Record, now time.Time) error) error {
	if err := l.Validate(); err != nil {
		return err
	}
	if err := s.enter(ctx); err != nil {
		return err
	}
	defer s.gate.RUnlock()
	k := recordKey(l.ID)
	st := s.stripe(k)
	st.mu.Lock()
	defer st.mu.Unlock()
	now := s.o.Clock.Now()
	cur, found, err := s.get(st, k, now)
	if err != nil {
		return err
	}
	if !found || cur.State != idemkv.StateInProgress || cur.Token != l.Token {
		return fmt.Errorf("%w: token %d for key %q", idemkv.ErrFenced, l.Token, l.ID.Key)
	}
	cur.ID = l.ID
	return fn(st, k, cur, now)
}

// Complete implements idemkv.Store: the completed record and the effects
// go into one batch, committed with pebble.Sync.
func (s *DB) Complete(ctx context.Context, l idemkv.Lease, r idemkv.Result, apply func(idemkv.Effects) error) error {
	if err := s.validateResult(&r); err != nil {
		return err
	}
	return s.hold(ctx, l, func(st *stripe, k []byte, cur idemkv.Record, now time.Time) error {
		b := s.db.NewBatch()
		fx := &effects{b: b}
		if apply != nil {
			if err := apply(fx); err != nil {
				_ = b.Close()
				return err
			}
		}
		done := cur
		done.State = idemkv.StateCompleted
		done.LeaseExpires = time.Time{}
		done.Expires = now.Add(s.window(done.Class))
		done.Result = r
		done.Effects = fx.count()
		putRecord(b, k, &cur, &done)
		return s.commit(st, k, b)
	})
}

// Release implements idemkv.Store with a synced delete (local claims too:
// they were written), in the batch of the compensations.
func (s *DB) Release(ctx context.Context, l idemkv.Lease, apply func(idemkv.Effects) error) error {
	return s.hold(ctx, l, func(st *stripe, k []byte, cur idemkv.Record, _ time.Time) error {
		if apply == nil {
			return s.put(st, k, &cur, nil)
		}
		b := s.db.NewBatch()
		if err := apply(&effects{b: b}); err != nil {
			_ = b.Close()
			return err
		}
		putRecord(b, k, &cur, nil)
		return s.commit(st, k, b)
	})
}

// MarkUncertain implements idemkv.Store. The uncertain record keeps when
// it was marked (Record.Marked), which a reconciler's grace runs from.
func (s *DB) MarkUncertain(ctx context.Context, l idemkv.Lease, note string) error {
	if len(note) > idemkv.MaxNoteLen {
		return fmt.Errorf("%w: note is %d bytes, limit %d", idemkv.ErrInvalidArgument, len(note), idemkv.MaxNoteLen)
	}
	return s.hold(ctx, l, func(st *stripe, k []byte, cur idemkv.Record, now time.Time) error {
		unc := cur
		unc.State = idemkv.StateUncertain
		unc.Marked = marked(now)
		unc.LeaseExpires = time.Time{}
		unc.Expires = now.Add(s.window(unc.Class))
		unc.Note = note
		return s.put(st, k, &cur, &unc)
	})
}

// Renew implements idemkv.Store. A remote claim's renewal is a synced
// write of its record with the new lease, as in the engine, so that after
// a restart the record still says until when its holder could call
// downstream. A local claim's renewal is held in memory, as in the engine:
// after a restart the record has the lease it was claimed with.
func (s *DB) Renew(ctx context.Context, l idemkv.Lease, d time.Duration) (idemkv.Lease, error) {
	if d < 0 {
		return idemkv.Lease{}, fmt.Errorf("%w: negative lease %v", idemkv.ErrInvalidArgument, d)
	}
	if d == 0 {
		d = s.o.Lease
	}
	var out idemkv.Lease
	err := s.hold(ctx, l, func(st *stripe, k []byte, cur idemkv.Record, now time.Time) error {
		expires := now.Add(d)
		if cur.Mode == idemkv.ModeRemote {
			next := cur
			next.LeaseExpires = expires
			if err := s.put(st, k, &cur, &next); err != nil {
				return err
			}
		} else {
			st.renewed[string(k)] = renewal{token: cur.Token, expires: expires}
		}
		out = l
		out.Expires = expires
		return nil
	})
	return out, err
}

// Get implements idemkv.Store.
func (s *DB) Get(ctx context.Context, id idemkv.ID) (idemkv.Record, error) {
	if err := id.Validate(); err != nil {
		return idemkv.Record{}, err
	}
	if err := s.enter(ctx); err != nil {
		return idemkv.Record{}, err
	}
	defer s.gate.RUnlock()
	k := recordKey(id)
	st := s.stripe(k)
	st.mu.Lock()
	rec, found, err := s.get(st, k, s.o.Clock.Now())
	st.mu.Unlock()
	if err != nil {
		return idemkv.Record{}, err
	}
	if !found {
		return idemkv.Record{}, fmt.Errorf("%w: %q", idemkv.ErrNotFound, id.Key)
	}
	rec.ID = id
	return rec, nil
}

// Commits returns the number of synced batches committed since Open,
// including the epoch write at Open.
func (s *DB) Commits() int64 { return s.commits.Load() }

// Flush flushes the memtable to an sstable.
func (s *DB) Flush() error {
	if err := s.enter(context.Background()); err != nil {
		return err
	}
	defer s.gate.RUnlock()
	return s.db.Flush()
}

// Compact compacts the whole key space to the bottom level.
func (s *DB) Compact(ctx context.Context) error {
	if err := s.enter(ctx); err != nil {
		return err
	}
	defer s.gate.RUnlock()
	return s.db.Compact(ctx, []byte{0}, []byte{0xff}, true)
}

// Metrics returns Pebble's metrics for the store.
func (s *DB) Metrics() (*pebble.Metrics, error) {
	if err := s.enter(context.Background()); err != nil {
		return nil, err
	}
	defer s.gate.RUnlock()
	return s.db.Metrics(), nil
}

func (s *DB) validateResult(r *idemkv.Result) error { return r.Validate(s.o.MaxBodySize) }

// window is the retention window of class, the longest configured one if
// the class is no longer configured (as the engine does).
func (s *DB) window(class string) time.Duration {
	if w, err := s.o.RetentionClasses.Lookup(class); err == nil {
		return w
	}
	return s.o.RetentionClasses.Longest()
}
