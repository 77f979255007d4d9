//go:build ignore

// Command layout is a measurement-only experiment, not part of the engine
// or the harness: it compares the two record layouts of docs/design.md
// ("Expiry and the sweeper") on raw Pebble, opened with the engine's
// options, at the load of `idemkv bench ttl`.
//
//   - point: record keys in scope-and-key order, as the engine stores them
//     today; a sweeper walks them in chunks of 64, rate-limited, and point-
//     deletes those past their expiry (DeleteSized, unsynced).
//   - bucket: record keys prefixed with their expiry bucket (expiry divided
//     by -bucket); a sweeper drops every bucket whose end has passed with
//     one DeleteRange (unsynced).
//
// Writers commit one record per request with a synced Pebble commit, at a
// constant rate from a pool of clients. As in bench ttl, the sweeper works
// only in alternate slices, and foreground latency after the first
// retention window is reported separately for slices with and without it.
// Records only: no engine, no effects, no claim lookups, so it isolates
// what deleting costs the foreground in each layout.
//
// With -preload N and -slice 0 it measures writes alone over a store of N
// records (no sweeper), for the cost of compactions as the store grows.
//
// Run it from the repository root:
//
//	go run ./bench/experiments/layout/main.go -layout point
//	go run ./bench/experiments/layout/main.go -layout bucket
package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"flag"
	"fmt"
	"math"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv/engine"
	"golang.org/x/time/rate"
)

var (
	layout    = flag.String("layout", "point", "record layout: point or bucket")
	reqRate   = flag.Int("rate", 5000, "requests per second")
	clients   = flag.Int("clients", 64, "concurrent writers")
	retention = flag.Duration("retention", 60*time.Second, "retention of every record")
	windows   = flag.Int("windows", 4, "run length, in retention windows")
	bucket    = flag.Duration("bucket", 10*time.Second, "bucket width (bucket layout)")
	slice     = flag.Duration("slice", 5*time.Second, "length of the alternating slices with and without sweeping")
	sweepRate = flag.Int("sweep-rate", 50000, "records read per second by the point sweeper")
	dir       = flag.String("dir", "", "store directory (default: a temporary one)")
	duration  = flag.Duration("duration", 0, "run length, overriding -windows; the first quarter is not measured")
	preload   = flag.Int("preload", 0, "records to load (expiries spread over the retention) and compact before the run")
	flushRD   = flag.Duration("flush-delay-delete-range", 0, "Pebble's FlushDelayDeleteRange: flush a memtable holding a range delete after this long (0: only when full)")
)

func main() {
	flag.Parse()
	if *layout != "point" && *layout != "bucket" {
		fmt.Fprintln(os.Stderr, "layout: -layout must be point or bucket")
		os.Exit(2)
	}
	d := *dir
	if d == "" {
		var err error
		if d, err = os.MkdirTemp("", "idemkv-layout-"); err != nil {
			fail(err)
		}
	}
	defer os.RemoveAll(d)
	po := (&engine.Options{}).EnsureDefaults().PebbleOptions()
	po.Cache = pebble.NewCache(64 << 20)
	defer po.Cache.Unref()
	po.Logger = quietLogger{}
	po.FlushDelayDeleteRange = *flushRD
	db, err := pebble.Open(d, po)
	if err != nil {
		fail(err)
	}

	if *preload > 0 {
		t0 := time.Now()
		load(db, *preload)
		fmt.Printf("preloaded and compacted %d records in %.0f s\n", *preload, time.Since(t0).Seconds())
	}
	start := time.Now()
	total, warmup := time.Duration(*windows)**retention, *retention
	if *duration > 0 {
		total, warmup = *duration, *duration/4
	}
	sweeping := func(t time.Time) bool { return *slice > 0 && (t.Sub(start)/(*slice))%2 == 1 }
	var (
		mu          sync.Mutex
		on          = hdrhistogram.New(1, 10_000_000, 3)
		off         = hdrhistogram.New(1, 10_000_000, 3)
		writes      atomic.Int64
		deleted     atomic.Int64
		ctx, cancel = context.WithCancel(context.Background())
	)
	// Requests arrive at a constant rate; a request not taken in time is
	// dropped rather than queued, as an open-loop load would.
	tokens := make(chan struct{}, *reqRate)
	go func() {
		defer close(tokens)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		owed, last := 0.0, time.Now()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-tick.C:
				owed += float64(*reqRate) * now.Sub(last).Seconds()
				last = now
				for ; owed >= 1; owed-- {
					select {
					case tokens <- struct{}{}:
					default:
					}
				}
			}
		}
	}()
	var wg sync.WaitGroup
	for range *clients {
		wg.Go(func() {
			key := make([]byte, 0, 64)
			val := make([]byte, 48)
			var id [16]byte
			for range tokens {
				t0 := time.Now()
				exp := t0.Add(*retention)
				_, _ = rand.Read(id[:])
				key = recordKey(key[:0], exp, id)
				binary.BigEndian.PutUint64(val, uint64(exp.UnixNano()))
				if err := db.Set(key, val, pebble.Sync); err != nil {
					fail(err)
				}
				writes.Add(1)
				if t0.Sub(start) >= warmup {
					lat := time.Since(t0).Microseconds()
					mu.Lock()
					if sweeping(t0) {
						_ = on.RecordValue(lat)
					} else {
						_ = off.RecordValue(lat)
					}
					mu.Unlock()
				}
			}
		})
	}
	swept := make(chan struct{})
	go func() {
		defer close(swept)
		if *slice > 0 {
			sweep(ctx, db, start, sweeping, &deleted)
		}
	}()

	var sizes []float64
	m0, cpu0 := db.Metrics(), cpuTime()
	tick := time.NewTicker(time.Second)
	for now := range tick.C {
		if now.Sub(start) >= total/2 {
			m := db.Metrics()
			sizes = append(sizes, float64(m.Total().TablesSize)+float64(m.WAL.PhysicalSize))
		}
		if now.Sub(start) >= total {
			break
		}
	}
	tick.Stop()
	cancel()
	wg.Wait()
	<-swept
	cpu := cpuTime() - cpu0
	m := db.Metrics()

	mean, dev := 0.0, 0.0
	for _, s := range sizes {
		mean += s
	}
	mean /= float64(len(sizes))
	for _, s := range sizes {
		dev = math.Max(dev, math.Abs(s-mean)/mean)
	}
	n := writes.Load()
	fmt.Printf("layout %s: %d records (%.0f/s), %d point-deleted\n", *layout, n, float64(n)/time.Since(start).Seconds(), deleted.Load())
	fmt.Printf("latency while sweeping: p50 %d µs, p99 %d µs, p99.9 %d µs (%d requests)\n", on.ValueAtQuantile(50), on.ValueAtQuantile(99), on.ValueAtQuantile(99.9), on.TotalCount())
	fmt.Printf("latency while paused:   p50 %d µs, p99 %d µs, p99.9 %d µs (%d requests)\n", off.ValueAtQuantile(50), off.ValueAtQuantile(99), off.ValueAtQuantile(99.9), off.TotalCount())
	fmt.Printf("ratio sweeping/paused:  p50 %.2f, p99 %.2f\n",
		float64(on.ValueAtQuantile(50))/float64(off.ValueAtQuantile(50)),
		float64(on.ValueAtQuantile(99))/float64(off.ValueAtQuantile(99)))
	fmt.Printf("process CPU %.1f s (%.1f µs per record); flushed %.1f MB, compacted %.1f MB\n",
		cpu.Seconds(), cpu.Seconds()*1e6/float64(n),
		float64(m.Total().TableBytesFlushed-m0.Total().TableBytesFlushed)/1e6,
		float64(m.Total().TableBytesCompacted-m0.Total().TableBytesCompacted)/1e6)
	fmt.Printf("sstables + WAL over the second half: mean %.1f MB, largest deviation %.1f%%\n", mean/1e6, dev*100)
	if err := db.Close(); err != nil {
		fail(err)
	}
}

// recordKey appends the key of a record with the given expiry and id to
// dst, in the layout chosen.
func recordKey(dst []byte, exp time.Time, id [16]byte) []byte {
	dst = append(dst, 'r')
	if *layout == "bucket" {
		dst = binary.BigEndian.AppendUint64(dst, uint64(exp.UnixNano()/int64(*bucket)))
	}
	dst = append(dst, "tenant-0000000001"...)
	return append(dst, id[:]...)
}

// load writes n records whose expiries are spread over the retention
// window from now, then compacts them.
func load(db *pebble.DB, n int) {
	now := time.Now()
	val := make([]byte, 48)
	var (
		id  [16]byte
		key []byte
		r   [8]byte
	)
	b := db.NewBatch()
	for i := range n {
		_, _ = rand.Read(id[:])
		_, _ = rand.Read(r[:])
		exp := now.Add(time.Duration(binary.BigEndian.Uint64(r[:]) % uint64(*retention)))
		key = recordKey(key[:0], exp, id)
		binary.BigEndian.PutUint64(val, uint64(exp.UnixNano()))
		_ = b.Set(key, val, nil)
		if b.Count() == 4096 || i == n-1 {
			if err := b.Commit(pebble.NoSync); err != nil {
				fail(err)
			}
			b.Reset()
		}
	}
	_ = b.Close()
	if err := db.Flush(); err != nil {
		fail(err)
	}
	if err := db.Compact(context.Background(), []byte("r"), []byte("s"), true); err != nil {
		fail(err)
	}
}

// sweep deletes expired records during the sweeping slices until ctx ends.
func sweep(ctx context.Context, db *pebble.DB, start time.Time, sweeping func(time.Time) bool, deleted *atomic.Int64) {
	lim := rate.NewLimiter(rate.Limit(*sweepRate), 64)
	var pos []byte
	firstBucket := uint64(start.UnixNano() / int64(*bucket))
	for ctx.Err() == nil {
		now := time.Now()
		if !sweeping(now) {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if *layout == "bucket" {
			// Every bucket that ended before now: records in it have all
			// expired. Range deletes of a dropped bucket again are no-ops
			// for the data, so the sweeper keeps no state but its start.
			cur := uint64(now.UnixNano() / int64(*bucket))
			for ; firstBucket < cur; firstBucket++ {
				lo := binary.BigEndian.AppendUint64([]byte{'r'}, firstBucket)
				hi := binary.BigEndian.AppendUint64([]byte{'r'}, firstBucket+1)
				if err := db.DeleteRange(lo, hi, pebble.NoSync); err != nil {
					fail(err)
				}
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if lim.WaitN(ctx, 64) != nil {
			return
		}
		it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte("r"), UpperBound: []byte("s")})
		if err != nil {
			fail(err)
		}
		ok := it.First()
		if pos != nil {
			ok = it.SeekGE(pos)
		}
		b := db.NewBatch()
		for n := 0; ok && n < 64; ok, n = it.Next(), n+1 {
			if int64(binary.BigEndian.Uint64(it.Value())) <= now.UnixNano() {
				_ = b.DeleteSized(it.Key(), uint32(len(it.Key())+len(it.Value())), nil)
				deleted.Add(1)
			}
		}
		pos = nil
		if ok {
			pos = append(pos, it.Key()...)
		}
		if err := it.Close(); err != nil {
			fail(err)
		}
		if !b.Empty() {
			if err := b.Commit(pebble.NoSync); err != nil {
				fail(err)
			}
		}
		_ = b.Close()
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "layout:", err)
	os.Exit(1)
}

type quietLogger struct{}

func (quietLogger) Infof(string, ...any)           {}
func (quietLogger) Errorf(format string, a ...any) { fmt.Fprintf(os.Stderr, format+"\n", a...) }
func (quietLogger) Fatalf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", a...)
	os.Exit(1)
}
