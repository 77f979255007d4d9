package engine

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/idemkv/idemkv"
	"github.com/stretchr/testify/require"
)

// categoryFS records the write category Pebble gives each file it creates.
type categoryFS struct {
	vfs.FS
	mu   sync.Mutex
	seen map[string]vfs.DiskWriteCategory // file extension → category
}

func (fs *categoryFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	fs.mu.Lock()
	fs.seen[filepath.Ext(name)+" "+string(category)] = category
	fs.mu.Unlock()
	return fs.FS.Create(name, category)
}

// TestBackgroundWritesYield: the sstables of flushes and compactions are
// created through yieldFS under the categories it wraps, and the WAL is
// not. A Pebble upgrade that renamed its categories would silently end
// the yield; this test would then fail.
func TestBackgroundWritesYield(t *testing.T) {
	rec := &categoryFS{FS: vfs.Default, seen: map[string]vfs.DiskWriteCategory{}}
	v := newEnv(t)
	require.NoError(t, v.e.Close())
	v.opts.FS = rec
	v.open()
	_, ok := v.opts.PebbleOptions().FS.(yieldFS)
	require.True(t, ok, "the default Pebble options wrap the filesystem")

	for round := range 3 {
		for i := range 200 {
			// Every round spans the same keys, so that the compaction
			// rewrites the tables rather than moving them.
			c := v.claim(id(fmt.Sprintf("k%d-%d", i, round)), fpA, idemkv.ModeLocal)
			require.NoError(t, v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, nil))
		}
		require.NoError(t, v.e.Flush())
	}
	require.NoError(t, v.e.Compact(ctx))

	var wal int
	for k, category := range rec.seen {
		switch {
		case strings.HasPrefix(k, ".sst "):
			require.True(t, yieldCategories[category], "sstables created as %q do not yield", category)
		case strings.HasPrefix(k, ".log "):
			wal++
			require.False(t, yieldCategories[category], "the WAL (%q) must not yield", category)
		}
	}
	require.Positive(t, wal)
	require.Contains(t, rec.seen, ".sst pebble-memtable-flush")
	require.Contains(t, rec.seen, ".sst pebble-compaction")

	// Each category the flushes and compactions used is wrapped.
	fs := yieldFS{vfs.NewMem()}
	for k, category := range rec.seen {
		f, err := fs.Create(strings.ReplaceAll(k, " ", "_"), category)
		require.NoError(t, err)
		_, isYield := f.(*yieldFile)
		require.Equal(t, strings.HasPrefix(k, ".sst "), isYield, k)
		require.NoError(t, f.Close())
	}

	// NoBackgroundYield leaves the filesystem as it is.
	o := v.opts
	o.NoBackgroundYield = true
	require.Same(t, rec, o.PebbleOptions().FS)
}
