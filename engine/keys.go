package engine

import (
	"errors"
	"fmt"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/record"
)

// The key layout is package record's (internal/record/keys.go): unsettled
// records, completed records in their expiry buckets, caller effects and
// metadata live in separate one-byte namespaces.
var (
	nsMeta    = record.NSMeta
	nsRecord  = record.NSRecord
	nsData    = record.NSData
	nsExpiry  = record.NSExpiry
	epochKey  = record.EpochKey
	layoutKey = record.LayoutKey
)

// ErrLayout is returned by Open for a store written in a layout this
// engine does not read: one from an earlier version (there is no migration
// before 1.0) or a later one.
var ErrLayout = errors.New("idemkv: unsupported store layout")

// MaxEffectKeyLen bounds a key written through Effects, in bytes.
const MaxEffectKeyLen = 1024

func appendRecordKey(dst []byte, id idemkv.ID) []byte { return record.AppendKey(dst, id) }

func decodeRecordKey(k []byte) (idemkv.ID, error) { return record.DecodeKey(k) }

func dataKey(key []byte) []byte { return record.DataKey(key) }

func validateEffectKey(key []byte) error {
	if len(key) == 0 {
		return fmt.Errorf("%w: empty effect key", idemkv.ErrInvalidArgument)
	}
	if len(key) > MaxEffectKeyLen {
		return fmt.Errorf("%w: effect key is %d bytes, limit %d", idemkv.ErrInvalidArgument, len(key), MaxEffectKeyLen)
	}
	return nil
}
