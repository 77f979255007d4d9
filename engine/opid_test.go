package engine

import (
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine/internal/record"
)

// storedRecord returns the record stored for i as its value encodes it,
// wherever it is stored (under its record key or in an expiry bucket).
func storedRecord(t *testing.T, e *Engine, i idemkv.ID) (idemkv.Record, int) {
	t.Helper()
	it, err := e.db.NewIter(&pebble.IterOptions{LowerBound: recordStart})
	require.NoError(t, err)
	defer it.Close()
	for valid := it.First(); valid; valid = it.Next() {
		k := it.Key()
		if k[0] != nsRecord && k[0] != nsExpiry {
			continue
		}
		if got, err := storedRecordID(k); err != nil || got != i {
			continue
		}
		v, err := it.ValueAndErr()
		require.NoError(t, err)
		rec, err := record.Decode(v)
		require.NoError(t, err)
		return rec, len(v)
	}
	t.Fatalf("no record stored for %v", i)
	return idemkv.Record{}, 0
}

// TestDerivedOperationIDsAreNotStored: a remote record whose operation id
// is the one derived at generation 0 stores none, and every read gives
// the whole id: the claim's lease, Get, Scan, and a replay after a
// restart, when nothing is cached. A claim of a later generation stores
// its id. A resumable takeover of the first record, after a restart and
// with another generation, resumes generation 0's id, the one the
// downstream was sent, not its own.
func TestDerivedOperationIDsAreNotStored(t *testing.T) {
	v := newEnv(t)
	a, b := id("derived"), id("generation-1")
	derived := idemkv.DeriveOperationID(v.e.secret, a, fpA, 0)

	c, err := v.e.Claim(ctx, idemkv.ClaimRequest{ID: a, Fingerprint: fpA, Mode: idemkv.ModeRemote})
	require.NoError(t, err)
	require.Equal(t, derived, c.Lease.OperationID)
	raw, size := storedRecord(t, v.e, a)
	require.Zero(t, raw.OperationID, "the derived id is not stored")
	raw.OperationID = derived
	require.Equal(t, len(record.Encode(nil, &raw))-16, size)

	cb, err := v.e.Claim(ctx, idemkv.ClaimRequest{ID: b, Fingerprint: fpA, Mode: idemkv.ModeRemote, Generation: 1})
	require.NoError(t, err)
	gen1 := idemkv.DeriveOperationID(v.e.secret, b, fpA, 1)
	require.Equal(t, gen1, cb.Lease.OperationID)
	raw, _ = storedRecord(t, v.e, b)
	require.Equal(t, gen1, raw.OperationID, "another generation's id is stored")

	v.reopen()
	got, err := v.e.Get(ctx, a)
	require.NoError(t, err)
	require.Equal(t, derived, got.OperationID)
	v.clock.Advance(time.Minute) // past the lease
	c, err = v.e.Claim(ctx, idemkv.ClaimRequest{ID: a, Fingerprint: fpA, Mode: idemkv.ModeRemote, Resumable: true, Generation: 3})
	require.NoError(t, err)
	require.Equal(t, idemkv.Acquired, c.Outcome)
	require.Equal(t, uint32(2), c.Lease.Attempt)
	require.Equal(t, derived, c.Lease.OperationID, "a takeover resumes the id sent downstream")
	require.NoError(t, v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 201, Pointer: "charge/1"}, nil))
	raw, _ = storedRecord(t, v.e, a)
	require.Equal(t, idemkv.StateCompleted, raw.State)
	require.Zero(t, raw.OperationID)

	v.reopen()
	c, err = v.e.Claim(ctx, idemkv.ClaimRequest{ID: a, Fingerprint: fpA, Mode: idemkv.ModeRemote})
	require.NoError(t, err)
	require.Equal(t, idemkv.Replay, c.Outcome)
	require.Equal(t, derived, c.Record.OperationID)
	page, err := v.e.Scan(ctx, idemkv.ScanRequest{})
	require.NoError(t, err)
	ops := map[idemkv.ID]idemkv.OperationID{}
	for _, r := range page.Records {
		ops[r.ID] = r.OperationID
	}
	require.Equal(t, map[idemkv.ID]idemkv.OperationID{a: derived, b: gen1}, ops)
	v.requireSound()
}
