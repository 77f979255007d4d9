package engine

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/stretchr/testify/require"
)

// scanAll pages through req in pages of one record, calling between(i)
// after the i-th page, and returns the keys met, in order.
func scanAll(t *testing.T, e *Engine, req idemkv.ScanRequest, between func(page int)) []string {
	t.Helper()
	req.Limit = 1
	var keys []string
	for page := 0; ; page++ {
		require.Less(t, page, 100, "the scan does not end")
		p, err := e.Scan(ctx, req)
		require.NoError(t, err)
		for _, r := range p.Records {
			keys = append(keys, r.ID.Key)
		}
		if p.Next == "" {
			return keys
		}
		req.After = p.Next
		if between != nil {
			between(page)
		}
	}
}

// TestScanMeetsARecordOnceAsItSettles: a record that completes, in any
// retention class, after the scan passed it is not met again in its
// bucket, and one that completes before the scan reaches it is met there.
func TestScanMeetsARecordOnceAsItSettles(t *testing.T) {
	v := newSweepEnv(t, nil)
	classes := []string{"", "short", "money"}
	var leases []idemkv.Lease
	for i := range 6 {
		c, err := v.e.Claim(ctx, idemkv.ClaimRequest{ID: id(fmt.Sprintf("k%d", i)), Fingerprint: []byte{1},
			Mode: idemkv.ModeRemote, Retention: classes[i%3]})
		require.NoError(t, err)
		leases = append(leases, c.Lease)
	}
	v.completeIn("done", "money", []byte{1}, 201)
	keys := scanAll(t, v.e, idemkv.ScanRequest{}, func(page int) {
		// After the first page, complete k0 (passed) and k5 (ahead).
		if page == 0 {
			for _, i := range []int{0, 5} {
				require.NoError(t, v.e.Complete(ctx, leases[i], idemkv.Result{Status: 200}, nil))
			}
		}
		v.clock.Advance(time.Second)
	})
	require.Equal(t, []string{"done", "k0", "k1", "k2", "k3", "k4", "k5"}, keys, "each once, in key order")

	// State filters read only their side.
	require.Equal(t, []string{"done", "k0", "k5"}, scanAll(t, v.e, idemkv.ScanRequest{State: idemkv.StateCompleted}, nil))
	require.Equal(t, []string{"k1", "k2", "k3", "k4"}, scanAll(t, v.e, idemkv.ScanRequest{State: idemkv.StateInProgress}, nil))
	// Age: created before a time.
	require.Empty(t, scanAll(t, v.e, idemkv.ScanRequest{CreatedBefore: t0}, nil))
	require.Len(t, scanAll(t, v.e, idemkv.ScanRequest{CreatedBefore: v.clock.Now()}, nil), 7)

	// Past retention, a completed record is absent.
	v.clock.Advance(2 * time.Hour)
	keys = scanAll(t, v.e, idemkv.ScanRequest{State: idemkv.StateCompleted}, nil)
	require.True(t, slices.IsSorted(keys))
	require.NotContains(t, keys, "k2", "k2 is still in progress")

	for _, bad := range []string{"zz", "00", "0400", strings.Repeat("f", 10)} {
		_, err := v.e.Scan(ctx, idemkv.ScanRequest{After: bad})
		require.ErrorIs(t, err, idemkv.ErrInvalidArgument, bad)
	}
}
