package workloads

import (
	"encoding/binary"
	"strings"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// ioCounts are the durability-relevant calls a store made on its files,
// counted by the vfs.FS wrapper the harness opens every store with.
type ioCounts struct {
	// Syncs are calls that make data durable: File.Sync, File.SyncData,
	// and File.SyncTo when it reports a full sync. Directory syncs count.
	Syncs int64
	// WALSyncs are the Syncs on write-ahead log files (*.log).
	WALSyncs int64
	// WALRecords is the number of records appended to write-ahead logs: one
	// per committed Pebble batch. Both targets commit every batch with
	// pebble.Sync, so this is their number of synced batches.
	WALRecords int64
	// WALBytes is the number of bytes written to write-ahead logs.
	WALBytes int64
}

// sub returns c - d.
func (c ioCounts) sub(d ioCounts) ioCounts {
	return ioCounts{
		Syncs: c.Syncs - d.Syncs, WALSyncs: c.WALSyncs - d.WALSyncs,
		WALRecords: c.WALRecords - d.WALRecords, WALBytes: c.WALBytes - d.WALBytes,
	}
}

// countingFS wraps a vfs.FS and counts syncs and WAL records on the files
// it opens. It is safe for concurrent use.
type countingFS struct {
	vfs.FS
	syncs, walSyncs, walRecords, walBytes atomic.Int64
}

var _ vfs.FS = (*countingFS)(nil)

func newCountingFS(fs vfs.FS) *countingFS { return &countingFS{FS: fs} }

// Counts returns the totals since the filesystem was wrapped.
func (fs *countingFS) Counts() ioCounts {
	return ioCounts{
		Syncs: fs.syncs.Load(), WALSyncs: fs.walSyncs.Load(),
		WALRecords: fs.walRecords.Load(), WALBytes: fs.walBytes.Load(),
	}
}

func (fs *countingFS) wrap(f vfs.File, name string) vfs.File {
	cf := &countingFile{File: f, fs: fs}
	if strings.HasSuffix(name, ".log") {
		cf.wal = &walParser{}
	}
	return cf
}

func (fs *countingFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, category)
	if err != nil {
		return nil, err
	}
	return fs.wrap(f, name), nil
}

func (fs *countingFS) Open(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.Open(name, opts...)
	if err != nil {
		return nil, err
	}
	return fs.wrap(f, name), nil
}

func (fs *countingFS) OpenReadWrite(name string, category vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.OpenReadWrite(name, category, opts...)
	if err != nil {
		return nil, err
	}
	// Written at offsets, never appended as a log: not parsed.
	return &countingFile{File: f, fs: fs}, nil
}

func (fs *countingFS) OpenDir(name string) (vfs.File, error) {
	f, err := fs.FS.OpenDir(name)
	if err != nil {
		return nil, err
	}
	return &countingFile{File: f, fs: fs}, nil
}

func (fs *countingFS) ReuseForWrite(oldname, newname string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.ReuseForWrite(oldname, newname, category)
	if err != nil {
		return nil, err
	}
	// A recycled log is rewritten from offset 0.
	return fs.wrap(f, newname), nil
}

// Unwrap implements vfs.FS.
func (fs *countingFS) Unwrap() vfs.FS { return fs.FS }

// countingFile counts the syncs on one file and, for a WAL, the records
// written to it.
type countingFile struct {
	vfs.File
	fs  *countingFS
	wal *walParser // nil unless a WAL
}

func (f *countingFile) synced() {
	f.fs.syncs.Add(1)
	if f.wal != nil {
		f.fs.walSyncs.Add(1)
	}
}

func (f *countingFile) Write(p []byte) (int, error) {
	if f.wal != nil {
		// Parse before writing: vfs.File.Write may modify p.
		f.fs.walRecords.Add(f.wal.feed(p))
		f.fs.walBytes.Add(int64(len(p)))
	}
	return f.File.Write(p)
}

func (f *countingFile) Sync() error {
	f.synced()
	return f.File.Sync()
}

func (f *countingFile) SyncData() error {
	f.synced()
	return f.File.SyncData()
}

func (f *countingFile) SyncTo(length int64) (bool, error) {
	// A SyncTo that is not full only started write-back (Pebble issues
	// them every BytesPerSync): no durability, not counted.
	full, err := f.File.SyncTo(length)
	if full {
		f.synced()
	}
	return full, err
}

// walParser follows the chunk stream of a Pebble write-ahead log as it is
// appended, and counts records (see pebble's record package: 32 KiB
// blocks of chunks, each with a header of checksum (4), length (2), type
// (1) and, in the recyclable formats, log number (4) and sync offset (8);
// a block tail too short for a header is zero padding). A record is a
// chunk of type full or first. Pebble's log writer only appends, so the
// bytes written are the stream in order.
type walParser struct {
	off    int64 // offset in the file of the next byte fed
	skip   int64 // payload or padding bytes still to skip
	hdr    []byte
	hdrLen int // header size of this file's chunk format, once known
	broken bool
}

const walBlockSize = 32 << 10

// feed consumes p and returns the number of records that started in it.
func (w *walParser) feed(p []byte) int64 {
	var n int64
	for !w.broken {
		if len(w.hdr) >= 7 {
			need := chunkHeaderLen(w.hdr[6])
			if need == 0 {
				w.broken = true // not a chunk stream this parser knows
				break
			}
			if len(w.hdr) == need {
				typ := w.hdr[6]
				size := int64(binary.LittleEndian.Uint16(w.hdr[4:6]))
				w.hdrLen, w.hdr = need, w.hdr[:0]
				// Full and first chunks start a record; a zero-length full
				// chunk is the end-of-log trailer, not a batch.
				if pos := (typ - 1) % 4; pos == 0 && size > 0 || pos == 1 {
					n++
				}
				w.skip = size
				continue
			}
		}
		if len(p) == 0 {
			break
		}
		if w.skip > 0 {
			k := min(w.skip, int64(len(p)))
			w.skip -= k
			w.off += k
			p = p[k:]
			continue
		}
		if left := walBlockSize - w.off%walBlockSize; len(w.hdr) == 0 && w.hdrLen > 0 && left < int64(w.hdrLen) {
			w.skip = left // zero padding at the end of the block
			continue
		}
		want := 7
		if len(w.hdr) >= 7 {
			want = chunkHeaderLen(w.hdr[6])
		}
		k := min(want-len(w.hdr), len(p))
		w.hdr = append(w.hdr, p[:k]...)
		w.off += int64(k)
		p = p[k:]
	}
	return n
}

// chunkHeaderLen returns the header length of a chunk of type typ, or 0 for
// an unknown type.
func chunkHeaderLen(typ byte) int {
	switch {
	case typ >= 1 && typ <= 4:
		return 7
	case typ >= 5 && typ <= 8:
		return 11
	case typ >= 9 && typ <= 12:
		return 19
	}
	return 0
}
