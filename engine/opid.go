package engine

import (
	"fmt"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine/internal/record"
)

// A remote record stores its operation id only when the id is not the one
// derived from its ID and fingerprint at generation 0 (internal/record,
// layout 6): nearly every remote record has the derived one, and at the
// guide's 432 M records its 16 bytes are a fifth of the store. Every
// record the engine writes passes through encodeRecord, and every record
// whose operation id anyone may read through decodeRecord, so the rest of
// the engine sees whole ids. Census-like scans (Check, Stats, the pending
// index, the sweeper) decode with record.Decode: they read no operation
// id, and a derivation would cost each record a MAC.

// encodeRecord appends the encoding of rec, the record stored under record
// key k, to dst, leaving out an operation id that decodeRecord derives.
func (e *Engine) encodeRecord(dst, k []byte, rec *idemkv.Record) []byte {
	if rec.Mode == idemkv.ModeRemote && !rec.OperationID.IsZero() && e.secret != nil {
		if op, err := e.derivedOperationID(k, rec); err == nil && op == rec.OperationID {
			r := *rec
			r.OperationID = idemkv.OperationID{}
			return record.Encode(dst, &r)
		}
	}
	return record.Encode(dst, rec)
}

// decodeRecord decodes v, the value of the record stored under record key
// k, with its operation id.
func (e *Engine) decodeRecord(k, v []byte) (idemkv.Record, error) {
	rec, err := record.Decode(v)
	if err != nil || rec.Mode != idemkv.ModeRemote || !rec.OperationID.IsZero() {
		return rec, err
	}
	if e.secret == nil {
		return idemkv.Record{}, fmt.Errorf("%w: a remote record without an operation id in a store without a secret", record.ErrCorrupt)
	}
	rec.OperationID, err = e.derivedOperationID(k, &rec)
	if err != nil {
		return idemkv.Record{}, err
	}
	return rec, nil
}

// derivedOperationID returns the operation id derived for rec, stored
// under record key k, at generation 0.
func (e *Engine) derivedOperationID(k []byte, rec *idemkv.Record) (idemkv.OperationID, error) {
	id, err := decodeRecordKey(k)
	if err != nil {
		return idemkv.OperationID{}, err
	}
	return e.opIDs.Derive(id, rec.Fingerprint, 0), nil
}
