package bench

import (
	"context"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
)

// Seed writes n completed records of stream (requests 0 to n-1: Key,
// Fingerprint, and Result with body; no effect) into the engine store in
// dir, creating it, through engine.Load: the layout the engine writes,
// records in the expiry buckets of their class, dated by opts.Clock. It is
// the one way the harness seeds an engine store. It skips the claims, and
// their fsync per request, because it only sets the stage: the requests
// measured afterwards go through the engine and are durable as always.
// The store must not be open.
func Seed(ctx context.Context, dir string, opts *engine.Options, stream uint64, n, tenants int, body []byte) error {
	recs := func(yield func(idemkv.Record) bool) {
		for i := range uint64(n) {
			if !yield(idemkv.Record{ID: Key(stream, i, tenants), State: idemkv.StateCompleted,
				Fingerprint: Fingerprint(stream, i, false), Result: Result(stream, i, body)}) {
				return
			}
		}
	}
	_, err := engine.Load(ctx, dir, opts, recs, &engine.LoadOptions{Records: int64(n)})
	return err
}
