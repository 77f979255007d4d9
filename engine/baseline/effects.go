package baseline

import (
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/idemkv/idemkv"
)

// effects adapts a batch to idemkv.Effects in the data namespace, and
// remembers which keys end up set (Record.Effects counts them).
type effects struct {
	b   *pebble.Batch
	set map[string]bool
}

func (w *effects) Set(key, value []byte) error {
	if err := idemkv.ValidateEffectKey(key); err != nil {
		return err
	}
	w.note(key, true)
	return w.b.Set(dataKey(key), value, nil)
}

// Get is not offered: the baseline measures blind writes only.
func (w *effects) Get(key []byte) ([]byte, error) {
	return nil, fmt.Errorf("%w: the baseline store does not read in effects", idemkv.ErrInvalidArgument)
}

// Emit is not offered: the baseline has no outbox.
func (w *effects) Emit(idemkv.Event) error {
	return fmt.Errorf("%w: the baseline store has no outbox", idemkv.ErrInvalidArgument)
}

func (w *effects) Delete(key []byte) error {
	if err := idemkv.ValidateEffectKey(key); err != nil {
		return err
	}
	w.note(key, false)
	return w.b.Delete(dataKey(key), nil)
}

func (w *effects) note(key []byte, set bool) {
	if w.set == nil {
		w.set = make(map[string]bool)
	}
	w.set[string(key)] = set
}

func (w *effects) count() int {
	n := 0
	for _, set := range w.set {
		if set {
			n++
		}
	}
	return n
}
