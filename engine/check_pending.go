package engine

import (
	"time"

	"encoding/hex"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine/internal/record"
)

// Check pairs the pending index with the unsettled records: the records
// sort before the index, so the first pass notes the entry each record
// calls for, crosses them off as it reads the index, and reports what is
// left. It holds one key per unsettled record, and its record key, which
// no completed record that has not expired may share (liveTwice).

// expectPending notes the pending-index entry that rec, stored under
// record key k, calls for, and that k holds an unsettled record.
func (pc *pairCheck) expectPending(k []byte, rec *idemkv.Record) {
	if pc.share > 0 {
		return
	}
	if pc.unsettled == nil {
		pc.unsettled = make(map[string]time.Time)
	}
	pc.unsettled[string(k)] = rec.Created
	pk := record.AppendPendingKey(nil, rec, k)
	if len(pk) == 0 {
		return
	}
	if pc.pending == nil {
		pc.pending = make(map[string]byte)
	}
	pc.pending[string(pk)] = byte(rec.State)
}

// checkPending checks one entry of the pending index.
func (pc *pairCheck) checkPending(k, v []byte) {
	pc.r.Pending++
	name := hex.EncodeToString(k)
	_, _, rk, err := record.SplitPendingKey(k)
	if err != nil {
		pc.r.add(name, "pending-index key does not decode: %v", err)
		return
	}
	if id, err := decodeRecordKey(rk); err == nil {
		name = "pending " + recordName(id)
	}
	want, ok := pc.pending[string(k)]
	switch {
	case !ok:
		pc.r.add(name, "pending-index entry for no unsettled record in its state and section")
	case len(v) != 1 || v[0] != want:
		pc.r.add(name, "pending-index entry holds %x, want the record's state %d", v, want)
	}
	delete(pc.pending, string(k))
}

// missingPending reports the unsettled records the index lacks.
func (pc *pairCheck) missingPending() {
	for pk := range pc.pending {
		name := hex.EncodeToString([]byte(pk))
		if _, _, rk, err := record.SplitPendingKey([]byte(pk)); err == nil {
			if id, err := decodeRecordKey(rk); err == nil {
				name = recordName(id)
			}
		}
		pc.r.add(name, "unsettled record missing from the pending index")
	}
	pc.pending = nil
}

// liveTwice reports whether a completed record under record key rk, in an
// expiry bucket, that expires at expires, shares its key with an
// unsettled record created before then: lookups would answer with the
// unsettled one. (One created after may, until the sweeper deletes the
// completed one: a claim took the expired key over.) Check asks only of a
// record that has not expired by its time either: engine time may have
// gone back since the claim, and Load keeps the creation times it is
// given.
func (pc *pairCheck) liveTwice(rk []byte, expires time.Time) bool {
	created, ok := pc.unsettled[string(rk)]
	return ok && created.Before(expires)
}
