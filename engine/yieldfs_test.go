package engine

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2"
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

// flushAndCompact writes three rounds of records, flushing each
// (writeAndFlush), and compacts them. Every round spans the same keys, so
// that the compaction rewrites the tables rather than moving them.
func flushAndCompact(t testing.TB, v *env) {
	writeAndFlush(t, v)
	require.NoError(t, v.e.Compact(ctx))
}

func writeAndFlush(t testing.TB, v *env) {
	for round := range 3 {
		for i := range 200 {
			c := v.claim(id(fmt.Sprintf("k%d-%d", i, round)), fpA, idemkv.ModeLocal)
			require.NoError(t, v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, nil))
		}
		require.NoError(t, v.e.Flush())
	}
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
	po := v.opts.PebbleOptions()
	yfs, ok := po.FS.(*yieldFS)
	require.True(t, ok, "the default Pebble options wrap the filesystem")
	po.EventListener.WriteStallBegin(pebble.WriteStallBeginInfo{Reason: "test"})
	require.True(t, yfs.stalled.Load(), "Pebble's write stalls reach the wrapper")
	po.EventListener.WriteStallEnd()
	require.False(t, yfs.stalled.Load())

	flushAndCompact(t, v)

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
	fs := newYieldFS(vfs.NewMem())
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

// TestYieldOncePerIntervalAndNotWhileStalled: a background write yields
// once yieldInterval has passed since the file's last yield (or its
// creation), and never while Pebble stalls writes.
func TestYieldOncePerIntervalAndNotWhileStalled(t *testing.T) {
	var now int64
	yields := 0
	fs := newYieldFS(vfs.NewMem())
	fs.now = func() int64 { return now }
	fs.yield = func() { yields++ }
	f, err := fs.Create("000001.sst", "pebble-compaction")
	require.NoError(t, err)
	defer f.Close()
	write := func() {
		_, err := f.Write([]byte("block"))
		require.NoError(t, err)
	}

	write()
	require.Equal(t, 0, yields, "a new file has not written for an interval yet")
	now += int64(yieldInterval) - 1
	write()
	require.Equal(t, 0, yields)
	now++
	write()
	require.Equal(t, 1, yields)
	write()
	require.Equal(t, 1, yields, "once per interval")

	fs.stalled.Store(true)
	now += 5 * int64(yieldInterval)
	write()
	require.Equal(t, 1, yields, "no yield while writes are stalled")
	fs.stalled.Store(false)
	write()
	require.Equal(t, 2, yields)

	wal, err := fs.Create("000002.log", "pebble-wal")
	require.NoError(t, err)
	defer wal.Close()
	now += 5 * int64(yieldInterval)
	_, err = wal.Write([]byte("record"))
	require.NoError(t, err)
	require.Equal(t, 2, yields, "the WAL never yields")
}
