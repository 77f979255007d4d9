// Package record is the on-disk codec of an idempotency record's value.
//
// The encoding is compact and versioned. Version 1:
//
//	byte     codec version (1)
//	byte     state (1 in-progress, 2 uncertain, 3 completed)
//	byte     flags (bit 0: remote mode; bit 1: operation id present)
//	uvarint  fencing token
//	uvarint  attempt
//	uvarint  created, unix milliseconds
//	uvarint  expires, unix milliseconds
//	uvarint  lease expiry, unix milliseconds (0 unless in progress)
//	uvarint  fingerprint length, then the fingerprint
//	[16]byte operation id, if flag bit 1
//	completed: uvarint status, uvarint pointer length + pointer,
//	           uvarint body length + body
//	uncertain: uvarint note length + note
//
// Decode accepts exactly one encoded record: unknown versions, states or
// flags, out-of-range lengths and trailing bytes are errors, never panics.
// The record's ID is not encoded here; it is the Pebble key.
package record

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/idemkv/idemkv"
)

// Version is the codec version written by Encode.
const Version = 1

// MaxBody is the largest body the codec accepts, whatever the engine's
// configured limit.
const MaxBody = 16 << 20

const (
	flagRemote = 1 << 0
	flagOpID   = 1 << 1
	knownFlags = flagRemote | flagOpID
)

// ErrCorrupt is returned (wrapped) for any value Decode cannot accept.
var ErrCorrupt = errors.New("idemkv: corrupt record")

// Encode appends the encoding of r to dst and returns the result. r must be
// valid (see Check); Encode does not validate.
func Encode(dst []byte, r *idemkv.Record) []byte {
	var flags byte
	if r.Mode == idemkv.ModeRemote {
		flags |= flagRemote
	}
	if !r.OperationID.IsZero() {
		flags |= flagOpID
	}
	dst = append(dst, Version, byte(r.State), flags)
	dst = binary.AppendUvarint(dst, r.Token)
	dst = binary.AppendUvarint(dst, uint64(r.Attempt))
	dst = binary.AppendUvarint(dst, millis(r.Created))
	dst = binary.AppendUvarint(dst, millis(r.Expires))
	var lease uint64
	if r.State == idemkv.StateInProgress {
		lease = millis(r.LeaseExpires)
	}
	dst = binary.AppendUvarint(dst, lease)
	dst = appendBytes(dst, r.Fingerprint)
	if flags&flagOpID != 0 {
		dst = append(dst, r.OperationID[:]...)
	}
	switch r.State {
	case idemkv.StateCompleted:
		dst = binary.AppendUvarint(dst, uint64(r.Result.Status))
		dst = appendBytes(dst, []byte(r.Result.Pointer))
		dst = appendBytes(dst, r.Result.Body)
	case idemkv.StateUncertain:
		dst = appendBytes(dst, []byte(r.Note))
	}
	return dst
}

// Decode decodes one record value. The returned record does not alias b.
// Its ID is left empty.
func Decode(b []byte) (idemkv.Record, error) {
	d := decoder{b: b}
	var r idemkv.Record
	if v := d.byte(); v != Version {
		if d.err != nil {
			return r, d.err
		}
		return r, fmt.Errorf("%w: unknown codec version %d", ErrCorrupt, v)
	}
	r.State = idemkv.State(d.byte())
	flags := d.byte()
	if d.err != nil {
		return idemkv.Record{}, d.err
	}
	if r.State < idemkv.StateInProgress || r.State > idemkv.StateCompleted {
		return idemkv.Record{}, fmt.Errorf("%w: unknown state %d", ErrCorrupt, r.State)
	}
	if flags&^knownFlags != 0 {
		return idemkv.Record{}, fmt.Errorf("%w: unknown flags %#x", ErrCorrupt, flags)
	}
	if flags&flagRemote != 0 {
		r.Mode = idemkv.ModeRemote
	}
	r.Token = d.uvarint()
	attempt := d.uvarint()
	if attempt > 1<<32-1 {
		d.fail("attempt %d out of range", attempt)
	}
	r.Attempt = uint32(attempt)
	r.Created = d.time()
	r.Expires = d.time()
	lease := d.time()
	if r.State == idemkv.StateInProgress {
		r.LeaseExpires = lease
	} else if !lease.IsZero() {
		d.fail("lease expiry on a %s record", r.State)
	}
	r.Fingerprint = d.bytes(idemkv.MaxFingerprintLen)
	if flags&flagOpID != 0 {
		copy(r.OperationID[:], d.n(16))
		if d.err == nil && r.OperationID.IsZero() {
			d.fail("zero operation id")
		}
	}
	switch r.State {
	case idemkv.StateCompleted:
		st := d.uvarint()
		if st > 65535 {
			d.fail("status %d out of range", st)
		}
		r.Result.Status = int(st)
		r.Result.Pointer = string(d.bytes(idemkv.MaxPointerLen))
		if body := d.bytes(MaxBody); len(body) > 0 {
			r.Result.Body = body
		}
	case idemkv.StateUncertain:
		r.Note = string(d.bytes(idemkv.MaxNoteLen))
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d trailing bytes", len(d.b))
	}
	if d.err == nil && len(r.Fingerprint) == 0 {
		d.fail("empty fingerprint")
	}
	if d.err != nil {
		return idemkv.Record{}, d.err
	}
	return r, nil
}

func millis(t time.Time) uint64 {
	if t.IsZero() || t.UnixMilli() < 0 {
		return 0
	}
	return uint64(t.UnixMilli())
}

func appendBytes(dst, b []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

// decoder reads from b, remembering the first error; once it has failed,
// every read returns a zero value.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: "+format, append([]any{ErrCorrupt}, args...)...)
	}
}

func (d *decoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.fail("truncated")
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("bad varint")
		return 0
	}
	if n > 1 && d.b[n-1] == 0 {
		// A trailing zero byte means a non-minimal encoding: refuse it so
		// that every record has exactly one encoding.
		d.fail("non-minimal varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) time() time.Time {
	ms := d.uvarint()
	if ms == 0 || d.err != nil {
		return time.Time{}
	}
	if ms > 1<<53 { // far beyond any real clock; keeps time arithmetic sane
		d.fail("time %d out of range", ms)
		return time.Time{}
	}
	return time.UnixMilli(int64(ms))
}

func (d *decoder) n(n int) []byte {
	if d.err != nil {
		return nil
	}
	if len(d.b) < n {
		d.fail("truncated")
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

// bytes reads a length-prefixed byte string of at most max bytes and
// returns a copy of it.
func (d *decoder) bytes(max int) []byte {
	l := d.uvarint()
	if d.err != nil {
		return nil
	}
	if l > uint64(max) {
		d.fail("length %d exceeds limit %d", l, max)
		return nil
	}
	v := d.n(int(l))
	if v == nil {
		return nil
	}
	return append([]byte(nil), v...)
}
