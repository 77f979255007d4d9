package engine_test

// Benchmarks of the engine's hot paths, through its public API only, on a
// real on-disk store, for comparing commits with benchstat:
//
//	go test ./engine -run XXX -bench . -count 10 > old.txt
//	(change the engine)
//	go test ./engine -run XXX -bench . -count 10 > new.txt
//	benchstat old.txt new.txt
//
// Each benchmark preloads completed keys and compacts them to disk first, so
// lookups go through the bloom filters and sstables as in a running store.
// The full harness with the raw-Pebble baseline is `idemkv bench`.

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
)

const benchPreload = 10_000

var (
	benchCtx      = context.Background()
	benchEndpoint = "POST /v1/payments"
	benchFP       = []byte{1, 2, 3, 4, 5, 6, 7, 8, 9}
	benchResult   = idemkv.Result{Status: 201, Pointer: "/v1/payments/pay_0123456789abcde"}
)

func benchID(prefix string, i uint64) idemkv.ID {
	return idemkv.ID{Tenant: "acct_" + strconv.FormatUint(i%1000, 10), Endpoint: benchEndpoint,
		Key: prefix + strconv.FormatUint(i, 10)}
}

// openLoaded opens a store in a temporary directory with benchPreload
// completed keys "done-0".. on disk.
func openLoaded(b *testing.B) *engine.Engine {
	b.Helper()
	e, err := engine.Open(b.TempDir(), nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = e.Close() })
	var next atomic.Uint64
	errs := make(chan error, 64)
	for range 64 {
		go func() {
			for {
				i := next.Add(1) - 1
				if i >= benchPreload {
					errs <- nil
					return
				}
				c, err := e.Claim(benchCtx, idemkv.ClaimRequest{ID: benchID("done-", i), Fingerprint: benchFP})
				if err == nil {
					err = e.Complete(benchCtx, c.Lease, benchResult, nil)
				}
				if err != nil {
					next.Store(benchPreload)
					errs <- err
					return
				}
			}
		}()
	}
	for range 64 {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	if err := e.Flush(); err != nil {
		b.Fatal(err)
	}
	if err := e.Compact(benchCtx); err != nil {
		b.Fatal(err)
	}
	return e
}

// BenchmarkClaimMiss: a local claim of a key the store has never seen,
// then its Release. Neither writes to disk: this is the lookup of an absent
// key (bloom filters) and the in-memory lease.
func BenchmarkClaimMiss(b *testing.B) {
	e := openLoaded(b)
	var seq atomic.Uint64
	op := func() error {
		id := benchID("miss-", seq.Add(1))
		c, err := e.Claim(benchCtx, idemkv.ClaimRequest{ID: id, Fingerprint: benchFP})
		if err != nil {
			return err
		}
		if c.Outcome != idemkv.Acquired {
			return errOutcome(c.Outcome)
		}
		return e.Release(benchCtx, c.Lease, nil)
	}
	runBoth(b, 1, op)
}

// BenchmarkReplayHit: a claim of a completed key, answered with its stored
// result.
func BenchmarkReplayHit(b *testing.B) {
	e := openLoaded(b)
	var seq atomic.Uint64
	op := func() error {
		i := seq.Add(7919) % benchPreload // stride through the keys
		c, err := e.Claim(benchCtx, idemkv.ClaimRequest{ID: benchID("done-", i), Fingerprint: benchFP})
		if err != nil {
			return err
		}
		if c.Outcome != idemkv.Replay || c.Record.Result.Pointer != benchResult.Pointer {
			return errOutcome(c.Outcome)
		}
		return nil
	}
	runBoth(b, 1, op)
}

// BenchmarkComplete: a local claim of a new key and its completion with a
// 16-byte effect: one durable (synced) write per operation, so the serial
// variant measures about one fsync. The parallel variant runs 32 clients
// per core, where concurrent completions can share an fsync.
func BenchmarkComplete(b *testing.B) {
	e := openLoaded(b)
	var seq atomic.Uint64
	effect := []byte("0123456789abcdef")
	op := func() error {
		id := benchID("new-", seq.Add(1))
		c, err := e.Claim(benchCtx, idemkv.ClaimRequest{ID: id, Fingerprint: benchFP})
		if err != nil {
			return err
		}
		if c.Outcome != idemkv.Acquired {
			return errOutcome(c.Outcome)
		}
		return e.Complete(benchCtx, c.Lease, benchResult, func(w idemkv.Effects) error {
			return w.Set([]byte("payments/"+id.Key), effect)
		})
	}
	runBoth(b, 32, op)
}

// runBoth runs op as sub-benchmark "serial" (one client) and "parallel"
// (b.RunParallel with parallelism clients per GOMAXPROCS).
func runBoth(b *testing.B, parallelism int, op func() error) {
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := op(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(parallelism)
		var failed atomic.Pointer[error]
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := op(); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
			}
		})
		if p := failed.Load(); p != nil {
			b.Fatal(*p)
		}
	})
}

type errOutcome idemkv.Outcome

func (o errOutcome) Error() string { return "unexpected outcome " + idemkv.Outcome(o).String() }
