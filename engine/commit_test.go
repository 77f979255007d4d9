package engine

import (
	"fmt"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/stretchr/testify/require"
)

// TestCommitterCombines: concurrent writers share commits, every write is
// in the store when its writer returns, and a lone writer commits alone.
func TestCommitterCombines(t *testing.T) {
	db, err := pebble.Open(t.TempDir(), &pebble.Options{})
	require.NoError(t, err)
	defer db.Close()
	c := newCommitter(db)

	b := db.NewBatch()
	require.NoError(t, b.Set([]byte("alone"), []byte("1"), nil))
	require.NoError(t, c.commit(b))
	require.NoError(t, b.Close())
	require.EqualValues(t, 1, c.groups.Load())

	const writers, each = 32, 50
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				k := []byte(fmt.Sprintf("w%02d-%03d", w, i))
				b := db.NewBatch()
				_ = b.Set(k, k, nil)
				if err := c.commit(b); err != nil {
					t.Error(err)
				}
				_ = b.Close()
				// Durable and visible once commit returns.
				v, closer, err := db.Get(k)
				if err != nil {
					t.Errorf("%s missing after commit: %v", k, err)
					continue
				}
				if string(v) != string(k) {
					t.Errorf("%s = %q", k, v)
				}
				closer.Close()
			}
		})
	}
	wg.Wait()
	require.EqualValues(t, 1+writers*each, c.writes.Load())
	require.Less(t, c.groups.Load(), int64(1+writers*each), "concurrent writers should share commits")
	t.Logf("%d writes in %d commits", c.writes.Load(), c.groups.Load())
}

// TestCommitterSplitsLargeGroups: a group stops taking members at
// maxGroupBytes, and an oversized batch still commits.
func TestCommitterSplitsLargeGroups(t *testing.T) {
	db, err := pebble.Open(t.TempDir(), &pebble.Options{})
	require.NoError(t, err)
	defer db.Close()
	c := newCommitter(db)
	big := make([]byte, maxGroupBytes)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			b := db.NewBatch()
			_ = b.Set([]byte{byte(i)}, big, nil)
			require.NoError(t, c.commit(b))
			_ = b.Close()
		})
	}
	wg.Wait()
	require.EqualValues(t, 4, c.groups.Load(), "each oversized batch commits in a group of its own")
}
