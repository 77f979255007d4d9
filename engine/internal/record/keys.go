package record

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/idemkv/idemkv"
)

// The Pebble key space is split by a one-byte namespace prefix. Engine
// records and caller effects can never collide because every key an
// Effects writer produces starts with NSData, and only the store writes the
// others.
//
//	0x01 meta    store metadata (the layout version, the epoch, the
//	             store's secret, the sweeper's position, the clock's
//	             high-water mark, the marks of evicted outcomes)
//	0x02 record  uvarint(len tenant) tenant uvarint(len endpoint) endpoint key:
//	             an unsettled record (in progress or uncertain), which
//	             never expires while it is unsettled
//	0x03 data    caller effects: 0x03 + the caller's key; the value is a
//	             stamp (see AppendStamp) and then the caller's value
//	0x04 expiry  a completed record in its expiry bucket: 0x04, the
//	             retention class as one length byte and its bytes, the
//	             bucket's end in unix seconds (big-endian uint64), then the
//	             record key without its namespace byte
//	0x05 pending an index of the records that may need settling, written
//	             in the same batch as the record it stands for (see
//	             AppendPendingKey); the value is the record's state, one
//	             byte
//	0x06 outbox  events emitted by committed operations (see outbox.go in
//	             this package): 0x06 'e' and the event's sequence
//	             (big-endian uint64) for an event not yet acknowledged;
//	             0x06 'n' and the entity for the last sequence of each
//	             (topic, key); 0x06 'c' for the acknowledged cursor
//
// A completed record is never rewritten while it is retained, and every
// record in a bucket has expired once the bucket has ended, so the sweeper
// drops a whole bucket with one range deletion rather than deleting its
// records one by one (docs/design.md, "Expiry and the sweeper").
//
// The record key spells out the whole scope rather than a hash of it, so
// that two tenants can never share a record, even adversarially. Pebble's
// block-level prefix compression makes the repeated scope cheap on disk.
const (
	NSMeta    byte = 0x01
	NSRecord  byte = 0x02
	NSData    byte = 0x03
	NSExpiry  byte = 0x04
	NSPending byte = 0x05
	NSOutbox  byte = 0x06
)

// EpochKey holds the store's epoch (a big-endian uint64).
var EpochKey = []byte{NSMeta, 'e', 'p', 'o', 'c', 'h'}

// LayoutKey holds the layout version of the store (a big-endian uint64):
// Layout for every store this code writes. A store without it is either
// empty or was written before the marker existed (layout 1: effect values
// without stamps).
var LayoutKey = []byte{NSMeta, 'l', 'a', 'y', 'o', 'u', 't'}

// SecretKey holds the store's secret, SecretLen random bytes, under which
// it derives the operation id of every new remote record
// (idemkv.DeriveOperationID). It is written once, with the epoch, by the
// first read-write Open of a store in layout 5, and never changed, so
// the store, and a copy of it (a backup), derives the same id for the
// same request for as long as it lives.
var SecretKey = []byte{NSMeta, 's', 'e', 'c', 'r', 'e', 't'}

// SecretLen is the length of the store's secret: as long as the
// HMAC-SHA256 it keys.
const SecretLen = 32

// EvictedPrefix starts the key of each evicted outcome that had effects
// (AppendEvictedKey): the effects stay, stamped with the outcome's token
// and expiry, and Check pairs them with this mark instead of the record.
var EvictedPrefix = []byte{NSMeta, 'e', 'v', 'i', 'c', 't', 'e', 'd'}

// AppendEvictedKey appends the evicted-outcome key of token to dst.
func AppendEvictedKey(dst []byte, token uint64) []byte {
	return binary.BigEndian.AppendUint64(append(dst, EvictedPrefix...), token)
}

// EvictedValue is the value of an evicted-outcome key: the outcome's
// expiry (unix seconds) and how many effects it counted.
func EvictedValue(expires int64, effects uint32) []byte {
	return binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint64(nil, uint64(expires)), effects)
}

// SplitEvicted decodes an evicted-outcome key and its value.
func SplitEvicted(k, v []byte) (token uint64, expires int64, effects uint32, err error) {
	if len(k) != len(EvictedPrefix)+8 || len(v) != 12 {
		return 0, 0, 0, fmt.Errorf("%w: evicted-outcome entry of %d and %d bytes", ErrCorrupt, len(k), len(v))
	}
	return binary.BigEndian.Uint64(k[len(EvictedPrefix):]), int64(binary.BigEndian.Uint64(v)), binary.BigEndian.Uint32(v[8:]), nil
}

// Layout is the version of the key space and value formats described
// here and in record.go. Version 2 added the stamp on effect values;
// version 3 moved completed records into expiry buckets; version 4 added
// the pending index and the codec's extension byte (codec version 2);
// version 5 added the store's secret (SecretKey) and the uncertain mark
// (the extension byte's bit 2), which a layout-4 decoder calls corrupt;
// version 6 stopped storing a remote record's operation id when it is the
// derived one (record.go), which a layout-5 engine would read as none.
const Layout = 6

// SweepKey holds the sweeper's position: the last key the pass in progress
// read (an expiry key or a record key), or the lone byte NSRecord once it
// has read every expiry bucket. Absent between passes.
var SweepKey = []byte{NSMeta, 's', 'w', 'e', 'e', 'p'}

// ClockKey holds the high-water mark of the engine's time (big-endian
// unix nanoseconds): no durable record carries a later time.
var ClockKey = []byte{NSMeta, 'c', 'l', 'o', 'c', 'k'}

// AppendKey appends id's record key to dst.
func AppendKey(dst []byte, id idemkv.ID) []byte {
	// One allocation at most: the uvarints take up to 10 bytes each.
	dst = slices.Grow(dst, 1+2*binary.MaxVarintLen64+len(id.Tenant)+len(id.Endpoint)+len(id.Key))
	dst = append(dst, NSRecord)
	dst = binary.AppendUvarint(dst, uint64(len(id.Tenant)))
	dst = append(dst, id.Tenant...)
	dst = binary.AppendUvarint(dst, uint64(len(id.Endpoint)))
	dst = append(dst, id.Endpoint...)
	return append(dst, id.Key...)
}

// ErrBadKey is returned by DecodeKey for a key that AppendKey did not make.
var ErrBadKey = errors.New("idemkv: malformed record key")

// DecodeKey is the inverse of AppendKey.
func DecodeKey(k []byte) (idemkv.ID, error) {
	if len(k) == 0 || k[0] != NSRecord {
		return idemkv.ID{}, ErrBadKey
	}
	k = k[1:]
	part := func() (string, bool) {
		n, w := binary.Uvarint(k)
		if w <= 0 || n > uint64(len(k)-w) {
			return "", false
		}
		s := string(k[w : w+int(n)])
		k = k[w+int(n):]
		return s, true
	}
	tenant, ok1 := part()
	endpoint, ok2 := part()
	if !ok1 || !ok2 {
		return idemkv.ID{}, ErrBadKey
	}
	return idemkv.ID{Tenant: tenant, Endpoint: endpoint, Key: string(k)}, nil
}

// BucketLen is the length of the bucket prefix of an expiry key of a
// class whose name is n bytes long.
func BucketLen(n int) int { return 1 + 1 + n + 8 }

// AppendBucket appends the prefix shared by the expiry keys of the bucket
// of class that ends at end (unix seconds).
func AppendBucket(dst []byte, class string, end uint64) []byte {
	dst = append(dst, NSExpiry, byte(len(class)))
	dst = append(dst, class...)
	return binary.BigEndian.AppendUint64(dst, end)
}

// AppendExpiryKey appends the expiry key of the record whose record key
// (AppendKey) is recordKey, in the bucket whose prefix is bucket.
func AppendExpiryKey(dst, bucket, recordKey []byte) []byte {
	return append(append(dst, bucket...), recordKey[1:]...)
}

// SplitExpiryKey splits an expiry key into its bucket prefix (aliasing k),
// the bucket's class and end, and the record key it stands for (a new
// slice).
func SplitExpiryKey(k []byte) (bucket []byte, class string, end uint64, recordKey []byte, err error) {
	if len(k) < 2 || k[0] != NSExpiry {
		return nil, "", 0, nil, ErrBadKey
	}
	n := int(k[1])
	if len(k) < BucketLen(n) {
		return nil, "", 0, nil, ErrBadKey
	}
	bucket = k[:BucketLen(n)]
	class = string(k[2 : 2+n])
	end = binary.BigEndian.Uint64(k[2+n:])
	recordKey = append([]byte{NSRecord}, k[len(bucket):]...)
	return bucket, class, end, recordKey, nil
}

// BucketEnd is the end, in unix seconds, of the bucket of width w that
// holds a record expiring at expires: the first multiple of w (in whole
// seconds, at least one) at or after the expiry, so that every record in a
// bucket has expired once the bucket has ended.
func BucketEnd(expires time.Time, w time.Duration) uint64 {
	e := ceilSeconds(expires)
	ws := max(1, uint64(w/time.Second))
	return (e + ws - 1) / ws * ws
}

// DataKey returns the Pebble key of a caller's effect key.
func DataKey(key []byte) []byte {
	k := make([]byte, 0, 1+len(key))
	return append(append(k, NSData), key...)
}

// StampLen is the length of the stamp that leads every value in the data
// namespace.
const StampLen = 16

// AppendStamp appends the stamp of an effect value to dst: the fencing
// token of the operation whose commit wrote it and the expiry, in unix
// seconds, of that operation's outcome (both big-endian uint64). The stamp
// links an effect to its outcome, so that a check can pair them while the
// outcome is retained, and can tell an effect whose outcome has expired
// from one whose outcome was never written.
func AppendStamp(dst []byte, token uint64, expires time.Time) []byte {
	dst = binary.BigEndian.AppendUint64(dst, token)
	return binary.BigEndian.AppendUint64(dst, ceilSeconds(expires))
}

// SplitStamp splits a data value into its stamp and the caller's value,
// which aliases v.
func SplitStamp(v []byte) (token uint64, expires time.Time, value []byte, err error) {
	if len(v) < StampLen {
		return 0, time.Time{}, nil, fmt.Errorf("%w: data value of %d bytes has no stamp", ErrCorrupt, len(v))
	}
	token = binary.BigEndian.Uint64(v)
	exp := binary.BigEndian.Uint64(v[8:])
	if token == 0 || exp > maxSeconds {
		return 0, time.Time{}, nil, fmt.Errorf("%w: bad stamp (token %d, expiry %d)", ErrCorrupt, token, exp)
	}
	if exp > 0 {
		expires = time.Unix(int64(exp), 0)
	}
	return token, expires, v[StampLen:], nil
}

// Sections of the pending index. A record is in at most one, ordered by
// its creation in unix seconds, which no write changes, so the key of a
// record's entry follows from the record, in memory or on disk.
const (
	// PendingOpen: a remote record in progress or an uncertain record.
	// Past its lease (as last renewed: a remote claim's renewals are
	// written, and do not move its entry) a remote record's holder is
	// presumed gone: the record is abandoned.
	PendingOpen byte = 'p'
	// PendingEscalated: an escalated record.
	PendingEscalated byte = 'x'
)

// PendingSection returns the section of the pending index that holds r;
// ok is false for a record the index does not hold (a completed record, a
// local one in progress).
func PendingSection(r *idemkv.Record) (section byte, ok bool) {
	switch {
	case r.State == idemkv.StateUncertain && r.Escalated:
		return PendingEscalated, true
	case r.State == idemkv.StateUncertain,
		r.State == idemkv.StateInProgress && r.Mode == idemkv.ModeRemote:
		return PendingOpen, true
	}
	return 0, false
}

// AppendPendingPrefix appends the prefix of a section of the pending index.
func AppendPendingPrefix(dst []byte, section byte) []byte {
	return append(dst, NSPending, section)
}

// AppendPendingKey appends the pending-index key of r, whose record key
// (AppendKey) is recordKey: the section's prefix, the record's creation in
// unix seconds (big-endian uint64), then the record key without its
// namespace byte. It appends nothing if the index does not hold r.
func AppendPendingKey(dst []byte, r *idemkv.Record, recordKey []byte) []byte {
	section, ok := PendingSection(r)
	if !ok {
		return dst
	}
	dst = AppendPendingPrefix(dst, section)
	dst = binary.BigEndian.AppendUint64(dst, floorSeconds(r.Created))
	return append(dst, recordKey[1:]...)
}

// PendingUpdate returns the pending-index writes that go with replacing
// the record stored under record key k, prev (nil: none stored), with
// next (nil: none): a key to delete and a key to set to value, each nil
// when there is none. An entry's value is its record's state in one byte.
func PendingUpdate(k []byte, prev, next *idemkv.Record) (del, set, value []byte) {
	var pk, nk []byte
	if prev != nil {
		pk = AppendPendingKey(nil, prev, k)
	}
	if next != nil {
		nk = AppendPendingKey(nil, next, k)
	}
	same := len(pk) > 0 && string(pk) == string(nk)
	if len(pk) > 0 && !same {
		del = pk
	}
	if len(nk) > 0 && (!same || prev.State != next.State) {
		set, value = nk, []byte{byte(next.State)}
	}
	return del, set, value
}

// PendingPrefixLen is the length of a pending key before its record key.
const PendingPrefixLen = 2 + 8

// SplitPendingKey splits a pending-index key into its section, the
// record's creation in unix seconds and the record key it stands for (a
// new slice).
func SplitPendingKey(k []byte) (section byte, created uint64, recordKey []byte, err error) {
	if len(k) <= PendingPrefixLen || k[0] != NSPending {
		return 0, 0, nil, ErrBadKey
	}
	switch section = k[1]; section {
	case PendingOpen, PendingEscalated:
	default:
		return 0, 0, nil, ErrBadKey
	}
	created = binary.BigEndian.Uint64(k[2:])
	recordKey = append([]byte{NSRecord}, k[PendingPrefixLen:]...)
	return section, created, recordKey, nil
}
