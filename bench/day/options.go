package day

import (
	"errors"
	"fmt"
	"time"

	"github.com/idemkv/idemkv/bench"
)

// guideRate is the guide's rate of unsafe requests, per second.
const guideRate = 5000

// guideRecords is what a day at guideRate leaves with a 24 h retention.
const guideRecords = guideRate * 24 * 60 * 60

// Options configure a day run. The zero value of every field means the
// default stated on it (the "day" profile's).
type Options struct {
	bench.Options
	// Records is the size of the large store. Default: guideRecords.
	Records int64
	// Small is the size of the store it is compared with. Default: 1 M.
	Small int64
	// Rate is the open-loop phase's requests per second. Default: guideRate.
	Rate float64
	// Duration is how long the open-loop phase runs on each store.
	// Default: 10 minutes.
	Duration time.Duration
	// Window is the span each latency point of the open-loop phase covers.
	// Default: 10 s.
	Window time.Duration
	// Clients are the closed-loop phase's concurrencies. Default: 64, 256.
	Clients []int
	// Point is how long each closed-loop point runs. Default: 30 s.
	Point time.Duration
	// Rounds is how many times each closed-loop point is measured on each
	// store, alternating stores. Default: 2.
	Rounds int
	// Retries and Duplicates are the shares of the open-loop requests that
	// retry a key completed earlier in the run and that arrive twice at
	// once. Defaults: 0.05 and 0.02.
	Retries, Duplicates float64
	// SweepInterval is the sweeper's interval during the run: short, so
	// that it drops the bucket that ends halfway through the open-loop
	// phase. Default: 1 minute.
	SweepInterval time.Duration
	// Store, if set, is where the large store is kept: a store a previous
	// run left there (for the same Records) is used as it is, and a new
	// one is left there. A store used again goes on from the time its last
	// run left it at (a store's clock does not go back), so the bucket
	// that ended halfway through the first run's open-loop phase is gone,
	// and the sweeper has nothing to drop: measure the sweeper on a store
	// loaded afresh. Default: the run's temporary directory.
	Store string
	// ScanRestart also measures an Open without the saved claim filter,
	// which rebuilds it by scanning (what a crash costs).
	ScanRestart bool
	// MemoryLimit is the Go memory limit (runtime/debug.SetMemoryLimit)
	// of the measured phases, in bytes: the restart, Check and Backup, the
	// open-loop and the closed-loop phases. Run sets it after the loads,
	// not before: the loader is a one-off batch job whose heap is not what
	// a serving process holds, and a limit sized for the service would
	// only make the collector run back to back through it. Zero leaves
	// the process's limit as it is (GOMEMLIMIT's, or none); a negative
	// value removes any limit. Run puts back the limit it found when it
	// returns. The report gives the limit in effect (ReportOptions).
	MemoryLimit int64
	// Child, if set, is the command (its path and arguments) that runs
	// each measured phase in a process of its own, so that the memory
	// figures are those of a process that only opened the store and
	// served it, not the harness's, which the loads and the other phases
	// left larger. The command must call ServePhase with the options the
	// run has, Child aside; it reads the phase from its standard input and
	// writes what it measured to file descriptor 3. Default: every phase
	// runs in the harness's process.
	Child []string
	// Log, if set, gets a line for each long phase's progress, and the
	// lines a Child writes.
	Log func(string)
}

// profiles are the standard configurations: "day", the guide's full day,
// and "quick", the same run on small stores for a minute.
var profiles = map[string]Options{
	"day": {Options: bench.Options{Profile: "day"}},
	"quick": {Options: bench.Options{Profile: "quick"}, Records: 1_000_000, Small: 100_000,
		Duration: 6 * time.Second, Window: time.Second, Point: 2 * time.Second, Rounds: 1,
		SweepInterval: time.Second},
}

// Profile returns a copy of the profile named name.
func Profile(name string) (*Options, error) {
	o, ok := profiles[name]
	if !ok {
		return nil, fmt.Errorf("bench: unknown profile %q (want day or quick)", name)
	}
	return &o, nil
}

// EnsureDefaults returns a copy of o with every zero field set.
func (o *Options) EnsureDefaults() *Options {
	c := *o
	c.Options = *c.Options.EnsureDefaults()
	if c.Records == 0 {
		c.Records = guideRecords
	}
	if c.Small == 0 {
		c.Small = 1_000_000
	}
	if c.Rate == 0 {
		c.Rate = guideRate
	}
	if c.Duration == 0 {
		c.Duration = 10 * time.Minute
	}
	if c.Window == 0 {
		c.Window = 10 * time.Second
	}
	if c.Clients == nil {
		c.Clients = []int{64, 256}
	}
	if c.Point == 0 {
		c.Point = 30 * time.Second
	}
	if c.Rounds == 0 {
		c.Rounds = 2
	}
	if c.Retries == 0 {
		c.Retries = 0.05
	}
	if c.Duplicates == 0 {
		c.Duplicates = 0.02
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = time.Minute
	}
	return &c
}

// Validate reports options a run cannot use.
func (o *Options) Validate() error {
	errs := []error{o.Options.Validate()}
	if o.Records < 0 || o.Small < 0 || o.Small > o.Records && o.Records > 0 {
		errs = append(errs, fmt.Errorf("bad store sizes %d and %d (want 0 <= small <= records)", o.Small, o.Records))
	}
	if o.Rate < 0 || o.Retries < 0 || o.Duplicates < 0 || o.Retries+o.Duplicates >= 1 {
		errs = append(errs, errors.New("bad rate or shares"))
	}
	for _, c := range o.Clients {
		if c < 1 {
			errs = append(errs, fmt.Errorf("bad clients %d", c))
		}
	}
	return errors.Join(errs...)
}
