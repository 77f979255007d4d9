package engine

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// diskGuard tells whether the store's filesystem has less free space than
// Options.MinFreeDisk, so that claims stop starting new work before Pebble
// fails a write for lack of space (which ends the process). It looks at
// the filesystem at most once a second; between looks it answers from the
// last one.
type diskGuard struct {
	fs  vfs.FS
	dir string
	min int64 // negative: never low

	mu   sync.Mutex   // held by the one goroutine looking
	next atomic.Int64 // UnixNano of the next look
	low  atomic.Bool
}

// lowAt reports whether free space was below the minimum at the last look,
// looking again first if a second has passed by now.
func (d *diskGuard) lowAt(now time.Time) bool {
	if d.min < 0 {
		return false
	}
	if now.UnixNano() < d.next.Load() || !d.mu.TryLock() {
		return d.low.Load()
	}
	defer d.mu.Unlock()
	if u, err := d.fs.GetDiskUsage(d.dir); err == nil {
		d.low.Store(u.AvailBytes < uint64(d.min))
	}
	d.next.Store(now.Add(time.Second).UnixNano())
	return d.low.Load()
}
