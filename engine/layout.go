package engine

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv/engine/internal/record"
)

// Layout is the on-disk layout this engine writes: the version of its
// key space and value formats. A read-write Open migrates a store in
// layout 3, 4 or 5 to it in place; a read-only Open reads a store in
// layout 4 or 5 as it is (every value of those layouts is one this engine
// reads); every other layout is refused with ErrLayout
// (docs/operations.md, "Upgrades").
const Layout = record.Layout

// StoredLayout reports the layout of the store in dir without changing
// it: Layout, or an earlier layout that a read-write Open migrates. A
// store that no Open of this engine reads (layout 1, which had no marker,
// layout 2, or a later layout) is an ErrLayout. A store with neither
// records nor a marker is reported as 0: its first read-write Open marks
// it. A directory without a Pebble store is an error (Pebble leaves its
// LOCK file there). The store must not be open in another process; opts
// (nil: defaults) supplies the filesystem and Pebble's configuration
// (ConfigurePebble may set a pebble.Lock the caller holds), and ReadOnly
// is implied.
func StoredLayout(dir string, opts *Options) (uint64, error) {
	o := opts.EnsureDefaults()
	o.ReadOnly = true
	db, err := openPebble(dir, o.PebbleOptions())
	if err != nil {
		return 0, fmt.Errorf("engine: open %s: %w", dir, err)
	}
	l, err := storedLayout(db)
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, err
	}
	if _, err := layoutAction(l, false); err != nil {
		return l, err
	}
	return l, nil
}

// storedLayout reads db's layout marker. A store without one is in
// layout 1 if it holds records or effects (it predates the marker), and
// 0 if it is empty.
func storedLayout(db *pebble.DB) (uint64, error) {
	v, closer, err := db.Get(layoutKey)
	switch {
	case errors.Is(err, pebble.ErrNotFound):
		it, err := db.NewIter(&pebble.IterOptions{LowerBound: recordStart})
		if err != nil {
			return 0, fmt.Errorf("engine: read layout: %w", err)
		}
		empty := !it.First()
		if err := it.Close(); err != nil {
			return 0, fmt.Errorf("engine: read layout: %w", err)
		}
		if empty {
			return 0, nil
		}
		return layoutUnmarked, nil
	case err != nil:
		return 0, fmt.Errorf("engine: read layout: %w", err)
	}
	defer closer.Close()
	if len(v) != 8 {
		return 0, fmt.Errorf("engine: read layout: %w: %d bytes", record.ErrCorrupt, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

// layoutUnmarked is the layout of a store written before the layout
// marker: effects without stamps.
const layoutUnmarked = 1

// layoutAction says what an Open does with a store in layout l (0: an
// empty store): write the marker of record.Layout (a new store, or one it
// migrates), or refuse it. It refuses layout 1 (there is no migration
// from it), layout 3 read-only (it lacks the pending index, and a
// migration writes), and any layout other than 3, 4 and record.Layout. A
// read-only Open leaves a store in layout 4 as it is: it reads every
// layout-4 value, and the store just has no secret (it cannot claim).
func layoutAction(l uint64, readOnly bool) (write bool, err error) {
	switch {
	case l == 0:
		return true, nil
	case l == record.Layout:
		return false, nil
	case l == layoutUnmarked:
		return false, fmt.Errorf("%w: the store has no layout marker, so it was written in layout 1 (effects without stamps); this engine reads layout %d and has no migration from it", ErrLayout, record.Layout)
	case (l == layoutWithoutIndex || l == layoutWithoutSecret || l == layoutStoredIDs) && !readOnly:
		return true, nil
	case l == layoutWithoutSecret || l == layoutStoredIDs:
		return false, nil
	case l == layoutWithoutIndex:
		return false, fmt.Errorf("%w: the store is in layout %d, which a read-write Open migrates to layout %d; it cannot be migrated read-only", ErrLayout, l, record.Layout)
	default:
		return false, fmt.Errorf("%w: the store is in layout %d; this engine reads layout %d", ErrLayout, l, record.Layout)
	}
}

// Earlier layouts a read-write Open migrates.
const (
	// layoutWithoutIndex is the layout before the pending index (and the
	// codec's extension byte, which older records simply do not use). Its
	// migration writes the index.
	layoutWithoutIndex = 3
	// layoutWithoutSecret is the layout before the store's secret and the
	// codec's uncertain mark. Its records are all valid in layout 5; its
	// migration writes the secret, as every read-write Open of a store
	// without one does.
	layoutWithoutSecret = 4
	// layoutStoredIDs is the layout before a remote record's derived
	// operation id was left out of its value: its records, which all
	// store their ids, are all valid in layout 6, and its migration
	// writes only the marker.
	layoutStoredIDs = 5
)

// advanceEpoch checks the store's layout, reads the stored epoch and the
// store's secret and, unless read-only, durably stores in one batch the
// epoch's successor, the secret if the store has none yet (a new store,
// or one from before the secret), and the layout marker of a new store
// or of a migrated one with what the migration adds, so no token of this
// process's life can equal or precede one handed out before.
func (e *Engine) advanceEpoch() error {
	l, err := storedLayout(e.db)
	if err != nil {
		return err
	}
	writeLayout, err := layoutAction(l, e.opts.ReadOnly)
	if err != nil {
		return err
	}
	e.layout = l
	epoch, err := readEpoch(e.db)
	if err != nil {
		return err
	}
	e.secret, err = readSecret(e.db)
	if err != nil {
		return err
	}
	if e.secret == nil && l > layoutWithoutSecret && !e.opts.ReadOnly {
		// Written with the marker, so it was lost: a new one would give
		// every request that comes again another downstream identity.
		return fmt.Errorf("engine: %w: the store is in layout %d but has no secret", record.ErrCorrupt, l)
	}
	if e.opts.ReadOnly {
		e.epoch = epoch
		return nil
	}
	if epoch >= maxEpoch {
		return fmt.Errorf("engine: epoch space exhausted (%d opens)", epoch)
	}
	epoch++
	b := e.db.NewBatch()
	defer b.Close()
	_ = b.Set(epochKey, binary.BigEndian.AppendUint64(nil, epoch), nil)
	var migrated []string
	if l == layoutWithoutIndex {
		n, err := e.indexLayout3(b)
		if err != nil {
			return fmt.Errorf("engine: migrate layout %d: %w", layoutWithoutIndex, err)
		}
		migrated = append(migrated, fmt.Sprintf("%d unsettled records indexed", n))
	}
	var secret []byte
	if e.secret == nil {
		secret = make([]byte, record.SecretLen)
		if _, err := io.ReadFull(e.opts.Rand, secret); err != nil {
			return fmt.Errorf("engine: draw the store's secret: %w", err)
		}
		_ = b.Set(secretKey, secret, nil)
		migrated = append(migrated, "a secret drawn")
	}
	if l == layoutStoredIDs {
		migrated = append(migrated, "derived operation ids left out of the records written from now on")
	}
	if writeLayout {
		_ = b.Set(layoutKey, binary.BigEndian.AppendUint64(nil, record.Layout), nil)
	}
	if err := commitBatch(b, pebble.Sync); err != nil {
		return fmt.Errorf("engine: write epoch: %w", err)
	}
	if l != 0 && l != record.Layout {
		e.opts.Logger.Infof("idemkv: store migrated from layout %d to %d: %s", l, record.Layout, strings.Join(migrated, ", "))
	}
	e.epoch, e.layout = epoch, record.Layout
	if secret != nil {
		e.secret = secret
	}
	return nil
}

// readEpoch reads the stored epoch: 0 if there is none.
func readEpoch(db *pebble.DB) (uint64, error) {
	v, closer, err := db.Get(epochKey)
	switch {
	case errors.Is(err, pebble.ErrNotFound):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("engine: read epoch: %w", err)
	}
	defer closer.Close()
	if len(v) != 8 {
		return 0, fmt.Errorf("engine: read epoch: %w: %d bytes", record.ErrCorrupt, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

// readSecret reads the store's secret: nil if it has none.
func readSecret(db *pebble.DB) ([]byte, error) {
	v, closer, err := db.Get(secretKey)
	switch {
	case errors.Is(err, pebble.ErrNotFound):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("engine: read the store's secret: %w", err)
	}
	defer closer.Close()
	if len(v) != record.SecretLen {
		return nil, fmt.Errorf("engine: read the store's secret: %w: %d bytes, want %d", record.ErrCorrupt, len(v), record.SecretLen)
	}
	return bytes.Clone(v), nil
}
