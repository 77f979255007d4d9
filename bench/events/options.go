package events

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"github.com/idemkv/idemkv/bench"
)

// Options configure Run. The zero value of every field means the default
// stated on it; Profile returns the standard configurations.
type Options struct {
	// Options are the harness's: directory (the engine's stores and, unless
	// JetStreamDir is set, the JetStream server's), engine options,
	// compaction priority, tenants and progress.
	bench.Options

	// Concurrency is the overhead sweep: the number of concurrent clients
	// at each point. Default: 1, 16, 64, 256.
	Concurrency []int
	// Duration is how long each side of an overhead point runs. Default:
	// 1 s.
	Duration time.Duration
	// Rounds is how many times each overhead point is measured, both
	// sides each time, alternating which side goes first. Default: 2.
	Rounds int
	// OneEntity emits every event with an empty key: one entity for the
	// whole topic, whose sequence the committer finds among the pending
	// writes of the group before, instead of looking up a new key's in
	// Pebble for each event. It separates that lookup's cost. Default:
	// false (each event's key is its payment's id, a new entity).
	OneEntity bool
	// NoRelay runs the overhead points without a relay: the events stay
	// in the outbox and it grows for the whole point. Default: false (a
	// relay into a publisher that acknowledges at once runs on both
	// sides).
	NoRelay bool

	// Rates are the lag measurement's loads, completions (each with one
	// event) a second. Default: 5,000, the guide's.
	Rates []float64
	// LoadDuration is how long each load is offered. Default: 10 s.
	LoadDuration time.Duration
	// Clients is the number of client goroutines that carry the
	// open-loop load: each request starts at its scheduled time if a
	// client is free. Default: 128.
	Clients int
	// CatchUp bounds the wait, after a load, for the relay to publish what
	// is left; events still unpublished then count with the lag they had
	// reached. Default: 2 minutes.
	CatchUp time.Duration
	// Backlog is the number of events the relay-alone measurements drain
	// and JetStream-alone ones publish, and the number of messages the
	// consumers read. Default: 20,000.
	Backlog int
	// Pipeline is how many messages the pipelined JetStream-alone
	// measurement keeps in flight. Default: 256 (the relay's batch).
	Pipeline int
	// JetStreamDir, if set, is where the JetStream server keeps its
	// stream (a temporary directory under it, removed afterwards), to put
	// the broker on another disk than the engine. Default: the run's
	// directory, on the engine's disk, as `idemkv serve --events
	// embedded` does.
	JetStreamDir string
	// NoLag skips the lag, relay-alone and consumer measurements (no
	// JetStream server). Default: false.
	NoLag bool
	// VerifyKeys is how many of an overhead point's completed keys are
	// checked afterwards to replay their result and hold their effect.
	// Default: 256. Negative: none.
	VerifyKeys int
	// FsyncSamples is the number of 4 KiB write + fdatasync pairs timed
	// on the run's disk before the lag measurement. Default: 100.
	FsyncSamples int
}

// profiles are the standard configurations: "quick" (1 s sides, two
// rounds, a 10 s load, a 20,000-event backlog; about 2 minutes on two
// cores) and "full" (5 s sides, three rounds, a 60 s load, a
// 100,000-event backlog; about 8 minutes).
var profiles = map[string]Options{
	"quick": {Options: bench.Options{Profile: "quick"}, Duration: time.Second, Rounds: 2,
		LoadDuration: 10 * time.Second, Backlog: 20_000},
	"full": {Options: bench.Options{Profile: "full"}, Duration: 5 * time.Second, Rounds: 3,
		LoadDuration: time.Minute, Backlog: 100_000},
}

// Profile returns the standard configuration named name, one of
// bench.Profiles.
func Profile(name string) (*Options, error) { return bench.Profile(name, profiles) }

// EnsureDefaults returns a copy of o (which may be nil) with every zero
// field set to its default.
func (o *Options) EnsureDefaults() *Options {
	var c Options
	if o != nil {
		c = *o
	}
	c.Options = *c.Options.EnsureDefaults()
	c.Engine = c.Engine.EnsureDefaults()
	if len(c.Concurrency) == 0 {
		c.Concurrency = []int{1, 16, 64, 256}
	}
	if len(c.Rates) == 0 {
		c.Rates = []float64{5000}
	}
	c.Duration = cmp.Or(c.Duration, time.Second)
	c.Rounds = cmp.Or(c.Rounds, 2)
	c.LoadDuration = cmp.Or(c.LoadDuration, 10*time.Second)
	c.Clients = cmp.Or(c.Clients, 128)
	c.CatchUp = cmp.Or(c.CatchUp, 2*time.Minute)
	c.Backlog = cmp.Or(c.Backlog, 20_000)
	c.Pipeline = cmp.Or(c.Pipeline, 256)
	c.VerifyKeys = cmp.Or(c.VerifyKeys, 256)
	c.FsyncSamples = cmp.Or(c.FsyncSamples, 100)
	return &c
}

// Validate reports options Run cannot use.
func (o *Options) Validate() error {
	errs := []error{o.Options.Validate()}
	for _, n := range o.Concurrency {
		if n < 1 || n > 1<<16 {
			errs = append(errs, fmt.Errorf("concurrency %d outside 1..65536", n))
		}
	}
	for _, r := range o.Rates {
		if !(r >= 1 && r <= 1e6) {
			errs = append(errs, fmt.Errorf("rate %v outside 1..1,000,000 a second", r))
		}
	}
	if o.Duration < 0 || o.LoadDuration < 0 || o.CatchUp < 0 {
		errs = append(errs, errors.New("negative duration"))
	}
	if o.Rounds < 0 || o.Clients < 0 || o.Backlog < 0 || o.Pipeline < 0 || o.FsyncSamples < 0 {
		errs = append(errs, errors.New("negative count"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("bench: events: invalid options: %w", err)
	}
	return nil
}

// loadEvents is the number of requests a load at rate offers.
func (o *Options) loadEvents(rate float64) int {
	return max(1, int(rate*o.LoadDuration.Seconds()))
}

// steps is the number of progress steps of a run with options o.
func (o *Options) steps() int {
	n := 2 * o.Rounds * len(o.Concurrency)
	if !o.NoLag {
		n += len(o.Rates) + 4 + 2
	}
	return n
}
