package engine

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/idemkv/idemkv"
)

// The Pebble key space is split by a one-byte namespace prefix. Engine
// records and caller effects can never collide because every key an Effects
// writer produces starts with nsData, and only the engine writes the others.
//
//	0x01 meta    engine metadata (the epoch)
//	0x02 record  uvarint(len tenant) tenant uvarint(len endpoint) endpoint key
//	0x03 data    caller effects: 0x03 + the caller's key
//
// Reserved for later capabilities: 0x04 outbox, 0x05 expiry index.
//
// The record key spells out the whole scope rather than a hash of it, so
// that two tenants can never share a record, even adversarially. Pebble's
// block-level prefix compression makes the repeated scope cheap on disk.
const (
	nsMeta   byte = 0x01
	nsRecord byte = 0x02
	nsData   byte = 0x03
)

var epochKey = []byte{nsMeta, 'e', 'p', 'o', 'c', 'h'}

// MaxEffectKeyLen bounds a key written through Effects, in bytes.
const MaxEffectKeyLen = 1024

// appendRecordKey appends id's record key to dst.
func appendRecordKey(dst []byte, id idemkv.ID) []byte {
	dst = append(dst, nsRecord)
	dst = binary.AppendUvarint(dst, uint64(len(id.Tenant)))
	dst = append(dst, id.Tenant...)
	dst = binary.AppendUvarint(dst, uint64(len(id.Endpoint)))
	dst = append(dst, id.Endpoint...)
	return append(dst, id.Key...)
}

var errBadRecordKey = errors.New("engine: malformed record key")

// decodeRecordKey is the inverse of appendRecordKey.
func decodeRecordKey(k []byte) (idemkv.ID, error) {
	if len(k) == 0 || k[0] != nsRecord {
		return idemkv.ID{}, errBadRecordKey
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
		return idemkv.ID{}, errBadRecordKey
	}
	return idemkv.ID{Tenant: tenant, Endpoint: endpoint, Key: string(k)}, nil
}

func dataKey(key []byte) []byte {
	k := make([]byte, 0, 1+len(key))
	return append(append(k, nsData), key...)
}

func validateEffectKey(key []byte) error {
	if len(key) == 0 {
		return fmt.Errorf("%w: empty effect key", idemkv.ErrInvalidArgument)
	}
	if len(key) > MaxEffectKeyLen {
		return fmt.Errorf("%w: effect key is %d bytes, limit %d", idemkv.ErrInvalidArgument, len(key), MaxEffectKeyLen)
	}
	return nil
}
