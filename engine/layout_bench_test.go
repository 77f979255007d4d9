package engine

import (
	"strconv"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/record"
)

// BenchmarkLookupProbes prices the two record layouts considered for
// expiry (docs/design.md, "Expiry and the sweeper"). A claim of a new key
// must prove the key absent. With the single-probe layout the engine uses,
// that is one prefix seek (probes=1). With records grouped into time
// buckets (so that whole expired buckets could be dropped with one range
// deletion), the key could be in any live bucket, so a claim seeks once
// per bucket (probes=k, one iterator). The store holds 200,000 completed
// records spread over 8 bucket prefixes, flushed and compacted; every
// lookup misses, as nearly every claim does.
func BenchmarkLookupProbes(b *testing.B) {
	e, err := Open(b.TempDir(), &Options{NoBackgroundSweep: true})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	const n, buckets = 200_000, 8
	now := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	rec := idemkv.Record{State: idemkv.StateCompleted, Fingerprint: []byte{1, 2, 3, 4, 5, 6, 7, 8, 9},
		Token: 1 << 40, Attempt: 1, Created: now, Expires: now.Add(24 * time.Hour),
		Result: idemkv.Result{Status: 201, Pointer: "/v1/payments/pay_0123456789abcde"}}
	val := record.Encode(nil, &rec)
	mk := func(bucket byte, i int, prefix string) []byte {
		k := record.AppendKey(nil, idemkv.ID{Tenant: "acct_" + strconv.Itoa(i%1000),
			Endpoint: "POST /v1/payments", Key: prefix + strconv.Itoa(i)})
		return append([]byte{record.NSRecord, bucket}, k[1:]...)
	}
	bt := e.db.NewBatch()
	for i := range n {
		_ = bt.Set(mk(byte(i%buckets), i, "done-"), val, nil)
		if bt.Len() > 1<<20 {
			if err := bt.Commit(pebble.NoSync); err != nil {
				b.Fatal(err)
			}
			bt = e.db.NewBatch()
		}
	}
	if err := bt.Commit(pebble.Sync); err != nil {
		b.Fatal(err)
	}
	if err := e.db.Flush(); err != nil {
		b.Fatal(err)
	}
	if err := e.db.Compact(ctx, []byte{0}, []byte{0xff}, true); err != nil {
		b.Fatal(err)
	}
	for _, probes := range []int{1, 2, 4, 8} {
		b.Run("probes="+strconv.Itoa(probes), func(b *testing.B) {
			keys := make([][]byte, probes)
			i := 0
			for b.Loop() {
				i++
				for j := range probes {
					keys[j] = mk(byte(j), i, "new-")
				}
				it, err := e.db.NewIter(&pebble.IterOptions{UseL6Filters: true})
				if err != nil {
					b.Fatal(err)
				}
				for _, k := range keys {
					if it.SeekPrefixGE(k) {
						b.Fatal("found a key never written")
					}
				}
				_ = it.Close()
			}
		})
	}
}
