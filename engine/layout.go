package engine

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv/internal/record"
)

// Layout is the on-disk layout this engine writes: the version of its
// key space and value formats. A read-write Open migrates a store in
// layout 3 to it in place; it refuses every other layout with ErrLayout
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
	if _, _, err := layoutAction(l, false); err != nil {
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

// checkLayout reports whether the store is in the layout this engine
// writes (record.Layout), and whether the marker must be written: a new,
// empty store gets it with its first epoch, and a store in layout 3 gets
// it with the pending index that layout lacked (migrate).
func (e *Engine) checkLayout() (write, migrate bool, err error) {
	l, err := storedLayout(e.db)
	if err != nil {
		return false, false, err
	}
	return layoutAction(l, e.opts.ReadOnly)
}

// layoutAction says what an Open does with a store in layout l (0: an
// empty store): write the marker (a new store, or a migrated one),
// migrate from layout 3, or refuse it. It refuses layout 1 (there is no
// migration from it), layout 3 read-only (a migration writes), and any
// other layout.
func layoutAction(l uint64, readOnly bool) (write, migrate bool, err error) {
	switch {
	case l == 0:
		return true, false, nil
	case l == record.Layout:
		return false, false, nil
	case l == layoutUnmarked:
		return false, false, fmt.Errorf("%w: the store has no layout marker, so it was written in layout 1 (effects without stamps); this engine reads layout %d and has no migration from it", ErrLayout, record.Layout)
	case l == layoutWithoutIndex && !readOnly:
		return true, true, nil
	case l == layoutWithoutIndex:
		return false, false, fmt.Errorf("%w: the store is in layout %d, which a read-write Open migrates to layout %d; it cannot be migrated read-only", ErrLayout, l, record.Layout)
	default:
		return false, false, fmt.Errorf("%w: the store is in layout %d; this engine reads layout %d", ErrLayout, l, record.Layout)
	}
}

// layoutWithoutIndex is the layout before the pending index (and the
// codec's extension byte, which older records simply do not use).
const layoutWithoutIndex = 3

// advanceEpoch checks the store's layout, reads the stored epoch and,
// unless read-only, durably stores its successor (and the layout marker
// of a new store, or of a migrated one with what the migration adds), so no token of this process's life can equal or
// precede one handed out before.
func (e *Engine) advanceEpoch() error {
	writeLayout, migrate, err := e.checkLayout()
	if err != nil {
		return err
	}
	v, closer, err := e.db.Get(epochKey)
	var epoch uint64
	switch {
	case errors.Is(err, pebble.ErrNotFound):
	case err != nil:
		return fmt.Errorf("engine: read epoch: %w", err)
	default:
		if len(v) != 8 {
			closer.Close()
			return fmt.Errorf("engine: read epoch: %w: %d bytes", record.ErrCorrupt, len(v))
		}
		epoch = binary.BigEndian.Uint64(v)
		closer.Close()
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
	_ = b.Set(epochKey, binary.BigEndian.AppendUint64(nil, epoch), nil)
	if migrate {
		n, err := e.indexLayout3(b)
		if err != nil {
			_ = b.Close()
			return fmt.Errorf("engine: migrate layout %d: %w", layoutWithoutIndex, err)
		}
		e.opts.Logger.Infof("idemkv: store migrated from layout %d to %d: %d unsettled records indexed", layoutWithoutIndex, record.Layout, n)
	}
	if writeLayout {
		_ = b.Set(layoutKey, binary.BigEndian.AppendUint64(nil, record.Layout), nil)
	}
	err = commitBatch(b, pebble.Sync)
	_ = b.Close()
	if err != nil {
		return fmt.Errorf("engine: write epoch: %w", err)
	}
	e.epoch = epoch
	return nil
}
