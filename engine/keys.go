package engine

import (
	"errors"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine/internal/record"
)

// The key layout is package record's (internal/record/keys.go): unsettled
// records, completed records in their expiry buckets, caller effects and
// metadata live in separate one-byte namespaces.
var (
	nsMeta    = record.NSMeta
	nsRecord  = record.NSRecord
	nsData    = record.NSData
	nsExpiry  = record.NSExpiry
	nsPending = record.NSPending
	epochKey  = record.EpochKey
	clockKey  = record.ClockKey
	layoutKey = record.LayoutKey
	secretKey = record.SecretKey
)

// ErrLayout is returned by Open for a store written in a layout this
// engine does not read: one from an earlier version (there is no migration
// before 1.0) or a later one.
var ErrLayout = errors.New("idemkv: unsupported store layout")

func appendRecordKey(dst []byte, id idemkv.ID) []byte { return record.AppendKey(dst, id) }

func decodeRecordKey(k []byte) (idemkv.ID, error) { return record.DecodeKey(k) }

func dataKey(key []byte) []byte { return record.DataKey(key) }
