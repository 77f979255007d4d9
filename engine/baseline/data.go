package baseline

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv"
)

// GetData implements idemkv.DataReader: the slice is the caller's.
func (s *DB) GetData(ctx context.Context, key []byte) ([]byte, error) {
	if err := idemkv.ValidateEffectKey(key); err != nil {
		return nil, err
	}
	if err := s.enter(ctx); err != nil {
		return nil, err
	}
	defer s.gate.RUnlock()
	v, closer, err := s.db.Get(dataKey(key))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, fmt.Errorf("%w: data key %q", idemkv.ErrNotFound, key)
	}
	if err != nil {
		return nil, fmt.Errorf("baseline: read data: %w", err)
	}
	out := bytes.Clone(v)
	closer.Close()
	return out, nil
}

// ScanData implements idemkv.DataReader.
func (s *DB) ScanData(ctx context.Context, prefix []byte, fn func(key, value []byte) bool) error {
	return s.ScanDataAfter(ctx, prefix, nil, fn)
}

// ScanDataAfter implements idemkv.DataReader.
func (s *DB) ScanDataAfter(ctx context.Context, prefix, after []byte, fn func(key, value []byte) bool) error {
	if err := idemkv.ValidateDataScan(prefix, after); err != nil {
		return err
	}
	if err := s.enter(ctx); err != nil {
		return err
	}
	defer s.gate.RUnlock()
	first := dataKey(prefix)
	lower := first
	if after != nil {
		lower = append(dataKey(after), 0) // the first key after it
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: prefixEnd(first)})
	if err != nil {
		return fmt.Errorf("baseline: scan data: %w", err)
	}
	n := len(first) - len(prefix)
	for valid := it.First(); valid && ctx.Err() == nil; valid = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			it.Close()
			return fmt.Errorf("baseline: scan data: %w", err)
		}
		if !fn(it.Key()[n:], v) {
			break
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("baseline: scan data: %w", err)
	}
	return ctx.Err()
}

// prefixEnd is the smallest key after every key that starts with p, or
// nil if there is none.
func prefixEnd(p []byte) []byte {
	end := bytes.Clone(p)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}
