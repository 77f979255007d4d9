// Package record is the on-disk layout of idempotency records: the Pebble
// key of a record (keys.go) and the codec of its value (this file).
//
// The value encoding is compact and versioned. Version 1:
//
//	byte     codec version (1, or 2 when the extension byte follows)
//	byte     ext, in version 2 only, never zero: bit 0 escalated
//	         (uncertain only), bit 1 audit note present (completed only),
//	         bit 2 uncertain mark present (uncertain only)
//	byte     head: bits 0-1 state (1 in-progress, 2 uncertain, 3 completed),
//	         bit 2 remote mode, bit 3 operation id present, bit 4 body
//	         present, bit 5 attempt other than 1, bit 6 retention class
//	         other than the default, bit 7 effects written (completed only)
//	uvarint  fencing token
//	uvarint  attempt, if head bit 5 (otherwise the attempt is 1)
//	uvarint  expires, unix seconds (Encode rounds up)
//	uvarint  expires minus created, seconds (Encode rounds created down)
//	uvarint  lease expiry, unix milliseconds, in progress only
//	uvarint  fingerprint length, then the fingerprint
//	[16]byte operation id, if head bit 3 (see below)
//	uvarint  class name length + class name, if head bit 6
//	uvarint  effects the completion wrote (at least 1), if head bit 7
//	completed: uvarint status, uvarint pointer length + pointer,
//	           and if head bit 4, uvarint body length + body (not empty)
//	uncertain: uvarint note length + note
//	completed with ext bit 1: uvarint note length + note (not empty)
//	uncertain with ext bit 2: uvarint when it was marked uncertain, unix
//	           milliseconds (Encode rounds up; not zero)
//
// A remote record without head bit 3 has the operation id the store
// derives from its ID and fingerprint at generation 0 (layout 6): nearly
// every remote record has that one, and storing it would cost 16 bytes a
// record. Decode leaves it zero; the engine, which holds the
// store's secret, fills it in. A remote record whose id is any other (a
// later generation's, or one an earlier layout drew at random) stores it.
// No layout before 6 wrote a remote record without an id.
//
// A record with no extension is written in version 1, so that a record
// has one encoding and the common ones pay nothing for the extension.
//
// Times are whole seconds except the lease and the uncertain mark: a
// record's retention is a matter of hours, and rounding its expiry up
// never shortens it. The mark is where a reconciler's grace starts, which
// can be shorter than a second; rounding it up never shortens the grace. A
// completed record with a status, a 32-byte pointer and a 9-byte
// fingerprint takes about 60 bytes.
//
// Decode accepts exactly one encoding of each record: unknown versions,
// states or bits, out-of-range lengths, non-minimal varints and trailing
// bytes are errors (wrapping ErrCorrupt), never panics. The record's ID is
// not encoded here; it is the Pebble key.
package record

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/idemkv/idemkv"
)

// Version is the codec version written by Encode for a record without
// an extension; VersionExt the one for a record with one (an escalated
// record, an uncertain one with its mark, or a completed one with an
// audit note).
const (
	Version    = 1
	VersionExt = 2
)

const (
	extEscalated = 1 << 0
	extNote      = 1 << 1
	extMarked    = 1 << 2
	knownExt     = extEscalated | extNote | extMarked
)

// MaxEffects is the largest effect count the codec accepts.
const MaxEffects = 1 << 31

// MaxBody is the largest body the codec accepts, whatever the engine's
// configured limit.
const MaxBody = 16 << 20

const (
	stateMask   = 0x03
	headRemote  = 1 << 2
	headOpID    = 1 << 3
	headBody    = 1 << 4
	headAttempt = 1 << 5
	headClass   = 1 << 6
	headEffects = 1 << 7
	knownHead   = stateMask | headRemote | headOpID | headBody | headAttempt | headClass | headEffects
)

// ErrCorrupt is returned (wrapped) for any value Decode cannot accept.
var ErrCorrupt = errors.New("idemkv: corrupt record")

// Encode appends the encoding of r to dst and returns the result. r must be
// a valid record (a known state, a fingerprint of 1 to 64 bytes, a created
// time not after its expiry); Encode does not validate.
func Encode(dst []byte, r *idemkv.Record) []byte {
	head := byte(r.State) & stateMask
	if r.Mode == idemkv.ModeRemote {
		head |= headRemote
	}
	if !r.OperationID.IsZero() {
		head |= headOpID
	}
	if r.State == idemkv.StateCompleted && len(r.Result.Body) > 0 {
		head |= headBody
	}
	if r.Attempt != 1 {
		head |= headAttempt
	}
	if r.Class != "" {
		head |= headClass
	}
	if r.State == idemkv.StateCompleted && r.Effects > 0 {
		head |= headEffects
	}
	var ext byte
	if r.State == idemkv.StateUncertain && r.Escalated {
		ext |= extEscalated
	}
	if r.State == idemkv.StateCompleted && r.Note != "" {
		ext |= extNote
	}
	marked := ceilMillis(r.Marked)
	if r.State == idemkv.StateUncertain && marked > 0 {
		ext |= extMarked
	}
	if ext == 0 {
		dst = append(dst, Version, head)
	} else {
		dst = append(dst, VersionExt, ext, head)
	}
	dst = binary.AppendUvarint(dst, r.Token)
	if head&headAttempt != 0 {
		dst = binary.AppendUvarint(dst, uint64(r.Attempt))
	}
	exp := ceilSeconds(r.Expires)
	var age uint64
	if exp > 0 {
		age = exp - min(exp, floorSeconds(r.Created))
	}
	dst = binary.AppendUvarint(dst, exp)
	dst = binary.AppendUvarint(dst, age)
	if r.State == idemkv.StateInProgress {
		dst = binary.AppendUvarint(dst, millis(r.LeaseExpires))
	}
	dst = appendBytes(dst, r.Fingerprint)
	if head&headOpID != 0 {
		dst = append(dst, r.OperationID[:]...)
	}
	if head&headClass != 0 {
		dst = appendBytes(dst, []byte(r.Class))
	}
	if head&headEffects != 0 {
		dst = binary.AppendUvarint(dst, uint64(r.Effects))
	}
	switch r.State {
	case idemkv.StateCompleted:
		dst = binary.AppendUvarint(dst, uint64(r.Result.Status))
		dst = appendBytes(dst, []byte(r.Result.Pointer))
		if head&headBody != 0 {
			dst = appendBytes(dst, r.Result.Body)
		}
		if ext&extNote != 0 {
			dst = appendBytes(dst, []byte(r.Note))
		}
	case idemkv.StateUncertain:
		dst = appendBytes(dst, []byte(r.Note))
		if ext&extMarked != 0 {
			dst = binary.AppendUvarint(dst, marked)
		}
	}
	return dst
}

// Decode decodes one record value. The returned record does not alias b.
// Its ID is left empty.
func Decode(b []byte) (idemkv.Record, error) {
	d := decoder{b: b}
	r, ext, head, err := d.head()
	if err != nil {
		return idemkv.Record{}, err
	}
	if head&headRemote != 0 {
		r.Mode = idemkv.ModeRemote
	}
	r.Token = d.uvarint()
	r.Attempt = 1
	if head&headAttempt != 0 {
		attempt := d.uvarint()
		if attempt > 1<<32-1 || attempt == 1 {
			d.fail("attempt %d out of range", attempt)
		}
		r.Attempt = uint32(attempt)
	}
	exp, age := d.uvarint(), d.uvarint()
	switch {
	case d.err != nil:
	case exp > maxSeconds:
		d.fail("expiry %d out of range", exp)
	case age > exp:
		d.fail("creation %d seconds before expiry %d", age, exp)
	case exp > 0:
		r.Expires = time.Unix(int64(exp), 0)
		r.Created = time.Unix(int64(exp-age), 0)
	}
	if r.State == idemkv.StateInProgress {
		r.LeaseExpires = d.time()
	}
	r.Fingerprint = d.bytes(idemkv.MaxFingerprintLen)
	if head&headOpID != 0 {
		copy(r.OperationID[:], d.n(16))
		if d.err == nil && r.OperationID.IsZero() {
			d.fail("zero operation id")
		}
	}
	if head&headClass != 0 {
		r.Class = string(d.bytes(idemkv.MaxClassLen))
		if d.err == nil && r.Class == "" {
			d.fail("empty retention class")
		}
	}
	if head&headEffects != 0 {
		n := d.uvarint()
		if d.err == nil && (n == 0 || n > MaxEffects) {
			d.fail("effect count %d out of range", n)
		}
		r.Effects = int(n)
	}
	switch r.State {
	case idemkv.StateCompleted:
		st := d.uvarint()
		if st > 65535 {
			d.fail("status %d out of range", st)
		}
		r.Result.Status = int(st)
		r.Result.Pointer = string(d.bytes(idemkv.MaxPointerLen))
		if head&headBody != 0 {
			r.Result.Body = d.bytes(MaxBody)
			if d.err == nil && len(r.Result.Body) == 0 {
				d.fail("empty body")
			}
		}
		if ext&extNote != 0 {
			r.Note = string(d.bytes(idemkv.MaxNoteLen))
			if d.err == nil && r.Note == "" {
				d.fail("empty audit note")
			}
		}
	case idemkv.StateUncertain:
		r.Note = string(d.bytes(idemkv.MaxNoteLen))
		if ext&extMarked != 0 {
			r.Marked = d.time()
			if d.err == nil && r.Marked.IsZero() {
				d.fail("zero uncertain mark")
			}
		}
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

// head reads the version, the extension byte and the head byte, checks
// them against each other, and returns the record they begin.
func (d *decoder) head() (r idemkv.Record, ext, head byte, err error) {
	if ext, err = d.version(); err != nil {
		return r, 0, 0, err
	}
	head = d.byte()
	if d.err != nil {
		return r, 0, 0, d.err
	}
	r.State = idemkv.State(head & stateMask)
	switch {
	case r.State < idemkv.StateInProgress || r.State > idemkv.StateCompleted:
		return r, 0, 0, fmt.Errorf("%w: unknown state %d", ErrCorrupt, r.State)
	case ext&extEscalated != 0 && r.State != idemkv.StateUncertain:
		return r, 0, 0, fmt.Errorf("%w: escalated %s record", ErrCorrupt, r.State)
	case ext&extNote != 0 && r.State != idemkv.StateCompleted:
		return r, 0, 0, fmt.Errorf("%w: audit note on a %s record", ErrCorrupt, r.State)
	case ext&extMarked != 0 && r.State != idemkv.StateUncertain:
		return r, 0, 0, fmt.Errorf("%w: %s record with an uncertain mark", ErrCorrupt, r.State)
	case head&^knownHead != 0:
		return r, 0, 0, fmt.Errorf("%w: unknown head bits %#x", ErrCorrupt, head)
	case head&(headBody|headEffects) != 0 && r.State != idemkv.StateCompleted:
		return r, 0, 0, fmt.Errorf("%w: body or effects on a %s record", ErrCorrupt, r.State)
	}
	r.Escalated = ext&extEscalated != 0
	return r, ext, head, nil
}

// Peek returns the state and expiry of an encoded record without decoding
// the rest, for scans that only judge expiry (the sweeper). It checks only
// what it reads: a value Peek accepts may still be one Decode rejects.
func Peek(b []byte) (idemkv.State, time.Time, error) {
	d := decoder{b: b}
	if _, err := d.version(); err != nil {
		return 0, time.Time{}, err
	}
	head := d.byte()
	d.uvarint() // token
	if head&headAttempt != 0 {
		d.uvarint()
	}
	exp := d.uvarint()
	if d.err != nil {
		return 0, time.Time{}, d.err
	}
	st := idemkv.State(head & stateMask)
	if st < idemkv.StateInProgress || head&^knownHead != 0 || exp > maxSeconds {
		return 0, time.Time{}, fmt.Errorf("%w: bad head %#x or expiry %d", ErrCorrupt, head, exp)
	}
	var t time.Time
	if exp > 0 {
		t = time.Unix(int64(exp), 0)
	}
	return st, t, nil
}

// maxSeconds keeps decoded times far inside time.Time's range.
const maxSeconds = 1 << 40

// ceilSeconds is t in whole unix seconds, rounded up; 0 for the zero time
// and times before 1970.
func ceilSeconds(t time.Time) uint64 {
	if t.IsZero() || t.Unix() < 0 {
		return 0
	}
	s := uint64(t.Unix())
	if t.Nanosecond() > 0 {
		s++
	}
	return s
}

// floorSeconds is t in whole unix seconds, rounded down; 0 for the zero
// time and times before 1970.
func floorSeconds(t time.Time) uint64 {
	if t.IsZero() || t.Unix() < 0 {
		return 0
	}
	return uint64(t.Unix())
}

// Seconds returns t rounded up to a whole second, as Encode stores an
// expiry. Stores use it so that what they hold in memory equals what they
// read back.
func Seconds(t time.Time) time.Time {
	if s := ceilSeconds(t); s > 0 {
		return time.Unix(int64(s), 0)
	}
	return t
}

// ceilMillis is t in unix milliseconds, rounded up; 0 for the zero time
// and times before 1970.
func ceilMillis(t time.Time) uint64 {
	ms := millis(t)
	if ms > 0 && t.Nanosecond()%int(time.Millisecond) > 0 {
		ms++
	}
	return ms
}

// Milliseconds returns t rounded up to a whole millisecond, as Encode
// stores an uncertain mark, in the form Decode returns it. Stores use it
// so that what they hold in memory equals what they read back.
func Milliseconds(t time.Time) time.Time {
	if ms := ceilMillis(t); ms > 0 {
		return time.UnixMilli(int64(ms))
	}
	return t
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

// version reads the codec version and, in version 2, the extension byte.
func (d *decoder) version() (ext byte, err error) {
	switch v := d.byte(); {
	case d.err != nil:
		return 0, d.err
	case v == Version:
		return 0, nil
	case v != VersionExt:
		return 0, fmt.Errorf("%w: unknown codec version %d", ErrCorrupt, v)
	}
	ext = d.byte()
	switch {
	case d.err != nil:
		return 0, d.err
	case ext == 0 || ext&^knownExt != 0:
		return 0, fmt.Errorf("%w: bad extension byte %#x", ErrCorrupt, ext)
	}
	return ext, nil
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
