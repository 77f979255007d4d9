package record

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/idemkv/idemkv"
)

// The Pebble key space is split by a one-byte namespace prefix. Engine
// records and caller effects can never collide because every key an
// Effects writer produces starts with NSData, and only the store writes the
// others.
//
//	0x01 meta    store metadata (the layout version, the epoch, the
//	             sweeper's position)
//	0x02 record  uvarint(len tenant) tenant uvarint(len endpoint) endpoint key
//	0x03 data    caller effects: 0x03 + the caller's key; the value is a
//	             stamp (see AppendStamp) and then the caller's value
//
// Reserved for later capabilities: 0x04 outbox.
//
// The record key spells out the whole scope rather than a hash of it, so
// that two tenants can never share a record, even adversarially. Pebble's
// block-level prefix compression makes the repeated scope cheap on disk.
const (
	NSMeta   byte = 0x01
	NSRecord byte = 0x02
	NSData   byte = 0x03
)

// EpochKey holds the store's epoch (a big-endian uint64).
var EpochKey = []byte{NSMeta, 'e', 'p', 'o', 'c', 'h'}

// LayoutKey holds the layout version of the store (a big-endian uint64):
// Layout for every store this code writes. A store without it is either
// empty or was written before the marker existed (layout 1: effect values
// without stamps).
var LayoutKey = []byte{NSMeta, 'l', 'a', 'y', 'o', 'u', 't'}

// Layout is the version of the key space and value formats described
// here and in record.go. Version 2 added the stamp on effect values.
const Layout = 2

// SweepKey holds the sweeper's position: the last record key of the pass
// in progress. Absent between passes.
var SweepKey = []byte{NSMeta, 's', 'w', 'e', 'e', 'p'}

// AppendKey appends id's record key to dst.
func AppendKey(dst []byte, id idemkv.ID) []byte {
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
