package engine

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/ttl"
)

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// Options configure an Engine. A nil *Options, and every zero field, means
// the default documented on the field.
type Options struct {
	// FS is the filesystem Pebble uses. Default: the operating system's
	// (vfs.Default). Tests inject vfs.NewCrashableMem or an error-injecting
	// filesystem.
	FS vfs.FS

	// Clock supplies the time: leases, retention and record timestamps are
	// read from it. Default: the system clock.
	Clock idemkv.Clock

	// Rand supplies randomness for operation ids. Default: crypto/rand.
	Rand io.Reader

	// Lease is the lease a claim gets when ClaimRequest.Lease is zero.
	// Default: 30 s. Longer leases make a crashed holder's key wait longer;
	// shorter ones make takeovers of slow-but-alive holders more likely.
	Lease time.Duration

	// Retention is how long a record of the default retention class
	// (ttl.DefaultClass) is kept and replayed, counted from its
	// completion. Default: 24 h. A retry that arrives later runs as new.
	// Size it from the longest client retry window, queue replay window
	// and provider window (docs/operations.md).
	Retention time.Duration

	// RetentionClasses are further classes a claim may name in
	// ClaimRequest.Retention, for example "money": 30 days. Default: none
	// (only the default class). It may not redefine ttl.DefaultClass;
	// set Retention instead. Changing a class's window applies to records
	// completed afterwards. A stored record naming a class that is no
	// longer configured is kept for the longest configured window.
	RetentionClasses ttl.Classes

	// Sweep configures the sweeper that deletes expired records (package
	// ttl): its interval (default 10 min), rate (default 50,000 records
	// examined per second) and chunk size. Its Clock is always the
	// engine's. Reads never need it: expired records are absent at once.
	Sweep ttl.Options

	// NoBackgroundSweep stops Open from starting the sweeper; expired
	// records are then deleted only by Engine.Sweep (the `idemkv sweep`
	// command). Storage grows without bound unless something calls it.
	NoBackgroundSweep bool

	// MinFreeDisk is the free space, in bytes, below which the store stops
	// starting new work: a claim that would acquire fails with
	// idemkv.ErrNoSpace, while replays, reads and the completion of work
	// in progress go on. Pebble ends the process when a write fails for
	// lack of space, so refusing new work first keeps the service up and
	// answering. Free space is read from the filesystem at most once per
	// second. Default: 256 MiB. Negative: never refuse.
	MinFreeDisk int64

	// MaxBodySize bounds Result.Body, in bytes. Default: 64 KiB. Larger
	// responses should be stored as a Result.Pointer instead.
	MaxBodySize int

	// CacheSize is the Pebble block cache, in bytes. Default: 64 MiB. Replays
	// and claim misses are served from it; give it the hot working set.
	CacheSize int64

	// MemTableSize is the size of one Pebble memtable, in bytes. Default:
	// 8 MiB, measured best of 4, 8, 16 and 32 MiB on the unique and remote
	// workloads (docs/operations.md): every claim of a new key searches the
	// memtable's skiplist, which is cheaper while it fits the CPU's caches.
	// Larger memtables mean fewer flushes and longer WAL replay at open.
	MemTableSize uint64

	// L0CompactionThreshold sets how much overlap Pebble lets level 0
	// gather before it compacts it into the level below: Pebble starts an
	// L0 compaction once L0 holds half this many sublevels (flushes whose
	// keys overlap), and stops writes at three times this many. Default: 16
	// (Pebble's own is 4). Record keys are random, so every flush overlaps
	// the whole base level of its bucket, and each L0 compaction rewrites
	// that level: compacting after 8 flushes instead of 2 rewrites it a
	// quarter as often. On two cores this took the HTTP middleware's p99
	// overhead at 5,000 requests/s from a median of 2.55 ms to 1.34 ms and
	// the unique workload's write amplification from about 5 to 3.6
	// (docs/benchmarks.md). The cost is read amplification: a lookup that
	// reaches Pebble searches every overlapping L0 file, up to half this
	// many in normal running. Most claims of new keys never reach Pebble
	// (the claim filter) and recent completions are replayed from memory;
	// a replay that misses the replay cache took 11.9 µs from 8 L0 files
	// against 6.7 µs from 2 (BenchmarkReplayFromL0).
	L0CompactionThreshold int

	// NoBackgroundYield turns off the yield of Pebble's flushes and
	// compactions, and of the claim filter's builds, to waiting requests
	// (yieldfs.go, claimfilter.go). By default a flush or compaction lets
	// runnable goroutines run once per millisecond of writing, except
	// while Pebble stalls writes, and a filter build once per millisecond
	// of scanning, so that background work does not hold a core for the
	// scheduler's 10 ms slices while requests wait: on two cores this
	// shortened the HTTP middleware's p99 latency (docs/benchmarks.md).
	// Set it to measure without the yield.
	NoBackgroundYield bool

	// BackgroundNice, on Linux, runs each of Pebble's compactions on an
	// OS thread of its own at this nice value, 1 (a little below normal)
	// to 19 (only when a core is free). 0, the default, leaves them at the
	// process's priority. Other systems ignore it. Flushes keep the
	// normal priority: writes wait for them.
	//
	// It pays only with more Go processors than cores: GOMAXPROCS at the
	// number of cores plus one lets a compaction have a processor of its
	// own, and the nice value makes the kernel give the cores to the
	// requests' threads first. On two cores at 5,000 requests/s, 19 with
	// GOMAXPROCS 3 took the HTTP middleware's p99 overhead from a median
	// of +2.56 ms to +0.36 ms in eight alternated pairs of runs
	// (docs/benchmarks.md). `idemkv serve` sets both. A compaction that
	// starts while Pebble stalls writes keeps the normal priority. Other
	// processes keeping every core busy at normal priority starve the
	// lowered compactions, and level 0 grows; see docs/operations.md.
	BackgroundNice int

	// CompactionConcurrency is the most compactions Pebble runs at once.
	// Default: 1 on one or two cores, else half the cores. Compactions
	// compete with requests for CPU.
	CompactionConcurrency int

	// Compression is the sstable compression profile. Default:
	// sstable.BalancedCompression (zstd level 1 on data blocks). Against
	// Snappy it stored a completed record in 60 B instead of 94 B and one
	// with a 2 KiB body in 472 B instead of 753 B (1 M and 50,000 records,
	// full benchmark run), with lower write amplification and the same
	// throughput and claim-filter build time (docs/benchmarks.md). Snappy
	// costs less CPU in flushes and compactions and in reads that miss the
	// block cache.
	Compression *sstable.CompressionProfile

	// BloomBitsPerKey sizes the bloom filter on every level, L0 to L6.
	// Default: 10 (about 1% false positives). Most claims look up keys that
	// do not exist, so filters on every level spare most disk reads.
	BloomBitsPerKey int

	// ReplayCacheSize is the memory, in bytes, for recently completed
	// records kept to answer replays without a Pebble read, allocated at
	// Open and kept out of the garbage collector's scans (cache.go).
	// Default: 128 MiB, several hundred thousand records without bodies
	// (about 150 to 200 B each, encoded): more than a minute of
	// completions at 5,000 requests/s, the window in which most retries of
	// finished requests arrive. Sizes below 512 KiB are rounded up to it.
	// Negative disables it. A replay the cache misses costs a Pebble read,
	// several times slower.
	ReplayCacheSize int64

	// ClaimFilterBitsPerKey sizes the in-memory bloom filter that answers
	// most claims of new keys without a Pebble lookup (claimfilter.go).
	// Default: 10 bits per key, about 1% of new keys still looked up.
	// The filter is sized for twice the stored records and rebuilt by a
	// background scan of the record keys when it fills up: memory is about
	// 2.5 bytes per stored record at the default, twice that during a
	// rebuild (about 1 GB and 2 GB at the guide's 432 M records). The
	// first build scans the store after Open; until it ends, every claim
	// looks up Pebble. Negative disables the filter.
	ClaimFilterBitsPerKey int

	// CheckMemory bounds, in bytes, the memory Engine.Check holds to pair
	// effects with their outcomes: about 48 bytes for each unsettled
	// record and each completed one that wrote effects. A store that needs
	// more is checked in several passes over the same snapshot, each
	// pairing a share of the tokens: a check of N such records reads the
	// store N*48/CheckMemory times, rounded up to a power of two. The
	// heap peaks at two to three times this (garbage not yet collected).
	// Default: 256 MiB (about 5.6 M records a pass). Negative is invalid.
	CheckMemory int64

	// Shards is the number of lock stripes of the in-memory lease table.
	// Default: 256. More shards mean less contention between unrelated keys.
	Shards int

	// Logger receives Pebble's log lines. Default: errors and fatal
	// messages to stderr, informational lines dropped.
	Logger pebble.Logger

	// claimFilterMinKeys, if positive, replaces minFilterKeys: tests set
	// it low to make the claim filter rebuild often.
	claimFilterMinKeys int64

	// ReadOnly opens the store for inspection only: writes return an error
	// and the store's epoch is not advanced.
	ReadOnly bool
}

// EnsureDefaults returns a copy of o (which may be nil) with every zero
// field set to its default.
func (o *Options) EnsureDefaults() *Options {
	var c Options
	if o != nil {
		c = *o
	}
	if c.FS == nil {
		c.FS = vfs.Default
	}
	if c.Clock == nil {
		c.Clock = systemClock{}
	}
	if c.Rand == nil {
		c.Rand = rand.Reader
	}
	if c.Lease == 0 {
		c.Lease = 30 * time.Second
	}
	if c.Retention == 0 {
		c.Retention = 24 * time.Hour
	}
	if c.MinFreeDisk == 0 {
		c.MinFreeDisk = 256 << 20
	}
	if c.MaxBodySize == 0 {
		c.MaxBodySize = 64 << 10
	}
	if c.CacheSize == 0 {
		c.CacheSize = 64 << 20
	}
	classes := make(ttl.Classes, len(c.RetentionClasses)+1)
	for n, w := range c.RetentionClasses {
		classes[n] = w
	}
	if _, ok := classes[ttl.DefaultClass]; !ok {
		classes[ttl.DefaultClass] = c.Retention
	}
	c.RetentionClasses = classes
	c.Sweep.Clock = c.Clock
	if c.MemTableSize == 0 {
		c.MemTableSize = 8 << 20
	}
	if c.L0CompactionThreshold == 0 {
		c.L0CompactionThreshold = 16
	}
	if c.CompactionConcurrency == 0 {
		c.CompactionConcurrency = max(1, runtime.GOMAXPROCS(0)/2)
	}
	if c.Compression == nil {
		c.Compression = sstable.BalancedCompression
	}
	if c.BloomBitsPerKey == 0 {
		c.BloomBitsPerKey = 10
	}
	if c.Shards == 0 {
		c.Shards = 256
	}
	if c.CheckMemory == 0 {
		c.CheckMemory = 256 << 20
	}
	if c.ClaimFilterBitsPerKey == 0 {
		c.ClaimFilterBitsPerKey = 10
	}
	// Negative values, which turn a feature off, stay negative, so that
	// applying the defaults twice changes nothing.
	if c.ReplayCacheSize == 0 {
		c.ReplayCacheSize = 128 << 20
	}
	if c.Logger == nil {
		c.Logger = quietLogger{}
	}
	return &c
}

// Validate reports a configuration the engine cannot run with.
func (o *Options) Validate() error {
	var errs []error
	if o.Lease < 0 {
		errs = append(errs, fmt.Errorf("Lease %v is negative", o.Lease))
	}
	if o.Retention < 0 {
		errs = append(errs, fmt.Errorf("Retention %v is negative", o.Retention))
	}
	if o.Retention > 0 && o.Lease > o.Retention {
		errs = append(errs, fmt.Errorf("Lease %v exceeds Retention %v", o.Lease, o.Retention))
	}
	if _, ok := o.RetentionClasses[ttl.DefaultClass]; ok && o.RetentionClasses[ttl.DefaultClass] != o.Retention {
		errs = append(errs, fmt.Errorf("RetentionClasses redefines %q; set Retention instead", ttl.DefaultClass))
	}
	if err := o.RetentionClasses.Validate(); err != nil {
		errs = append(errs, err)
	}
	if o.Lease > 0 {
		for _, n := range o.RetentionClasses.Names() {
			if w := o.RetentionClasses[n]; n != ttl.DefaultClass && w > 0 && o.Lease > w {
				errs = append(errs, fmt.Errorf("Lease %v exceeds retention class %q (%v)", o.Lease, n, w))
			}
		}
	}
	if err := o.Sweep.Validate(); err != nil {
		errs = append(errs, err)
	}
	if o.MaxBodySize < 0 || o.MaxBodySize > 16<<20 {
		errs = append(errs, fmt.Errorf("MaxBodySize %d outside 0..16 MiB", o.MaxBodySize))
	}
	if o.CacheSize < 0 {
		errs = append(errs, fmt.Errorf("CacheSize %d is negative", o.CacheSize))
	}
	if o.L0CompactionThreshold < 0 || o.L0CompactionThreshold > 1000 {
		errs = append(errs, fmt.Errorf("L0CompactionThreshold %d outside 0..1000", o.L0CompactionThreshold))
	}
	if o.CompactionConcurrency < 0 {
		errs = append(errs, fmt.Errorf("CompactionConcurrency %d is negative", o.CompactionConcurrency))
	}
	if o.BloomBitsPerKey < 0 || o.BloomBitsPerKey > 32 {
		errs = append(errs, fmt.Errorf("BloomBitsPerKey %d outside 0..32", o.BloomBitsPerKey))
	}
	if o.CheckMemory < 0 {
		errs = append(errs, fmt.Errorf("CheckMemory %d is negative", o.CheckMemory))
	}
	if o.ClaimFilterBitsPerKey > 64 {
		errs = append(errs, fmt.Errorf("ClaimFilterBitsPerKey %d above 64", o.ClaimFilterBitsPerKey))
	}
	if o.BackgroundNice < 0 || o.BackgroundNice > 19 {
		errs = append(errs, fmt.Errorf("BackgroundNice %d outside 0..19", o.BackgroundNice))
	}
	if o.Shards < 0 || o.Shards > 1<<16 {
		errs = append(errs, fmt.Errorf("Shards %d outside 0..65536", o.Shards))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("engine: invalid options: %w", err)
	}
	return nil
}

// PebbleOptions returns the Pebble options the engine opens its store
// with, for o with defaults applied: the format version, memtable size,
// bloom filters on every level, compression, compaction concurrency and,
// unless NoBackgroundYield is set and BackgroundNice is 0, the filesystem
// wrapper and event listener of the background yield and priority (a
// caller that replaces EventListener should keep its WriteStallBegin and
// WriteStallEnd). It sets no block cache; Open adds one of CacheSize. The
// benchmark baseline opens its raw Pebble store with these, so the two
// differ only in how they use Pebble.
func (o *Options) PebbleOptions() *pebble.Options {
	fs := o.FS
	var yfs *yieldFS
	if !o.NoBackgroundYield || o.BackgroundNice > 0 {
		yfs = newYieldFS(fs)
		yfs.noYield, yfs.nice, yfs.logger = o.NoBackgroundYield, o.BackgroundNice, o.Logger
		fs = yfs
	}
	po := &pebble.Options{
		FS: fs,
		// Pin the format: a store written by this engine stays readable by
		// it, and a Pebble upgrade does not silently rewrite the format.
		FormatMajorVersion: pebble.FormatNewest,
		MemTableSize:       o.MemTableSize,
		// Zero (no defaults applied) leaves Pebble's own thresholds.
		L0CompactionThreshold: o.L0CompactionThreshold,
		L0StopWritesThreshold: 3 * o.L0CompactionThreshold,
		Logger:                o.Logger,
		ReadOnly:              o.ReadOnly,
		CompactionConcurrencyRange: func() (int, int) {
			return 1, o.CompactionConcurrency
		},
	}
	filter := bloom.FilterPolicy(o.BloomBitsPerKey)
	for i := range po.Levels {
		l := &po.Levels[i]
		l.FilterPolicy = filter
		l.FilterType = pebble.TableFilter
		prof := o.Compression
		l.Compression = func() *sstable.CompressionProfile { return prof }
	}
	if yfs != nil {
		po.EventListener = &pebble.EventListener{}
		yfs.listen(po.EventListener)
	}
	po.EnsureDefaults()
	return po
}

// quietLogger drops Pebble's informational lines and keeps its errors.
type quietLogger struct{}

func (quietLogger) Infof(string, ...any) {}
func (quietLogger) Errorf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "pebble: "+format+"\n", args...)
}
func (quietLogger) Fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "pebble: fatal: "+format+"\n", args...)
	os.Exit(1)
}
