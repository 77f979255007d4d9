package engine

import (
	"bytes"
	"cmp"
	"container/heap"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine/internal/record"
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

// Scan implements idemkv.Scanner, in record-key order (tenant, endpoint,
// key). A record lives under its key while unsettled and in an expiry
// bucket once completed, so a page merges the unsettled records with
// every bucket that has not ended, all read from one snapshot; Next is
// the last record key read. A record that completes between pages is
// then met once, wherever it is when the scan reaches its key. A remote
// record in progress is shown with its lease as renewed; a local claim,
// held only in memory while its request runs, is not stored and not
// scanned.
func (e *Engine) Scan(ctx context.Context, req idemkv.ScanRequest) (idemkv.ScanPage, error) {
	if err := req.Validate(); err != nil {
		return idemkv.ScanPage{}, err
	}
	limit := min(cmp.Or(req.Limit, defaultListLimit), maxListLimit)
	var after []byte
	if req.After != "" {
		var err error
		after, err = hex.DecodeString(req.After)
		if err != nil || len(after) < 2 || after[0] != record.NSRecord {
			return idemkv.ScanPage{}, fmt.Errorf("%w: malformed cursor", idemkv.ErrInvalidArgument)
		}
	}
	if err := e.gate.begin(ctx); err != nil {
		return idemkv.ScanPage{}, err
	}
	defer e.gate.exit()
	snap := e.db.NewSnapshot()
	defer snap.Close()
	s := scan{e: e, req: &req, limit: limit, now: e.clock.Now()}
	err := s.open(snap, after)
	if err == nil {
		err = s.run(ctx)
	}
	if cerr := s.close(); err == nil {
		err = cerr
	}
	if err != nil {
		if ctx.Err() != nil {
			return idemkv.ScanPage{}, err
		}
		return idemkv.ScanPage{}, fmt.Errorf("engine: scan: %w", err)
	}
	return s.page, nil
}

// scan is one page of a Scan: a merge of its sources by record key.
type scan struct {
	e     *Engine
	req   *idemkv.ScanRequest
	limit int
	now   time.Time
	srcs  sources
	read  int    // keys read so far
	last  []byte // the record key read last
	page  idemkv.ScanPage
}

// A source is one sorted run of records: the unsettled records (prefix
// is the record namespace) or one expiry bucket (prefix is the bucket's).
// Its keys are prefix + the record key without its namespace byte.
type source struct {
	it     *pebble.Iterator
	prefix []byte
}

// body is the record key of the source's current entry without its
// namespace byte: what sources are merged by.
func (s *source) body() []byte { return s.it.Key()[len(s.prefix):] }

// open positions a source for the unsettled records and one for each
// bucket that has not ended, as the request's state asks, just after the
// record key after (nil: at the start).
func (s *scan) open(r pebble.Reader, after []byte) error {
	var prefixes [][]byte
	if s.req.State != idemkv.StateCompleted {
		prefixes = append(prefixes, []byte{record.NSRecord})
	}
	if s.req.State == 0 || s.req.State == idemkv.StateCompleted {
		unix := uint64(s.now.Unix())
		for _, b := range s.e.buckets.load() {
			if b.end > unix { // an ended bucket's records have all expired
				prefixes = append(prefixes, []byte(b.prefix))
			}
		}
	}
	for _, p := range prefixes {
		lower := p
		if after != nil {
			lower = append(append(bytes.Clone(p), after[1:]...), 0) // the first key after it
		}
		it, err := r.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: prefixEnd(p)})
		if err != nil {
			return err
		}
		src := &source{it: it, prefix: p}
		if it.First() {
			s.srcs = append(s.srcs, src)
			continue
		}
		err = it.Error()
		if cerr := it.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	heap.Init(&s.srcs)
	return nil
}

// run reads records in key order into the page until it is full, the
// page has read maxScanKeys, or the sources run out.
func (s *scan) run(ctx context.Context) error {
	for s.srcs.Len() > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		if len(s.page.Records) == s.limit || s.read == maxScanKeys {
			s.page.Next = hex.EncodeToString(s.last)
			return nil
		}
		src := s.srcs[0]
		s.read++
		s.last = append(append(s.last[:0], record.NSRecord), src.body()...)
		rec, ok, err := s.record(src.it)
		if err != nil {
			return err
		}
		if ok {
			s.page.Records = append(s.page.Records, rec)
		}
		if src.it.Next() {
			heap.Fix(&s.srcs, 0)
			continue
		}
		if err := src.it.Error(); err != nil {
			return err
		}
		heap.Pop(&s.srcs)
		if err := src.it.Close(); err != nil {
			return err
		}
	}
	return nil
}

func (s *scan) close() error {
	var errs []error
	for _, src := range s.srcs {
		errs = append(errs, src.it.Close())
	}
	s.srcs = nil
	return errors.Join(errs...)
}

// record decodes the record at it's key, if the request wants it.
func (s *scan) record(it *pebble.Iterator) (idemkv.Record, bool, error) {
	id, err := decodeRecordKey(s.last)
	if err != nil {
		return idemkv.Record{}, false, fmt.Errorf("a malformed record key under namespace %#x: %w", it.Key()[0], err)
	}
	if s.req.Tenant != "" && id.Tenant != s.req.Tenant {
		return idemkv.Record{}, false, nil
	}
	v, err := it.ValueAndErr()
	if err != nil {
		return idemkv.Record{}, false, err
	}
	rec, err := s.e.decodeRecord(s.last, v)
	if err != nil {
		return idemkv.Record{}, false, fmt.Errorf("record of key_hash %s: %w", id.Hash(), err)
	}
	rec.ID = id
	switch {
	case rec.State == idemkv.StateCompleted && !s.now.Before(rec.Expires):
		return idemkv.Record{}, false, nil // past retention: absent to every read
	case rec.State == idemkv.StateInProgress:
		s.e.renewedLease(s.last, &rec)
	}
	want := (s.req.State == 0 || rec.State == s.req.State) &&
		(s.req.CreatedBefore.IsZero() || rec.Created.Before(s.req.CreatedBefore))
	return rec, want, nil
}

// renewedLease sets rec's lease to its holder's, if a holder of rec's
// token has k's slot: the page's snapshot may predate a renewal.
func (e *Engine) renewedLease(k []byte, rec *idemkv.Record) {
	st := e.table.stripe(k)
	st.mu.Lock()
	defer st.mu.Unlock()
	if sl := st.slotLocked(k); sl != nil && sl.rec.Token == rec.Token {
		rec.LeaseExpires = sl.rec.LeaseExpires
	}
}

// sources is a min-heap of sources by their current record key.
type sources []*source

func (h sources) Len() int           { return len(h) }
func (h sources) Less(i, j int) bool { return bytes.Compare(h[i].body(), h[j].body()) < 0 }
func (h sources) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *sources) Push(x any)        { *h = append(*h, x.(*source)) }
func (h *sources) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
