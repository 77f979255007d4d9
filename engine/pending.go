package engine

import (
	"bytes"
	"cmp"
	"context"
	"encoding/hex"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine/internal/record"
)

// The pending index (record.NSPending) lists the records that may need
// settling: every stored remote record in progress and every uncertain
// one, in one section, and escalated records in another, each ordered by
// creation. Its entries are written in the same batch as the records
// they stand for (putPending), so List, the reconciler and Stats find
// what needs settling without scanning the records. An entry's value is
// the record's state in one byte, so that Open counts the index by kind
// without reading the records.

var (
	pendingStart = []byte{record.NSPending}
	pendingEnd   = []byte{record.NSPending + 1}
)

// pendingCounts counts the index's entries by kind. They change with the
// batches that change the index, before those commit: a commit refused
// for a conflict moves them back (commitRecordTxn), and a failed commit
// fails the engine, after which no count matters.
type pendingCounts struct {
	remote, uncertain, escalated atomic.Int64
}

// move counts a record replaced: prev (nil: none) by next (nil: none).
func (c *pendingCounts) move(prev, next *idemkv.Record) {
	if n := c.of(prev); n != nil {
		n.Add(-1)
	}
	if n := c.of(next); n != nil {
		n.Add(1)
	}
}

func (c *pendingCounts) of(r *idemkv.Record) *atomic.Int64 {
	if r == nil {
		return nil
	}
	switch section, ok := record.PendingSection(r); {
	case !ok:
		return nil
	case section == record.PendingEscalated:
		return &c.escalated
	case r.State == idemkv.StateUncertain:
		return &c.uncertain
	}
	return &c.remote
}

// putPending adds to b the index writes that go with replacing k's stored
// record prev (nil: none stored) with next (nil: deleted).
// batchWriter is what putRecord and putPending write to: a Pebble batch,
// or the run of records Load is building (load.go).
type batchWriter interface {
	Set(key, value []byte, opts *pebble.WriteOptions) error
	Delete(key []byte, opts *pebble.WriteOptions) error
}

func (e *Engine) putPending(b batchWriter, k []byte, prev, next *idemkv.Record) {
	del, set, value := record.PendingUpdate(k, prev, next)
	if del != nil {
		_ = b.Delete(del, nil)
	}
	if set != nil {
		_ = b.Set(set, value, nil)
	}
	e.pending.move(prev, next)
}

// countPending counts the pending index by kind, at Open.
func (e *Engine) countPending() error {
	it, err := e.db.NewIter(&pebble.IterOptions{LowerBound: pendingStart, UpperBound: pendingEnd})
	if err != nil {
		return err
	}
	defer it.Close()
	for valid := it.First(); valid; valid = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			return err
		}
		if len(v) != 1 || len(it.Key()) < 2 {
			return fmt.Errorf("engine: pending index entry %x: %w", it.Key(), record.ErrCorrupt)
		}
		switch {
		case it.Key()[1] == record.PendingEscalated:
			e.pending.escalated.Add(1)
		case idemkv.State(v[0]) == idemkv.StateUncertain:
			e.pending.uncertain.Add(1)
		default:
			e.pending.remote.Add(1)
		}
	}
	return it.Error()
}

// indexLayout3 adds to b the pending index of a store in layout 3, which
// had none: an entry for each unsettled record (the record namespace
// holds only those). Open commits it with the new layout marker, so a
// crash leaves the store in one layout or the other.
func (e *Engine) indexLayout3(b *pebble.Batch) (int, error) {
	it, err := e.db.NewIter(&pebble.IterOptions{LowerBound: recordStart, UpperBound: recordEnd})
	if err != nil {
		return 0, err
	}
	defer it.Close()
	n := 0
	for valid := it.First(); valid; valid = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			return n, err
		}
		rec, err := record.Decode(v)
		if err != nil {
			return n, fmt.Errorf("record %x: %w", it.Key(), err)
		}
		if k := record.AppendPendingKey(nil, &rec, it.Key()); len(k) > 0 {
			_ = b.Set(k, []byte{byte(rec.State)}, nil)
			n++
		}
	}
	return n, it.Error()
}

// abandoned reports whether rec is a remote record in progress whose lease
// has run out at now: its holder is presumed gone.
func abandoned(rec *idemkv.Record, now time.Time) bool {
	return rec.State == idemkv.StateInProgress && rec.Mode == idemkv.ModeRemote && !now.Before(rec.LeaseExpires)
}

// awaiting reports whether rec awaits reconciliation at now.
func awaiting(rec *idemkv.Record, now time.Time) bool {
	return rec.State == idemkv.StateUncertain && !rec.Escalated || abandoned(rec, now)
}

// Limits of a List page.
const (
	defaultListLimit = 100
	maxListLimit     = 1000
)

// List implements idemkv.Store. It reads the pending index in order and
// each entry's current record (a holder's in memory, else the stored
// one), skipping records a write is settling now and remote records
// whose lease, as renewed, is live. A tenant filter reads the whole
// section: the index is not ordered by tenant, and holds only unsettled
// records.
func (e *Engine) List(ctx context.Context, req idemkv.ListRequest) (idemkv.ListPage, error) {
	section := record.PendingOpen
	if req.Escalated {
		section = record.PendingEscalated
	}
	prefix := record.AppendPendingPrefix(nil, section)
	lower, limit, err := listBounds(&req, prefix)
	if err != nil {
		return idemkv.ListPage{}, err
	}
	if err := e.gate.begin(ctx); err != nil {
		return idemkv.ListPage{}, err
	}
	defer e.gate.exit()
	it, err := e.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: prefixEnd(prefix)})
	if err != nil {
		return idemkv.ListPage{}, fmt.Errorf("engine: list: %w", err)
	}
	defer it.Close()
	var (
		page idemkv.ListPage
		last []byte
	)
	now := e.clock.Now()
	for valid := it.First(); valid; valid = it.Next() {
		if err := ctx.Err(); err != nil {
			return idemkv.ListPage{}, err
		}
		if len(page.Records) == limit {
			page.Next = hex.EncodeToString(last)
			break
		}
		last = append(last[:0], it.Key()...)
		rec, ok, err := e.listed(last, &req, now)
		if err != nil {
			return idemkv.ListPage{}, err
		}
		if ok {
			page.Records = append(page.Records, rec)
		}
	}
	if err := it.Error(); err != nil {
		return idemkv.ListPage{}, fmt.Errorf("engine: list: %w", err)
	}
	return page, nil
}

// listBounds checks req and returns the lower bound of the page's scan of
// the section under prefix, and the page's size.
func listBounds(req *idemkv.ListRequest, prefix []byte) (lower []byte, limit int, err error) {
	if err := req.Validate(); err != nil {
		return nil, 0, err
	}
	limit = min(cmp.Or(req.Limit, defaultListLimit), maxListLimit)
	if req.After == "" {
		return prefix, limit, nil
	}
	after, err := hex.DecodeString(req.After)
	if err != nil || !bytes.HasPrefix(after, prefix) || len(after) <= record.PendingPrefixLen {
		return nil, 0, fmt.Errorf("%w: malformed cursor %q", idemkv.ErrInvalidArgument, req.After)
	}
	return append(after, 0), limit, nil // the first key after it
}

// listed returns the record the pending-index entry pk stands for, if
// the listing req wants it at now.
func (e *Engine) listed(pk []byte, req *idemkv.ListRequest, now time.Time) (idemkv.Record, bool, error) {
	_, _, k, err := record.SplitPendingKey(pk)
	if err != nil {
		return idemkv.Record{}, false, fmt.Errorf("engine: list: pending key %x: %w", pk, err)
	}
	id, err := decodeRecordKey(k)
	if err != nil {
		return idemkv.Record{}, false, fmt.Errorf("engine: list: pending key %x: %w", pk, err)
	}
	if req.Tenant != "" && id.Tenant != req.Tenant {
		return idemkv.Record{}, false, nil
	}
	st := e.table.stripe(k)
	st.mu.Lock()
	defer st.mu.Unlock()
	rec, s, found, err := e.lookupLocked(st, k, now)
	switch {
	case err != nil:
		return idemkv.Record{}, false, fmt.Errorf("engine: list: %w", err)
	case !found, s != nil && s.busy:
		// Settled since the scan began, or being settled now.
		return idemkv.Record{}, false, nil
	}
	rec.ID = id
	if req.Escalated {
		return rec, rec.State == idemkv.StateUncertain && rec.Escalated, nil
	}
	return rec, awaiting(&rec, now), nil
}

// oldestAwaiting returns the age at now of the oldest record awaiting
// reconciliation, or 0 if there is none. Records live under a lease sort
// among the youngest, so the scan rarely reads past the first entries; it
// gives up (0) after maxOldestScan of them.
func (e *Engine) oldestAwaiting(now time.Time) (time.Duration, error) {
	prefix := record.AppendPendingPrefix(nil, record.PendingOpen)
	it, err := e.db.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: prefixEnd(prefix)})
	if err != nil {
		return 0, err
	}
	defer it.Close()
	req := idemkv.ListRequest{}
	n := 0
	for valid := it.First(); valid && n < maxOldestScan; valid = it.Next() {
		n++
		rec, ok, err := e.listed(it.Key(), &req, now)
		if err != nil {
			return 0, err
		}
		if ok {
			return max(0, now.Sub(rec.Created)), nil
		}
	}
	return 0, it.Error()
}

const maxOldestScan = 4096
