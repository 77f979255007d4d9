package engine

import (
	"fmt"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv"
	"github.com/stretchr/testify/require"
)

// TestMissesUseL6Filters checks that a claim of an absent key is answered
// by the bloom filter of an L6 sstable, where a steady-state store keeps
// nearly all its records, rather than by reading a data block. Pebble's
// DB.Get skips L6 filters, which the second half shows. The claim filter
// is off: this is the path of the claims it lets through.
func TestMissesUseL6Filters(t *testing.T) {
	v := newEnv(t)
	v.opts.ClaimFilterBitsPerKey = -1
	v.reopen()
	for i := range 2000 {
		c := v.claim(id(fmt.Sprintf("present-%05d", i)), fpA, idemkv.ModeLocal)
		require.NoError(t, v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, nil))
	}
	require.NoError(t, v.e.db.Flush())
	require.NoError(t, v.e.db.Compact(ctx, []byte{nsRecord}, []byte{nsRecord + 1}, false))
	m := v.e.db.Metrics()
	require.Positive(t, m.Levels[6].TablesCount, "records should have reached L6")
	for l := 0; l < 6; l++ {
		require.Zero(t, m.Levels[l].TablesCount, "level %d", l)
	}

	const misses = 200
	before := v.e.db.Metrics().Filter.Hits
	for i := range misses {
		c := v.claim(id(fmt.Sprintf("absent-%05d", i)), fpA, idemkv.ModeLocal)
		require.Equal(t, idemkv.Acquired, c.Outcome)
	}
	hits := v.e.db.Metrics().Filter.Hits - before
	// A 10-bit filter has about a 1% false-positive rate.
	require.GreaterOrEqual(t, hits, int64(misses*9/10), "claim misses must be answered by L6 bloom filters")

	// The premise: DB.Get does not consult them.
	before = v.e.db.Metrics().Filter.Hits
	for i := range misses {
		_, _, err := v.e.db.Get(appendRecordKey(nil, id(fmt.Sprintf("absent2-%05d", i))))
		require.ErrorIs(t, err, pebble.ErrNotFound)
	}
	require.Less(t, v.e.db.Metrics().Filter.Hits-before, int64(misses/10))
}
