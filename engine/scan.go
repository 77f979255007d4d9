package engine

import (
	"bytes"
	"cmp"
	"context"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/record"
)

var (
	_ idemkv.Scanner = (*Engine)(nil)
	_ idemkv.Evicter = (*Engine)(nil)
)

// maxScanKeys bounds the keys one Scan page reads, so that a filter that
// matches little cannot make one call read the whole store: such a page
// holds fewer records than asked for, and Next goes on from where it
// stopped.
const maxScanKeys = 20_000

// Scan implements idemkv.Scanner. It reads the unsettled records in key
// order, then the completed ones bucket by bucket (by retention class
// and expiry); Next is the last key read. A remote record in progress is
// shown with its lease as renewed; a local claim, held only in memory
// while its request runs, is not stored and not scanned.
func (e *Engine) Scan(ctx context.Context, req idemkv.ScanRequest) (idemkv.ScanPage, error) {
	if err := req.Validate(); err != nil {
		return idemkv.ScanPage{}, err
	}
	limit := min(cmp.Or(req.Limit, defaultListLimit), maxListLimit)
	var after []byte
	if req.After != "" {
		var err error
		after, err = hex.DecodeString(req.After)
		if err != nil || len(after) < 2 || (after[0] != record.NSRecord && after[0] != record.NSExpiry) {
			return idemkv.ScanPage{}, fmt.Errorf("%w: malformed cursor %q", idemkv.ErrInvalidArgument, req.After)
		}
	}
	if err := e.gate.begin(ctx); err != nil {
		return idemkv.ScanPage{}, err
	}
	defer e.gate.exit()
	s := scan{e: e, req: &req, limit: limit, now: e.clock.Now()}
	for _, span := range s.spans() {
		lower := span[0]
		if after != nil {
			if bytes.Compare(after, span[1]) >= 0 {
				continue
			}
			if bytes.Compare(after, lower) >= 0 {
				lower = append(bytes.Clone(after), 0) // the first key after it
			}
		}
		done, err := s.span(ctx, lower, span[1])
		if err != nil {
			return idemkv.ScanPage{}, fmt.Errorf("engine: scan: %w", err)
		}
		if done {
			break
		}
	}
	return s.page, nil
}

// scan is one page of a Scan.
type scan struct {
	e     *Engine
	req   *idemkv.ScanRequest
	limit int
	now   time.Time
	read  int    // keys read so far
	last  []byte // the last key read
	page  idemkv.ScanPage
}

// spans are the key ranges that hold the records the request wants.
func (s *scan) spans() [][2][]byte {
	unsettled := [2][]byte{recordStart, recordEnd}
	completed := [2][]byte{expiryStart, expiryEnd}
	switch s.req.State {
	case idemkv.StateCompleted:
		return [][2][]byte{completed}
	case idemkv.StateInProgress, idemkv.StateUncertain:
		return [][2][]byte{unsettled}
	}
	return [][2][]byte{unsettled, completed}
}

// span reads [lower, upper) into the page, and reports whether the page
// is full (its Next set).
func (s *scan) span(ctx context.Context, lower, upper []byte) (bool, error) {
	it, err := s.e.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return false, err
	}
	defer it.Close()
	for valid := it.First(); valid; valid = it.Next() {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		if len(s.page.Records) == s.limit || s.read == maxScanKeys {
			s.page.Next = hex.EncodeToString(s.last)
			return true, nil
		}
		s.read++
		rec, ok, err := s.record(it)
		if err != nil {
			return false, err
		}
		s.last = append(s.last[:0], it.Key()...)
		if ok {
			s.page.Records = append(s.page.Records, rec)
		}
	}
	return false, it.Error()
}

// record decodes the record at it's key, if the request wants it.
func (s *scan) record(it *pebble.Iterator) (idemkv.Record, bool, error) {
	k := it.Key()
	if k[0] == record.NSExpiry {
		_, _, _, rk, err := record.SplitExpiryKey(k)
		if err != nil {
			return idemkv.Record{}, false, fmt.Errorf("expiry key %x: %w", k, err)
		}
		k = rk
	}
	id, err := decodeRecordKey(k)
	if err != nil {
		return idemkv.Record{}, false, fmt.Errorf("record key %x: %w", k, err)
	}
	if s.req.Tenant != "" && id.Tenant != s.req.Tenant {
		return idemkv.Record{}, false, nil
	}
	v, err := it.ValueAndErr()
	if err != nil {
		return idemkv.Record{}, false, err
	}
	rec, err := record.Decode(v)
	if err != nil {
		return idemkv.Record{}, false, fmt.Errorf("record %x: %w", k, err)
	}
	rec.ID = id
	switch {
	case rec.State == idemkv.StateCompleted && !s.now.Before(rec.Expires):
		return idemkv.Record{}, false, nil // past retention: absent to every read
	case rec.State == idemkv.StateInProgress:
		s.e.renewedLease(k, &rec)
	}
	want := (s.req.State == 0 || rec.State == s.req.State) &&
		(s.req.CreatedBefore.IsZero() || rec.Created.Before(s.req.CreatedBefore))
	return rec, want, nil
}

// renewedLease sets rec's lease to its holder's, as renewed in memory, if
// a holder of rec's token has k's slot.
func (e *Engine) renewedLease(k []byte, rec *idemkv.Record) {
	st := e.table.stripe(k)
	st.mu.Lock()
	defer st.mu.Unlock()
	if sl := st.slotLocked(k); sl != nil && sl.rec.Token == rec.Token {
		rec.LeaseExpires = sl.rec.LeaseExpires
	}
}
