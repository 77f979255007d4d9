package idemkv

import (
	"context"
	"fmt"
	"time"
)

// An operator's reach into a store, beyond the Store contract: reading
// every record (Scanner) and removing one by hand (Evicter). Both stores
// (engine, and pgstore in its own module) implement them; package admin and the idemkv command use
// them when the store does.

// Scanner lists every record a store holds, in any state, for
// operators' listings and exports. Unlike List it reads the records
// themselves, so a filtered scan still reads past everything it skips.
type Scanner interface {
	// Scan returns a page of records (see ScanRequest). Errors:
	// ErrInvalidScope, ErrInvalidArgument (a malformed cursor or a
	// negative limit), ErrClosed, or an I/O error.
	Scan(ctx context.Context, req ScanRequest) (ScanPage, error)
}

// ScanRequest asks for a page of records. Records are in an order of the
// store's own, the same from page to page: a scan visits each record
// that exists throughout it exactly once. A completed record past its
// retention is absent, as to every read.
type ScanRequest struct {
	// Tenant, if set, scans only that tenant's records.
	Tenant string
	// State, if set, scans only records in that state. An escalated
	// record is uncertain; an abandoned one is in progress.
	State State
	// CreatedBefore, if set, scans only records created before it: the
	// records older than some age.
	CreatedBefore time.Time
	// After is the Next of the previous page; "" starts at the beginning.
	After string
	// Limit caps the page: zero means 100, and a store may cap it lower.
	Limit int
}

// Validate reports whether req is well formed. Its errors wrap
// ErrInvalidScope or ErrInvalidArgument.
func (req *ScanRequest) Validate() error {
	if req.Tenant != "" {
		if err := validateScope("tenant", req.Tenant); err != nil {
			return err
		}
	}
	if req.State > StateCompleted {
		return fmt.Errorf("%w: unknown state %d", ErrInvalidArgument, req.State)
	}
	if req.Limit < 0 {
		return fmt.Errorf("%w: negative limit %d", ErrInvalidArgument, req.Limit)
	}
	return nil
}

// ScanPage is a page of records.
type ScanPage struct {
	Records []Record
	// Next continues the scan after this page; "" after the last page.
	Next string
}

// Evicter removes a record by hand. Evicting a completed record forgets
// its outcome: the next request with its key runs the operation again,
// with all it does (its downstream calls, its events, its writes), so an
// operator evicts one only to undo a stored outcome known to be wrong,
// or to erase what the record keeps of a customer's request. What its
// completion wrote through Effects stays, and the store's check still
// pairs it with the evicted outcome until that would have expired.
type Evicter interface {
	// Evict removes req.ID's record and returns it as it was. Errors:
	// ErrNotFound, ErrWrongState (in progress under a live lease, whose
	// holder is running: settle it with Resolve once abandoned),
	// ErrFenced (req.Token is set and not current), ErrInvalidKey,
	// ErrInvalidScope, ErrClosed, ErrFailed, or an I/O error.
	Evict(ctx context.Context, req EvictRequest) (Record, error)
}

// EvictRequest names the record to evict.
type EvictRequest struct {
	ID ID
	// Token, if not zero, must be the record's current token (as Get
	// read it): the eviction is then a compare-and-set on it.
	Token uint64
	// Since, if set, is the moment the eviction of an unsettled record
	// was decided from (Record.LastCall), as ResolveRequest.Since: a
	// record whose attempt renewed its lease or marked it uncertain
	// later, or that has completed since, is refused (ErrFenced), rather
	// than forget an outcome no one judged.
	Since time.Time
}
