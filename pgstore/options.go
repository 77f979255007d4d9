package pgstore

import (
	"errors"
	"fmt"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/ttl"
)

// Options configure a Store. The zero value (or nil) gives the defaults.
type Options struct {
	// Clock supplies the time of leases, retention and record timestamps.
	// Default: the database's clock (clock_timestamp()), read at Open and
	// every 10 s and carried forward between reads on the process's
	// monotonic clock, so every process sharing the database decides by
	// one clock, whatever its own wall clock says. A Clock set here is
	// read instead: tests inject a manual one; idemkv.SystemClock{} makes
	// each process read its own wall clock, which then must agree with
	// the others' to well within the lease.
	Clock idemkv.Clock
	// local is the process's clock under the database's (time.Now when
	// nil): a test skews it to stand for a process whose clock is wrong.
	local func() time.Time
	// Lease is the default lease of a claim. Default 30 s.
	Lease time.Duration
	// Retention is how long a record of the default retention class is
	// kept and replayed after it completes. Default 24 h.
	Retention time.Duration
	// RetentionClasses are further classes a claim may name. A record
	// naming a class no longer configured is kept for the longest window.
	RetentionClasses ttl.Classes
	// MaxBodySize bounds Result.Body. Default 64 KiB.
	MaxBodySize int
	// MaxEffectsSize bounds one operation's writes and events together.
	// Default 1 MiB.
	MaxEffectsSize int
	// MaxEventSize bounds one event (topic, key, payload and headers).
	// Default 512 KiB.
	MaxEventSize int
	// MaxConns is the size of the connection pool. Default: pgxpool's
	// (the larger of 4 and the number of CPUs), or pool_max_conns in the
	// connection string. The outbox's listener (unless NoListen) keeps one
	// more connection, outside the pool.
	MaxConns int32
	// OutboxPoll is how often OutboxNotify fires without a notification,
	// so that a relay finds events committed by other processes even where
	// LISTEN is unavailable (CockroachDB) or a notification was missed
	// across a reconnection. Default 1 s.
	OutboxPoll time.Duration
	// Sweep configures the sweeper that deletes completed records past
	// their expiry (package ttl); its Clock is Options.Clock.
	Sweep ttl.Options
	// NoBackgroundSweep stops Open from starting the sweeper; expired
	// records are then deleted only by Store.Sweep. Every process sharing
	// a database may sweep it: their deletions do not conflict.
	NoBackgroundSweep bool
	// RelayLease is how long the outbox stays with the store whose relay
	// last read it: the relays of the other processes sharing the
	// database read nothing meanwhile, so that no two publish the same
	// events at once, and one takes over when the lease runs out (or at
	// once, when its holder closes). Default 10 s.
	RelayLease time.Duration
	// NoListen turns LISTEN off (CockroachDB has no LISTEN/NOTIFY); the
	// relay then finds other processes' events by OutboxPoll alone.
	NoListen bool

	// readCommittedData runs writes of data keys that read nothing at
	// READ COMMITTED, as the store once did (tests: the serializability
	// model must find the anomaly it allowed).
	readCommittedData bool
	// listenCheck, if set, replaces the listener's listenCheck (tests).
	listenCheck time.Duration
}

// maxConflictRuns bounds the runs of an operation that read and failed
// to serialize: then something it read kept changing (ErrConflict).
// maxBlindRuns bounds those of an operation that read nothing, which
// fails to serialize only over PostgreSQL's locks on the index pages the
// store's own statements read (neighbouring keys), or as the side SSI
// aborts of a conflict with a reader: running it again is always right,
// and its caller has nothing to resolve.
const (
	maxConflictRuns = 16
	maxBlindRuns    = 1000
)

func (o *Options) withDefaults() *Options {
	var c Options
	if o != nil {
		c = *o
	}
	if c.Lease == 0 {
		c.Lease = idemkv.DefaultLease
	}
	if c.Retention == 0 {
		c.Retention = idemkv.DefaultRetention
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
	if c.OutboxPoll == 0 {
		c.OutboxPoll = time.Second
	}
	if c.RelayLease == 0 {
		c.RelayLease = 10 * time.Second
	}
	c.RetentionClasses = c.RetentionClasses.WithDefault(c.Retention)
	return &c
}

func (o *Options) validate() error {
	var errs []error
	if o.Lease < 0 {
		errs = append(errs, fmt.Errorf("Lease %v is negative", o.Lease))
	}
	if o.Retention < 0 {
		errs = append(errs, fmt.Errorf("Retention %v is negative", o.Retention))
	}
	if o.Lease > o.Retention {
		errs = append(errs, fmt.Errorf("Lease %v exceeds Retention %v", o.Lease, o.Retention))
	}
	if o.MaxBodySize < 0 || o.MaxEffectsSize < 0 || o.MaxEventSize < 0 || o.MaxConns < 0 || o.OutboxPoll < 0 || o.RelayLease < 0 {
		errs = append(errs, errors.New("a negative size, pool size or interval"))
	}
	if err := o.Sweep.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := o.RetentionClasses.Validate(); err != nil {
		errs = append(errs, err)
	}
	if w := o.RetentionClasses[ttl.DefaultClass]; w != o.Retention {
		errs = append(errs, fmt.Errorf("RetentionClasses redefines the default class (%v); set Retention", w))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: pgstore options: %w", idemkv.ErrInvalidArgument, err)
	}
	return nil
}
