package engine

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"

	"github.com/bits-and-blooms/bloom/v3"
	"github.com/cespare/xxhash/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// A saved claim filter spares a restart the build's scan of every record
// key (minutes at hundreds of millions of records).
//
// Close, once no write can begin, writes the filters to filterFile, and
// the next Open reads them back instead of scanning. A filter is only
// ever a superset of the keys stored when it was saved, so what makes a
// saved one safe to use is that nothing was written since. The file is
// stamped with the epoch of the Open that saved it, and every read-write
// Open, of any version of the engine, durably advances the store's epoch
// before it writes anything (layout.go). So a file is current only if the
// store's epoch is still the one stamped on it: any Open since (one that
// crashed, one that ran without a filter, an older engine) has advanced
// it. The file also names the store (a hash of its secret), and ends with
// a checksum; a file that fails any test is ignored, and the filter is
// built by the scan as before. Open removes the file once it has read
// it, so a crash later in this Open's life can leave only a stale file.
//
// Layout (big-endian): the header, then for each stripe its filter's
// words, then the xxhash64 of everything before it.
const (
	filterFile    = "idemkv-claimfilter"
	filterMagic   = "IKVCFv01"
	filterHdrSize = 8 + 8*8
)

// filterHeader is what a saved filter says about itself.
type filterHeader struct {
	epoch      uint64 // of the Open that saved it
	store      uint64 // xxhash64 of the store's secret
	bitsPerKey uint64
	hashes     uint64
	stripes    uint64
	capacity   uint64 // keys the filter is sized for
	stored     uint64 // keys its last build found
	adds       uint64 // keys added since that build
}

// errFilterStale reports a saved filter that may not hold every stored
// key, or that this engine cannot use: Open builds the filter by scanning.
var errFilterStale = errors.New("saved claim filter not usable")

// testHookFilterSave, if set, is called by saveClaimFilter with the open
// temporary file after it has written n bytes of it, and may fail the
// save (tests crash there).
var testHookFilterSave func(n int64) error

// saveClaimFilter writes the stripes' filters to filterFile, if there are
// filters and the engine has not failed.
//
// REQUIRES: no write can begin or is in flight (Close, after the gate).
func (e *Engine) saveClaimFilter() error {
	f := &e.filter
	if f.bitsPerKey == 0 || f.builds.Load() == 0 || e.gate.err() != nil {
		return nil
	}
	capacity := f.capacity.Load()
	words := int((filterBits(capacity, len(e.table.stripes), f.bitsPerKey) + 63) / 64)
	for i := range e.table.stripes {
		if bf := e.table.stripes[i].mu.filter; bf == nil || len(bf.BitSet().Words()) != words {
			return nil
		}
	}
	fs := e.opts.FS
	tmp := filepath.Join(e.dir, filterFile+".tmp")
	file, err := fs.Create(tmp, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	ok := false
	defer func() {
		if !ok {
			_ = file.Close()
			_ = fs.Remove(tmp)
		}
	}()
	h := filterHeader{
		epoch: e.epoch, store: xxhash.Sum64(e.secret),
		bitsPerKey: uint64(f.bitsPerKey), hashes: uint64(f.hashes), stripes: uint64(len(e.table.stripes)),
		capacity: uint64(capacity), stored: uint64(f.stored.Load()), adds: uint64(f.adds.Load()),
	}
	sum := xxhash.New()
	w := bufio.NewWriterSize(io.MultiWriter(file, sum), 1<<20)
	w.Write(h.append(nil))
	var n int64 = filterHdrSize
	buf := make([]byte, 0, 1<<16)
	for i := range e.table.stripes {
		for _, word := range e.table.stripes[i].mu.filter.BitSet().Words() {
			buf = binary.BigEndian.AppendUint64(buf, word)
			if len(buf) == cap(buf) {
				if _, err := w.Write(buf); err != nil {
					return err
				}
				n += int64(len(buf))
				buf = buf[:0]
				if testHookFilterSave != nil {
					if err := testHookFilterSave(n); err != nil {
						return err
					}
				}
			}
		}
	}
	if _, err := w.Write(buf); err != nil {
		return err
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if _, err := file.Write(binary.BigEndian.AppendUint64(nil, sum.Sum64())); err != nil {
		return err
	}
	if err := file.Sync(); err != nil {
		return err
	}
	if err := file.Close(); err != nil {
		return err
	}
	ok = true
	if err := fs.Rename(tmp, filepath.Join(e.dir, filterFile)); err != nil {
		_ = fs.Remove(tmp)
		return err
	}
	return syncDir(fs, e.dir)
}

// loadSavedFilter reads the filter Close saved, if it is current (see the
// top of this file), and installs it as every stripe's filter; it removes
// the file whatever it found. It returns errFilterStale, or an error
// reading the file, when the filter must be built by scanning.
//
// REQUIRES: Open, before any slot exists; e.filter's bitsPerKey and hashes set.
func (e *Engine) loadSavedFilter() error {
	fs := e.opts.FS
	name := filepath.Join(e.dir, filterFile)
	_ = fs.Remove(name + ".tmp") // a save that did not finish
	file, err := fs.Open(name)
	if err != nil {
		return fmt.Errorf("%w: %w", errFilterStale, err)
	}
	defer func() {
		_ = file.Close()
		if err := fs.Remove(name); err == nil {
			_ = syncDir(fs, e.dir)
		}
	}()
	info, err := file.Stat()
	if err != nil {
		return err
	}
	filters, h, err := e.readSavedFilter(file, info.Size())
	if err != nil {
		return err
	}
	for i := range e.table.stripes {
		st := &e.table.stripes[i]
		st.mu.Lock()
		st.mu.filter = filters[i]
		st.mu.Unlock()
	}
	f := &e.filter
	f.stored.Store(int64(h.stored))
	f.adds.Store(int64(h.adds))
	f.capacity.Store(int64(h.capacity))
	f.builds.Add(1)
	f.loaded.Store(true)
	f.setLimit(int64(h.capacity) - int64(h.stored))
	return nil
}

// readSavedFilter checks the header against the store and this engine's
// settings, and the size and checksum of the file, before it keeps the
// filters: a torn or foreign file is never used.
func (e *Engine) readSavedFilter(file vfs.File, size int64) ([]*bloom.BloomFilter, filterHeader, error) {
	sum := xxhash.New()
	// The checksum covers what is consumed, not what bufio reads ahead.
	r := io.TeeReader(bufio.NewReaderSize(file, 1<<20), sum)
	hdr := make([]byte, filterHdrSize)
	if _, err := io.ReadFull(r, hdr); err != nil {
		return nil, filterHeader{}, fmt.Errorf("%w: header: %w", errFilterStale, err)
	}
	h, err := parseFilterHeader(hdr)
	if err != nil {
		return nil, h, err
	}
	f := &e.filter
	switch {
	case h.epoch != e.epoch-1:
		return nil, h, fmt.Errorf("%w: saved at epoch %d, the store has been opened since (epoch %d)", errFilterStale, h.epoch, e.epoch-1)
	case h.store != xxhash.Sum64(e.secret):
		return nil, h, fmt.Errorf("%w: saved by another store", errFilterStale)
	case h.bitsPerKey != uint64(f.bitsPerKey) || h.hashes != uint64(f.hashes) || h.stripes != uint64(len(e.table.stripes)):
		return nil, h, fmt.Errorf("%w: saved with %d bits a key and %d shards", errFilterStale, h.bitsPerKey, h.stripes)
	case h.capacity > math.MaxInt64/64 || h.stored > h.capacity+h.adds:
		return nil, h, fmt.Errorf("%w: implausible header", errFilterStale)
	}
	m := filterBits(int64(h.capacity), len(e.table.stripes), f.bitsPerKey)
	words := (m + 63) / 64
	if want := filterHdrSize + int64(h.stripes)*int64(words)*8 + 8; size != want {
		return nil, h, fmt.Errorf("%w: %d bytes, want %d", errFilterStale, size, want)
	}
	filters := make([]*bloom.BloomFilter, h.stripes)
	buf := make([]byte, 8*1024)
	for i := range filters {
		data := make([]uint64, words)
		for j := 0; j < len(data); {
			chunk := buf[:min(len(buf), 8*(len(data)-j))]
			if _, err := io.ReadFull(r, chunk); err != nil {
				return nil, h, fmt.Errorf("%w: %w", errFilterStale, err)
			}
			for ; len(chunk) > 0; chunk = chunk[8:] {
				data[j] = binary.BigEndian.Uint64(chunk)
				j++
			}
		}
		filters[i] = bloom.FromWithM(data, m, f.hashes)
	}
	want := sum.Sum64()
	var trailer [8]byte
	if _, err := io.ReadFull(r, trailer[:]); err != nil {
		return nil, h, fmt.Errorf("%w: checksum: %w", errFilterStale, err)
	}
	if binary.BigEndian.Uint64(trailer[:]) != want {
		return nil, h, fmt.Errorf("%w: checksum mismatch", errFilterStale)
	}
	return filters, h, nil
}

func (h filterHeader) append(b []byte) []byte {
	b = append(b, filterMagic...)
	for _, v := range []uint64{h.epoch, h.store, h.bitsPerKey, h.hashes, h.stripes, h.capacity, h.stored, h.adds} {
		b = binary.BigEndian.AppendUint64(b, v)
	}
	return b
}

func parseFilterHeader(b []byte) (filterHeader, error) {
	if string(b[:8]) != filterMagic {
		return filterHeader{}, fmt.Errorf("%w: not a saved claim filter", errFilterStale)
	}
	var v [8]uint64
	for i := range v {
		v[i] = binary.BigEndian.Uint64(b[8+8*i:])
	}
	return filterHeader{epoch: v[0], store: v[1], bitsPerKey: v[2], hashes: v[3], stripes: v[4],
		capacity: v[5], stored: v[6], adds: v[7]}, nil
}

// filterBits is the size in bits of each stripe's filter for a filter of
// capacity keys.
func filterBits(capacity int64, stripes, bitsPerKey int) uint {
	perStripe := max(1, uint(capacity)/uint(stripes))
	return perStripe * uint(bitsPerKey)
}

// syncDir makes a rename or removal in dir durable.
func syncDir(fs vfs.FS, dir string) error {
	d, err := fs.OpenDir(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	return errors.Join(err, d.Close())
}
