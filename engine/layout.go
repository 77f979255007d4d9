package engine

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv/internal/record"
)

// checkLayout reports whether the store is in the layout this engine
// writes (record.Layout), and whether the marker must be written: a new,
// empty store gets it with its first epoch, and a store in layout 3 gets
// it with the pending index that layout lacked (migrate). A store with
// records or effects but no marker predates the marker (layout 1) and is
// refused, as is any other layout.
func (e *Engine) checkLayout() (write, migrate bool, err error) {
	v, closer, err := e.db.Get(layoutKey)
	switch {
	case errors.Is(err, pebble.ErrNotFound):
		it, err := e.db.NewIter(&pebble.IterOptions{LowerBound: recordStart})
		if err != nil {
			return false, false, fmt.Errorf("engine: read layout: %w", err)
		}
		empty := !it.First()
		if err := it.Close(); err != nil {
			return false, false, fmt.Errorf("engine: read layout: %w", err)
		}
		if !empty {
			return false, false, fmt.Errorf("%w: the store has no layout marker, so it was written in layout 1 (effects without stamps); this engine reads layout %d and has no migration from it", ErrLayout, record.Layout)
		}
		return true, false, nil
	case err != nil:
		return false, false, fmt.Errorf("engine: read layout: %w", err)
	}
	defer closer.Close()
	if len(v) != 8 {
		return false, false, fmt.Errorf("engine: read layout: %w: %d bytes", record.ErrCorrupt, len(v))
	}
	switch l := binary.BigEndian.Uint64(v); {
	case l == record.Layout:
		return false, false, nil
	case l == layoutWithoutIndex && !e.opts.ReadOnly:
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
