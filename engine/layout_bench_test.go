package engine

import (
	"strconv"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine/internal/record"
	"github.com/idemkv/idemkv/internal/fakeclock"
)

// BenchmarkLookupProbes prices the two record layouts considered for
// expiry (docs/design.md, "Expiry and the sweeper"), on raw Pebble. A claim
// of a new key must prove the key absent. With the single-probe layout
// (layout 2), that is one prefix seek (probes=1). With records grouped into time
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

// BenchmarkReplayLookup prices what layout 3's buckets cost the lookups
// the claim filter lets through: claims of stored keys, with the replay
// cache off so that each one reads Pebble. 100,000 completed records of
// the default class (24 h), flushed and compacted, are spread over one
// bucket or over the 25 buckets a day's completions fill. "recent" claims
// keys of the newest bucket (a retry soon after its first attempt: the
// first bucket probed); "any" claims keys of every bucket alike (about
// half the buckets probed). new= claims keys never stored, which the
// filter answers.
func BenchmarkReplayLookup(b *testing.B) {
	for _, buckets := range []int{1, 25} {
		b.Run("buckets="+strconv.Itoa(buckets), func(b *testing.B) {
			const n = 100_000
			clock := fakeclock.New(t0)
			e, err := Open(b.TempDir(), &Options{Clock: clock, NoBackgroundSweep: true, ReplayCacheSize: -1})
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			<-e.ClaimFilterBuilt()
			// Completions spread over just under a day, so that none has
			// expired and each group has a bucket of its own.
			step := 24 * time.Hour / time.Duration(buckets)
			key := func(i int) idemkv.ID {
				return idemkv.ID{Tenant: "acct_" + strconv.Itoa(i%1000), Endpoint: "POST /v1/payments", Key: "k-" + strconv.Itoa(i)}
			}
			per := n / buckets
			for i := range n {
				if i > 0 && i%per == 0 {
					clock.Advance(step)
				}
				c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: key(i), Fingerprint: fpA})
				if err != nil {
					b.Fatal(err)
				}
				if err := e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, nil); err != nil {
					b.Fatal(err)
				}
			}
			if err := e.Flush(); err != nil {
				b.Fatal(err)
			}
			if err := e.Compact(ctx); err != nil {
				b.Fatal(err)
			}
			if got := len(e.buckets.load()); got != buckets {
				b.Fatalf("%d buckets, want %d", got, buckets)
			}
			run := func(name string, pick func(i int) idemkv.ID, want idemkv.Outcome) {
				b.Run(name, func(b *testing.B) {
					i := 0
					for b.Loop() {
						i++
						c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: pick(i), Fingerprint: fpA})
						if err != nil || c.Outcome != want {
							b.Fatal(c.Outcome, err)
						}
						if c.Outcome == idemkv.Acquired {
							if err := e.Release(ctx, c.Lease, nil); err != nil {
								b.Fatal(err)
							}
						}
					}
				})
			}
			run("recent", func(i int) idemkv.ID { return key(n - per + i%per) }, idemkv.Replay)
			run("any", func(i int) idemkv.ID { return key(i * 7919 % n) }, idemkv.Replay)
			run("new", func(i int) idemkv.ID { return key(n + i) }, idemkv.Acquired)
		})
	}
}

// BenchmarkReplayFromL0 prices the read amplification that
// Options.L0CompactionThreshold allows: claims of stored keys (replays,
// the replay cache off, so each reads Pebble) when the records sit in
// flushes= overlapping L0 files, as between two L0 compactions, against
// one. The default threshold (16) lets L0 reach 8 such flushes before it
// is compacted; Pebble's own (4), 2. Automatic compactions are held off
// for the measurement.
func BenchmarkReplayFromL0(b *testing.B) {
	for _, flushes := range []int{1, 2, 8} {
		b.Run("flushes="+strconv.Itoa(flushes), func(b *testing.B) {
			const n = 80_000
			e, err := Open(b.TempDir(), &Options{Clock: fakeclock.New(t0), NoBackgroundSweep: true,
				ReplayCacheSize: -1, L0CompactionThreshold: 1000})
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			<-e.ClaimFilterBuilt()
			key := func(i int) idemkv.ID {
				return idemkv.ID{Tenant: "acct_" + strconv.Itoa(i%1000), Endpoint: "POST /v1/payments", Key: "k-" + strconv.Itoa(i)}
			}
			// Keys are written in a shuffled order so that every flush
			// spans the whole key range, as random UUID keys do.
			for j := range n {
				i := j * 7919 % n
				c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: key(i), Fingerprint: fpA})
				if err != nil {
					b.Fatal(err)
				}
				if err := e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, nil); err != nil {
					b.Fatal(err)
				}
				if (j+1)%(n/flushes) == 0 {
					if err := e.Flush(); err != nil {
						b.Fatal(err)
					}
				}
			}
			st, err := e.Stats()
			if err != nil {
				b.Fatal(err)
			}
			if st.ReadAmp < flushes {
				b.Fatalf("read amplification %d, want at least %d", st.ReadAmp, flushes)
			}
			i := 0
			for b.Loop() {
				i++
				c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: key(i * 104729 % n), Fingerprint: fpA})
				if err != nil || c.Outcome != idemkv.Replay {
					b.Fatal(c.Outcome, err)
				}
			}
		})
	}
}
