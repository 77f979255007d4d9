package engine

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/record"
)

// ErrExists is returned by Load for a record whose ID is already live in
// the store, or given twice.
var ErrExists = errors.New("idemkv: record already stored")

// loadBatchBytes is the size at which Load commits a batch: large enough
// that the commits cost little, well below half a memtable (Pebble treats
// larger batches specially).
const loadBatchBytes = 1 << 20

// Load writes recs into the store in dir, creating it if needed, exactly
// as the engine writes records: an unsettled record under its record key,
// a completed one in the expiry bucket of its class. It is the one way to
// seed a store in bulk (benchmarks, tests, imports); the store it leaves
// passes Check, and Open reads it like any other. No process may hold the
// store: Load opens it itself (Pebble's lock refuses a second opener).
//
// Each record is stored as given, except that it gets a fresh fencing
// token, later than every token the store has handed out, and defaults for
// the zero fields a claim would have set: Attempt 1, Created now, a lease
// from now for an in-progress record, the operation id a claim would
// derive for a remote one (generation 0), and Expires at the end of its
// class's window from now. The ID,
// fingerprint, state, class and result must be ones the engine accepts; a
// record in progress must be remote (a local claim is never stored), and
// none may claim effects (Record.Effects): Load writes no business data.
//
// An ID already live in the store, or given twice, fails with ErrExists.
// Records are committed in batches without syncs, and made durable by a
// flush at the end, so Load is far faster than claiming and completing
// each record; if it fails, records of the batches committed before the
// failure stay, and the store is still sound. It returns how many records
// it stored.
func Load(ctx context.Context, dir string, opts *Options, recs iter.Seq[idemkv.Record]) (int, error) {
	o := *opts.EnsureDefaults()
	o.NoBackgroundSweep, o.ClaimFilterBitsPerKey, o.ReplayCacheSize, o.ReadOnly = true, -1, -1, false
	e, err := Open(dir, &o)
	if err != nil {
		return 0, err
	}
	l := loader{e: e, now: e.clock.Now(), seen: make(map[string]bool)}
	n, err := l.load(ctx, recs)
	if err == nil {
		err = e.Flush()
	}
	if cerr := e.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return n, fmt.Errorf("engine: load: %w", err)
	}
	return n, nil
}

// loader is the state of one Load: the engine it opened for itself (no
// other caller sees it, so no slot guards its writes), the batch being
// filled, and the keys in it.
type loader struct {
	e   *Engine
	now time.Time
	b   *pebble.Batch
	// it reads the store as of the last commit; seen holds the record keys
	// of the batch not yet committed.
	it   *pebble.Iterator
	seen map[string]bool
	n    int
}

func (l *loader) load(ctx context.Context, recs iter.Seq[idemkv.Record]) (int, error) {
	defer func() {
		if l.b != nil {
			_ = l.b.Close()
		}
		if l.it != nil {
			_ = l.it.Close()
		}
	}()
	if err := l.next(); err != nil {
		return 0, err
	}
	for rec := range recs {
		if err := l.add(&rec); err != nil {
			return l.n, err
		}
		if l.b.Len() >= loadBatchBytes {
			if err := l.commit(ctx); err != nil {
				return l.n, err
			}
		}
	}
	return l.n, l.commit(ctx)
}

// add puts rec, completed with its defaults, into the batch.
func (l *loader) add(rec *idemkv.Record) error {
	e := l.e
	if err := l.fill(rec); err != nil {
		return err
	}
	k := appendRecordKey(nil, rec.ID)
	if l.seen[string(k)] {
		return fmt.Errorf("%w: %s/%s/%q given twice", ErrExists, rec.ID.Tenant, rec.ID.Endpoint, rec.ID.Key)
	}
	if _, found, err := e.readWith(l.it, k, l.now); err != nil {
		return err
	} else if found {
		return fmt.Errorf("%w: %s/%s/%q", ErrExists, rec.ID.Tenant, rec.ID.Endpoint, rec.ID.Key)
	}
	l.seen[string(k)] = true
	e.putRecord(l.b, k, nil, rec)
	l.n++
	return nil
}

// fill checks rec and sets its token and the defaults of its zero fields.
func (l *loader) fill(rec *idemkv.Record) error {
	e := l.e
	req := idemkv.ClaimRequest{ID: rec.ID, Fingerprint: rec.Fingerprint, Mode: rec.Mode, Retention: rec.Class}
	if err := req.Validate(); err != nil {
		return err
	}
	class, err := e.claimClass(rec.Class)
	if err != nil {
		return err
	}
	switch {
	case rec.State < idemkv.StateInProgress || rec.State > idemkv.StateCompleted:
		return fmt.Errorf("%w: record state %d", idemkv.ErrInvalidArgument, rec.State)
	case rec.State == idemkv.StateInProgress && rec.Mode != idemkv.ModeRemote:
		return fmt.Errorf("%w: a local claim in progress is never stored", idemkv.ErrInvalidArgument)
	case rec.Effects != 0:
		return fmt.Errorf("%w: Load writes no effects, and the record counts %d", idemkv.ErrInvalidArgument, rec.Effects)
	case len(rec.Note) > idemkv.MaxNoteLen:
		return fmt.Errorf("%w: note is %d bytes, limit %d", idemkv.ErrInvalidArgument, len(rec.Note), idemkv.MaxNoteLen)
	}
	if err := e.validateResult(&rec.Result); err != nil {
		return err
	}
	rec.Class = class
	if rec.Token, err = e.nextToken(); err != nil {
		return err
	}
	if rec.Attempt == 0 {
		rec.Attempt = 1
	}
	if rec.Created.IsZero() {
		rec.Created = l.now.Truncate(time.Second)
	}
	if rec.Mode == idemkv.ModeRemote && rec.OperationID.IsZero() {
		rec.OperationID = idemkv.DeriveOperationID(e.secret, rec.ID, rec.Fingerprint, 0)
	}
	if rec.State == idemkv.StateInProgress && rec.LeaseExpires.IsZero() {
		rec.LeaseExpires = l.now.Add(e.opts.Lease)
	}
	if rec.State != idemkv.StateInProgress {
		rec.LeaseExpires = time.Time{}
	}
	if rec.Expires.IsZero() {
		rec.Expires = e.expiresAt(l.now, class)
	}
	rec.Expires = record.Seconds(rec.Expires)
	if rec.Created.After(rec.Expires) || rec.Created.Unix() < 0 {
		// The codec keeps creation as seconds before expiry: a record
		// created after it expires would be read back with another
		// creation, and its pending-index entry with it.
		return fmt.Errorf("%w: created %v, after its expiry %v or before 1970", idemkv.ErrInvalidArgument, rec.Created, rec.Expires)
	}
	rec.Created = rec.Created.Truncate(time.Second)
	return nil
}

// commit commits the batch, unsynced, and starts the next.
func (l *loader) commit(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := commitBatch(l.b, pebble.NoSync); err != nil {
		return l.e.fail(err)
	}
	return l.next()
}

// next starts a new batch, and a new iterator that sees what is committed.
func (l *loader) next() error {
	if l.b != nil {
		_ = l.b.Close()
	}
	if l.it != nil {
		if err := l.it.Close(); err != nil {
			return err
		}
	}
	l.b = l.e.db.NewBatch()
	clear(l.seen)
	var err error
	l.it, err = l.e.db.NewIter(&pebble.IterOptions{UseL6Filters: true})
	return err
}
