package baseline

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/idemkv/idemkv"
)

// The record key and value layouts are the engine's (see docs/design.md,
// "On disk"), written out again here because the engine keeps its codec
// internal. Using the same bytes keeps the comparison about the commit
// path: both stores hold the same keys and values, so bytes per key differ
// only through how they were written.
const (
	nsMeta   byte = 0x01
	nsRecord byte = 0x02
	nsData   byte = 0x03
)

var epochKey = []byte{nsMeta, 'e', 'p', 'o', 'c', 'h'}

func recordKey(id idemkv.ID) []byte {
	k := make([]byte, 0, 3+len(id.Tenant)+len(id.Endpoint)+len(id.Key))
	k = append(k, nsRecord)
	k = binary.AppendUvarint(k, uint64(len(id.Tenant)))
	k = append(k, id.Tenant...)
	k = binary.AppendUvarint(k, uint64(len(id.Endpoint)))
	k = append(k, id.Endpoint...)
	return append(k, id.Key...)
}

func dataKey(key []byte) []byte {
	return append([]byte{nsData}, key...)
}

const (
	codecVersion = 1
	flagRemote   = 1 << 0
	flagOpID     = 1 << 1
)

var errCorrupt = errors.New("baseline: corrupt record")

// encode appends r's value: version, state, flags, token, attempt, created,
// expires and lease expiry in Unix milliseconds, fingerprint, operation id
// (if any), then the result (completed) or the note (uncertain).
func encode(dst []byte, r *idemkv.Record) []byte {
	var flags byte
	if r.Mode == idemkv.ModeRemote {
		flags |= flagRemote
	}
	if !r.OperationID.IsZero() {
		flags |= flagOpID
	}
	dst = append(dst, codecVersion, byte(r.State), flags)
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

// decode is the inverse of encode. The record does not alias b.
func decode(b []byte) (idemkv.Record, error) {
	d := decoder{b: b}
	var r idemkv.Record
	if v := d.byte(); v != codecVersion {
		return r, fmt.Errorf("%w: version %d", errCorrupt, v)
	}
	r.State = idemkv.State(d.byte())
	flags := d.byte()
	if flags&flagRemote != 0 {
		r.Mode = idemkv.ModeRemote
	}
	r.Token = d.uvarint()
	r.Attempt = uint32(d.uvarint())
	r.Created = d.time()
	r.Expires = d.time()
	if lease := d.time(); r.State == idemkv.StateInProgress {
		r.LeaseExpires = lease
	}
	r.Fingerprint = d.bytes()
	if flags&flagOpID != 0 {
		copy(r.OperationID[:], d.n(16))
	}
	switch r.State {
	case idemkv.StateCompleted:
		r.Result.Status = int(d.uvarint())
		r.Result.Pointer = string(d.bytes())
		if body := d.bytes(); len(body) > 0 {
			r.Result.Body = body
		}
	case idemkv.StateUncertain:
		r.Note = string(d.bytes())
	case idemkv.StateInProgress:
	default:
		d.err = fmt.Errorf("%w: state %d", errCorrupt, r.State)
	}
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%w: %d trailing bytes", errCorrupt, len(d.b))
	}
	return r, d.err
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

// decoder reads from b and remembers the first error; after it, every read
// returns a zero value.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) n(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n > len(d.b) {
		d.err = fmt.Errorf("%w: truncated", errCorrupt)
		return nil
	}
	out := d.b[:n:n]
	d.b = d.b[n:]
	return out
}

func (d *decoder) byte() byte {
	if b := d.n(1); b != nil {
		return b[0]
	}
	return 0
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = fmt.Errorf("%w: bad varint", errCorrupt)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) time() time.Time {
	if ms := d.uvarint(); ms != 0 {
		return time.UnixMilli(int64(ms))
	}
	return time.Time{}
}

// bytes reads a length-prefixed byte string and copies it.
func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		if d.err == nil {
			d.err = fmt.Errorf("%w: length %d exceeds %d remaining", errCorrupt, n, len(d.b))
		}
		return nil
	}
	b := d.n(int(n))
	if len(b) == 0 {
		return nil
	}
	return append([]byte(nil), b...)
}
