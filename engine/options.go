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

// Options configure an Engine. A nil *Options, and every zero field, means
// the default documented on the field. docs/operations.md says how to size
// them; docs/benchmarks.md has the measurements behind the defaults.
type Options struct {
	// FS is the filesystem Pebble uses. Default: the operating system's
	// (vfs.Default). Tests inject vfs.NewCrashableMem or an error-injecting
	// filesystem.
	FS vfs.FS

	// Clock supplies the time: leases, retention and record timestamps are
	// read from it. Default: the system clock. The engine follows it only
	// while it agrees with elapsed time: see ClockTolerance.
	Clock idemkv.Clock

	// ClockTolerance is how far Clock may disagree with the time elapsed
	// on a steady clock (Go's monotonic clock, or the Clock's own if it is
	// an idemkv.SteadyClock) before the engine stops following it.
	// Default: 1 s. Within it, a step forward can expire a record or a
	// lease up to that much early; steps that add up to more count as
	// one beyond it. Beyond it, the engine keeps its own
	// time at the steady clock's pace until the wall clock agrees again
	// (a step forward that holds for an hour is followed), and its time
	// does not go backwards, across restarts too, except to follow the
	// correction of a clock that was ahead when the store was opened:
	// docs/operations.md, "Clocks". TrustClock follows Clock as it is,
	// for tests and tools that set a manual clock on purpose.
	ClockTolerance time.Duration

	// Rand supplies the store's secret: 32 bytes, drawn once, by the Open
	// that creates the store (or migrates it from layout 3 or 4), under
	// which the store derives operation ids. A test or a simulation that
	// seeds it gets a deterministic store. Default: crypto/rand.
	Rand io.Reader

	// Lease is the lease a claim gets when ClaimRequest.Lease is zero.
	// Default: 30 s. Longer leases make a crashed holder's key wait longer;
	// shorter ones make takeovers of slow-but-alive holders more likely.
	Lease time.Duration

	// Retention is how long a record of the default retention class
	// (ttl.DefaultClass) is kept and replayed, counted from its
	// completion. Default: 24 h. A retry that arrives later runs as new.
	Retention time.Duration

	// RetentionClasses are further classes a claim may name in
	// ClaimRequest.Retention, for example "money": 30 days. Default: none.
	// It may not redefine ttl.DefaultClass (set Retention instead). A
	// changed window applies to records completed afterwards; a stored
	// record naming a class no longer configured is kept for the longest
	// configured window.
	RetentionClasses ttl.Classes

	// Sweep configures the sweeper that deletes expired records (package
	// ttl): interval (default 10 min), rate (default 50,000 records a
	// second), chunk size, and the wait before retrying a failed pass
	// (default 1 s, doubling up to the interval; each failure is logged).
	// Its Clock is always the engine's. Reads never need it: expired
	// records are absent at once.
	Sweep ttl.Options

	// NoBackgroundSweep stops Open from starting the sweeper; expired
	// records are then deleted only by Engine.Sweep (`idemkv sweep`), and
	// storage grows without bound unless something calls it.
	NoBackgroundSweep bool

	// MinFreeDisk is the free space, in bytes, below which a claim that
	// would acquire fails with idemkv.ErrNoSpace, while replays, reads and
	// work in progress go on: Pebble ends the process when a write fails
	// for lack of space, so refusing new work first keeps the service
	// answering. Read at most once a second. Default: 256 MiB. Negative:
	// never refuse.
	MinFreeDisk int64

	// MaxBodySize bounds Result.Body, in bytes. Default: 64 KiB. Store
	// larger responses as a Result.Pointer instead.
	MaxBodySize int

	// MaxEffectsSize bounds what one operation writes through Effects: the
	// bytes of its keys and values together. Default: 1 MiB. A Set or
	// Delete past it fails with idemkv.ErrInvalidArgument before anything
	// is held or written, so that no batch can outgrow what Pebble commits.
	MaxEffectsSize int

	// MaxEventSize bounds one event emitted through Effects.Emit, encoded
	// (payload, topic, key, headers and about 50 bytes). Default: 512 KiB,
	// under NATS's default message limit of 1 MiB: an event the broker
	// would refuse must be refused at Emit, because the relay never drops
	// an event. Events count towards MaxEffectsSize too.
	MaxEventSize int

	// CacheSize is the Pebble block cache, in bytes. Default: 64 MiB. Claim
	// misses and replays that miss the replay cache read from it.
	CacheSize int64

	// MemTableSize is the size of one Pebble memtable, in bytes. Default:
	// 8 MiB: every claim that reaches Pebble searches the memtable, which
	// is cheaper while it fits the CPU's caches. Larger memtables flush
	// less often and replay longer at Open.
	MemTableSize uint64

	// L0CompactionThreshold is how much overlap Pebble lets level 0 gather
	// before compacting it: it compacts at half this many sublevels and
	// stops writes at three times this many. Default: 16 (Pebble's own is
	// 4). Record keys are random, so every flush overlaps all of the level
	// below; compacting less often rewrites it less often, at the cost of
	// more files for a lookup that reaches Pebble to search.
	L0CompactionThreshold int

	// CompactionConcurrency is the most compactions Pebble runs at once.
	// Default: 1 on one or two cores, else half the cores. Compactions
	// compete with requests for CPU.
	CompactionConcurrency int

	// Compression is the sstable compression profile. Default:
	// sstable.BalancedCompression (zstd level 1 on data blocks), about 40%
	// smaller than Snappy for records; Snappy costs less CPU.
	Compression *sstable.CompressionProfile

	// BloomBitsPerKey sizes the bloom filter on every level, L0 to L6.
	// Default: 10 (about 1% false positives). Most claims look up keys
	// that do not exist, so filters on every level spare most disk reads.
	BloomBitsPerKey int

	// ReplayCacheSize is the memory, in bytes, for recently completed
	// records kept to answer replays without a Pebble read (cache.go),
	// allocated at Open as pointer-free memory the garbage collector never
	// scans, though it counts toward the heap it paces itself by. Default: 128
	// MiB, several hundred thousand records without bodies. Sizes below
	// 512 KiB are rounded up to it; negative disables it.
	ReplayCacheSize int64

	// ClaimFilterBitsPerKey sizes the in-memory bloom filter that answers
	// most claims of new keys without a Pebble lookup (claimfilter.go).
	// Default: 10 bits per key, about 1% of new keys still looked up. It
	// takes about 2.5 bytes per stored record, a quarter more while it is
	// rebuilt; until its first build after Open ends (or it is read from
	// the file the last Close saved), every claim reads Pebble. Negative
	// disables it.
	ClaimFilterBitsPerKey int

	// CheckMemory bounds, in bytes, the memory Engine.Check holds to pair
	// effects with their outcomes: about 48 bytes for each unsettled
	// record and each completed one that wrote effects. A larger store is
	// checked in several passes over one snapshot. Default: 256 MiB (about
	// 5.6 M such records a pass).
	CheckMemory int64

	// Shards is the number of lock stripes of the lease table. Default:
	// 256. More stripes mean less contention between unrelated keys.
	Shards int

	// Logger receives Pebble's log lines. Default: errors and fatal
	// messages to stderr, informational lines dropped.
	Logger pebble.Logger

	// ConfigurePebble, if set, is called with the Pebble options the
	// engine is about to open its store with, after the engine has set its
	// own: it may set what these options do not cover, such as
	// Experimental.CompactionScheduler (package engine/lowprio) or further
	// EventListener callbacks (chain them with pebble.TeeEventListener).
	// It must not change FS, Logger, Cache, Comparer, ReadOnly or
	// FormatMajorVersion, which the engine relies on. It is called once
	// per Open (and per PebbleOptions call).
	ConfigurePebble func(*pebble.Options)

	// claimFilterMinKeys, if positive, replaces minFilterKeys: tests set
	// it low to make the claim filter rebuild often.
	claimFilterMinKeys int64
	// claimFilterGroups, if positive, replaces rebuildGroups.
	claimFilterGroups int

	// ReadOnly opens the store for inspection only: every call that would
	// change it, Claim included, returns ErrReadOnly, and the store's epoch
	// is not advanced.
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
		c.Clock = idemkv.SystemClock{}
	}
	if c.ClockTolerance == 0 {
		c.ClockTolerance = time.Second
	}
	if c.Rand == nil {
		c.Rand = rand.Reader
	}
	if c.Lease == 0 {
		c.Lease = idemkv.DefaultLease
	}
	if c.Retention == 0 {
		c.Retention = idemkv.DefaultRetention
	}
	if c.MinFreeDisk == 0 {
		c.MinFreeDisk = 256 << 20
	}
	if c.MaxBodySize == 0 {
		c.MaxBodySize = idemkv.DefaultMaxBodySize
	}
	if c.MaxEffectsSize == 0 {
		c.MaxEffectsSize = idemkv.DefaultMaxEffectsSize
	}
	if c.MaxEventSize == 0 {
		c.MaxEventSize = idemkv.DefaultMaxEventSize
	}
	if c.CacheSize == 0 {
		c.CacheSize = 64 << 20
	}
	c.RetentionClasses = c.RetentionClasses.WithDefault(c.Retention)
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
	if o.ClockTolerance < 0 && o.ClockTolerance != TrustClock {
		errs = append(errs, fmt.Errorf("ClockTolerance %v is negative (TrustClock is the only negative value)", o.ClockTolerance))
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
	if o.MaxEffectsSize < 0 || o.MaxEffectsSize > 256<<20 {
		errs = append(errs, fmt.Errorf("MaxEffectsSize %d outside 0..256 MiB", o.MaxEffectsSize))
	}
	if o.MaxEventSize < 0 || o.MaxEventSize > 64<<20 {
		errs = append(errs, fmt.Errorf("MaxEventSize %d outside 0..64 MiB", o.MaxEventSize))
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
// bloom filters on every level, compression and compaction concurrency,
// then whatever ConfigurePebble sets. It sets no block cache; Open adds
// one of CacheSize. The benchmark baseline opens its raw Pebble store
// with these, so the two differ only in how they use Pebble. Open also
// sets an EventListener, before ConfigurePebble, to track the store's
// health (Engine.Health) and count its write stalls (Stats.WriteStalls);
// a ConfigurePebble that sets its own should tee it with
// pebble.TeeEventListener.
func (o *Options) PebbleOptions() *pebble.Options { return o.pebbleOptions(nil) }

// pebbleOptions is PebbleOptions with the event listener el, if not nil.
func (o *Options) pebbleOptions(el *pebble.EventListener) *pebble.Options {
	po := &pebble.Options{
		EventListener: el,
		FS:            o.FS,
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
	if o.ConfigurePebble != nil {
		o.ConfigurePebble(po)
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
