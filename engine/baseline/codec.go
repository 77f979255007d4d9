package baseline

import (
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine/internal/record"
)

// The record key and value layouts are the engine's own (package
// engine/internal/record), so both stores hold the same keys and values and bytes
// per key differ only through how they were written.

var (
	epochKey   = record.EpochKey
	secretKey  = record.SecretKey
	errCorrupt = record.ErrCorrupt
)

// secretLen is the length of the store's secret, as the engine's.
const secretLen = record.SecretLen

func recordKey(id idemkv.ID) []byte { return record.AppendKey(nil, id) }

func dataKey(key []byte) []byte { return record.DataKey(key) }

func encode(dst []byte, r *idemkv.Record) []byte { return record.Encode(dst, r) }

func decode(b []byte) (idemkv.Record, error) { return record.Decode(b) }

// marked is the uncertain mark (Record.Marked) of a record marked at now:
// now rounded up to the millisecond, as encode keeps it on an uncertain
// record (and drops it on any other), so that the record a call answers
// with equals the one read back.
func marked(now time.Time) time.Time { return record.Milliseconds(now) }

// putRecord adds to b the writes that replace k's record, prev (nil:
// none), with rec (nil: deletes it), pending index included.
func putRecord(b *pebble.Batch, k []byte, prev, rec *idemkv.Record) {
	del, set, value := record.PendingUpdate(k, prev, rec)
	if del != nil {
		_ = b.Delete(del, nil)
	}
	if set != nil {
		_ = b.Set(set, value, nil)
	}
	if rec == nil {
		_ = b.Delete(k, nil)
	} else {
		_ = b.Set(k, encode(nil, rec), nil)
	}
}
