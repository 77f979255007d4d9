package idemkv

import (
	"bytes"
	"context"
	"fmt"
	"time"
)

// What every store keeps beside its records: the business data an
// operation writes through Effects, read and scanned outside any
// operation, and a store's health, clock and counts. A service written
// against these interfaces runs on either store (engine, one process;
// pgstore, a fleet).

// The defaults of the options every store shares (engine.Options,
// pgstore.Options), the same on both.
const (
	DefaultLease          = 30 * time.Second // a claim's lease
	DefaultRetention      = 24 * time.Hour   // the default retention class's window
	DefaultMaxBodySize    = 64 << 10         // the longest Result.Body a store keeps, in bytes
	DefaultMaxEffectsSize = 1 << 20          // the most bytes one commit writes through Effects
	DefaultMaxEventSize   = 512 << 10        // the longest event, its payload and headers, in bytes
)

// MaxEffectKeyLen is the longest key written through Effects, and the
// longest prefix a scan of the data takes, in bytes.
const MaxEffectKeyLen = 1024

// ValidateEffectKey reports a key no store writes through Effects: one
// that is empty or longer than MaxEffectKeyLen. The error wraps
// ErrInvalidArgument.
func ValidateEffectKey(key []byte) error {
	if len(key) == 0 {
		return fmt.Errorf("%w: empty effect key", ErrInvalidArgument)
	}
	if len(key) > MaxEffectKeyLen {
		return fmt.Errorf("%w: effect key is %d bytes, limit %d", ErrInvalidArgument, len(key), MaxEffectKeyLen)
	}
	return nil
}

// ValidateDataScan reports a scan DataReader.ScanDataAfter refuses: a
// prefix longer than MaxEffectKeyLen, or a key to resume after that does
// not start with the prefix. The error wraps ErrInvalidArgument.
func ValidateDataScan(prefix, after []byte) error {
	switch {
	case len(prefix) > MaxEffectKeyLen:
		return fmt.Errorf("%w: prefix is %d bytes, limit %d", ErrInvalidArgument, len(prefix), MaxEffectKeyLen)
	case after != nil && !bytes.HasPrefix(after, prefix):
		return fmt.Errorf("%w: scan resumes after %q, which does not start with the prefix %q", ErrInvalidArgument, after, prefix)
	}
	return nil
}

// Validate reports a Result no store keeps: a status outside 0..65535, a
// pointer longer than MaxPointerLen, or a body longer than maxBody bytes
// (the store's own limit). The error wraps ErrInvalidResult.
func (r *Result) Validate(maxBody int) error {
	switch {
	case r.Status < 0 || r.Status > 65535:
		return fmt.Errorf("%w: status %d outside 0..65535", ErrInvalidResult, r.Status)
	case len(r.Pointer) > MaxPointerLen:
		return fmt.Errorf("%w: pointer is %d bytes, limit %d", ErrInvalidResult, len(r.Pointer), MaxPointerLen)
	case len(r.Body) > maxBody:
		return fmt.Errorf("%w: body is %d bytes, limit %d", ErrInvalidResult, len(r.Body), maxBody)
	}
	return nil
}

// A DataReader reads the business data a store keeps, outside any
// operation. Every method fails with the context's error once ctx is
// done, and with ErrClosed once the store is closed.
type DataReader interface {
	// GetData returns the value last committed under key through Effects;
	// the slice is the caller's. It fails with ErrNotFound if key has no
	// value, and ErrInvalidArgument for a key ValidateEffectKey refuses.
	GetData(ctx context.Context, key []byte) ([]byte, error)
	// ScanData calls fn for each value whose key starts with prefix, in
	// key order, until fn returns false. The key and value passed to fn
	// are valid only during the call.
	ScanData(ctx context.Context, prefix []byte, fn func(key, value []byte) bool) error
	// ScanDataAfter is ScanData resuming after the key after, which must
	// start with prefix (the last key an earlier scan passed to fn); nil
	// starts at the beginning. Keys written meanwhile are seen if they
	// sort after the point the scan has reached, so pages read this way
	// never repeat a key. It refuses what ValidateDataScan refuses.
	ScanDataAfter(ctx context.Context, prefix, after []byte, fn func(key, value []byte) bool) error
}

// A DataStore is a Store with its business data, health and clock: what a
// service built on idemkv uses of whichever store it runs on.
// *engine.Engine and *pgstore.Store are DataStores.
type DataStore interface {
	Store
	DataReader
	// Update commits a transaction of business data outside any record:
	// apply's writes and events commit together, or none does, and its
	// reads are checked at commit like an operation's. A store runs apply
	// again when what it read changed, up to a bound, then fails with
	// ErrConflict, so apply must act only through its Effects. If apply
	// returns an error, nothing is written and Update returns it.
	Update(ctx context.Context, apply func(Effects) error) error
	// Health reports whether the store can take writes now: nil, or why
	// not (ErrClosed, a disk that refuses writes, a database that does
	// not answer).
	Health(ctx context.Context) error
	// Now reads the store's clock, which its records' times are in.
	Now() time.Time
	// Counts returns what the store counted since it was opened.
	Counts() Counts
}

// Counts are what every store counts the same way, by this process since
// the store was opened. A store's own Stats say more.
type Counts struct {
	Claims   int64 // Claims that passed validation
	Acquired int64 // claims that acquired, takeovers included
	Replays  int64 // claims answered with a stored outcome
	// Mismatches counts claims answered Mismatch (the key reused with
	// another payload), InProgress those answered InProgress (a duplicate
	// while another attempt holds the key).
	Mismatches int64
	InProgress int64
	Completed  int64 // Completes that committed
	// Conflicts counts transactions that read something another changed
	// before they committed, each run again or refused with ErrConflict;
	// on a store that can abort writes that read nothing (pgstore: see
	// its package doc), those runs again too.
	Conflicts int64
	Fenced    int64 // writes refused with ErrFenced
}
