package day

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/stretchr/testify/require"
)

// A day streams in the engine's order, with the shape asked for: every
// completed record live at Now and created within the retention window.
func TestRecordsComeInStoreOrder(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 30, 17, 0, time.UTC)
	s := shape{Records: 50000, Now: now, Retention: 24 * time.Hour, Tenants: 3, Unsettled: 0.001, Seed: 7}
	opts := &engine.Options{Retention: s.Retention}
	var prev []byte
	var n, unsettled int64
	keys := map[string]bool{}
	for rec := range Records(s) {
		k := engine.SortKey(opts, &rec)
		require.Equal(t, 1, bytes.Compare(k, prev), "record %d out of order", n)
		prev = k
		require.False(t, keys[rec.ID.Tenant+rec.ID.Key])
		keys[rec.ID.Tenant+rec.ID.Key] = true
		if rec.State == idemkv.StateCompleted {
			require.True(t, rec.Expires.After(now), "live at Now")
			require.False(t, rec.Created.Before(now.Add(-s.Retention)))
		} else {
			unsettled++
		}
		require.Len(t, rec.ID.Key, 36)
		require.Equal(t, byte('4'), rec.ID.Key[14], "version 4")
		n++
	}
	require.EqualValues(t, s.Records, n)
	require.EqualValues(t, 50, unsettled)
}

var ctx = context.Background()
