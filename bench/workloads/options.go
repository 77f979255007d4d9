package workloads

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/idemkv/idemkv/bench"
)

// Options configure a run. The zero value of every field means the
// default stated on it; Profile returns the standard configurations.
type Options struct {
	// Options are the harness's: directory, engine options (both targets
	// read the same Pebble settings; Engine.FS, if set, is wrapped by the
	// sync counter), compaction priority, tenants and progress.
	bench.Options

	// Workloads to run, by name (see Names). Default: all of them.
	Workloads []string
	// Concurrency is the sweep: the number of concurrent clients at each
	// point. Default: 1, 16, 64, 256.
	Concurrency []int
	// Duration is how long each point runs. Default: 1 s.
	Duration time.Duration
	// Targets are the stores measured. Default: engineTarget(Engine),
	// baselineTarget(Engine). Comparisons relate the first to the second.
	Targets []Target
	// MoreTargets are measured after Targets, each point beside them
	// (PostgresTarget, say).
	MoreTargets []Target

	// RetryFraction is the share of retry-workload requests that re-send a
	// recent key. Default: 0.25.
	RetryFraction float64
	// HotDuplicates is how many requests the hot workload sends per key.
	// Default: 32.
	HotDuplicates int
	// PreloadKeys is the number of completed keys loaded for the replay and
	// mismatch workloads. Default: 10,000.
	PreloadKeys int
	// RemoteLatency is the simulated downstream call of the remote
	// workload, made between the durable claim and the completion and
	// included in its latency. Default: 0 (no call; measures the store).
	RemoteLatency time.Duration

	// ScaleKeys, if set, adds the scale measurement: for each N, a store
	// of the first target is seeded with N completed records (flushed and
	// compacted) and the unique workload measured on it at
	// ScaleConcurrency. Default: none.
	ScaleKeys []int
	// ScaleConcurrency is the concurrency of the scale points. Default: 64.
	ScaleConcurrency int
	// ScaleRounds is how many times each scale store is measured. Rounds
	// alternate the sizes, and each point runs on a fresh checkpoint of
	// the loaded store, so that every round starts from the same state
	// and the sizes share the machine's slow and fast minutes. Default: 1.
	ScaleRounds int

	// SizingKeys is the number of completed records (status and 32-byte
	// pointer, no body) loaded into a fresh store of each target to measure
	// bytes per key. Default: 20,000. Negative: no sizing run.
	SizingKeys int
	// BodyKeys is the number of records loaded with a BodyBytes body to
	// measure bytes per key with stored responses. Default: 2,000.
	// Negative: not measured.
	BodyKeys int
	// BodyBytes is the size of the stored response body of the body sizing
	// run. Default: 2,048.
	BodyBytes int
	// VerifyKeys is how many of a point's acknowledged keys are checked
	// afterwards to replay their stored result (and, for local effects, to
	// hold their effect). Default: 1,000. Negative: all of them.
	VerifyKeys int
	// FsyncSamples is the number of 4 KiB write + fdatasync pairs timed to
	// measure the disk, half before the sweep and half after it. Default:
	// 200.
	FsyncSamples int
}

// profiles are the standard configurations:
//
//   - "quick": every workload at concurrency 1, 16, 64 and 256 for 0.75 s
//     per point, 5,000 preloaded keys, sizing on 20,000 keys (2,000 with
//     bodies). About a minute on two cores.
//   - "full": every workload at the same points for 10 s each, 200,000
//     preloaded keys, sizing on 1,000,000 keys (50,000 with bodies). About
//     10 to 15 minutes on two cores with a fast disk.
var profiles = map[string]Options{
	"quick": {Options: bench.Options{Profile: "quick"}, Duration: 750 * time.Millisecond, PreloadKeys: 5_000,
		SizingKeys: 20_000, BodyKeys: 2_000},
	"full": {Options: bench.Options{Profile: "full"}, Duration: 10 * time.Second, PreloadKeys: 200_000,
		SizingKeys: 1_000_000, BodyKeys: 50_000},
}

// Profile returns the standard configuration named name, one of
// bench.Profiles: "quick" (about a minute on two cores) or "full" (10 to
// 15 minutes).
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
	if len(c.Workloads) == 0 {
		c.Workloads = Names()
	}
	if len(c.Concurrency) == 0 {
		c.Concurrency = []int{1, 16, 64, 256}
	}
	if len(c.Targets) == 0 {
		c.Targets = []Target{engineTarget(c.Engine), baselineTarget(c.Engine)}
	}
	c.Targets = append(slices.Clip(c.Targets), c.MoreTargets...)
	c.MoreTargets = nil
	c.Duration = cmp.Or(c.Duration, time.Second)
	c.RetryFraction = cmp.Or(c.RetryFraction, 0.25)
	c.HotDuplicates = cmp.Or(c.HotDuplicates, 32)
	c.PreloadKeys = cmp.Or(c.PreloadKeys, 10_000)
	c.ScaleConcurrency = cmp.Or(c.ScaleConcurrency, 64)
	c.ScaleRounds = cmp.Or(c.ScaleRounds, 1)
	c.SizingKeys = cmp.Or(c.SizingKeys, 20_000)
	c.BodyKeys = cmp.Or(c.BodyKeys, 2_000)
	c.BodyBytes = cmp.Or(c.BodyBytes, 2_048)
	c.VerifyKeys = cmp.Or(c.VerifyKeys, 1_000)
	c.FsyncSamples = cmp.Or(c.FsyncSamples, 200)
	return &c
}

// Validate reports options Run cannot use.
func (o *Options) Validate() error {
	errs := []error{o.Options.Validate()}
	for _, name := range o.Workloads {
		if workloadByName(name) == nil {
			errs = append(errs, fmt.Errorf("unknown workload %q (have %v)", name, Names()))
		}
	}
	for _, n := range o.Concurrency {
		if n < 1 || n > 1<<16 {
			errs = append(errs, fmt.Errorf("concurrency %d outside 1..65536", n))
		}
	}
	if o.RetryFraction < 0 || o.RetryFraction > 1 {
		errs = append(errs, fmt.Errorf("retry fraction %v outside 0..1", o.RetryFraction))
	}
	if o.Duration < 0 || o.RemoteLatency < 0 {
		errs = append(errs, errors.New("negative duration"))
	}
	if o.HotDuplicates < 0 || o.PreloadKeys < 0 || o.BodyBytes < 0 || o.FsyncSamples < 0 ||
		o.ScaleRounds < 0 || o.ScaleConcurrency < 0 {
		errs = append(errs, errors.New("negative count"))
	}
	for _, n := range o.ScaleKeys {
		if n <= 0 {
			errs = append(errs, fmt.Errorf("scale of %d keys", n))
		}
	}
	if len(o.Targets) == 1 {
		errs = append(errs, errors.New("one target: nothing to compare"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("bench: invalid options: %w", err)
	}
	return nil
}

// steps is the number of steps of a run with options o.
func (o *Options) steps() int {
	n := len(o.Workloads) * len(o.Concurrency) * len(o.Targets)
	if o.SizingKeys > 0 {
		n += len(o.Targets)
	}
	if o.BodyKeys > 0 {
		n += len(o.Targets)
	}
	return n + (1+o.ScaleRounds)*len(o.ScaleKeys)
}
