package baseline

import (
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/record"
)

// The record key and value layouts are the engine's own (package
// internal/record), so both stores hold the same keys and values and bytes
// per key differ only through how they were written.

var (
	epochKey   = record.EpochKey
	errCorrupt = record.ErrCorrupt
)

func recordKey(id idemkv.ID) []byte { return record.AppendKey(nil, id) }

func dataKey(key []byte) []byte { return record.DataKey(key) }

func encode(dst []byte, r *idemkv.Record) []byte { return record.Encode(dst, r) }

func decode(b []byte) (idemkv.Record, error) { return record.Decode(b) }
