// Package retention measures how the engine's store behaves under a
// retention window: a steady load of new keys against a short window, long
// enough for several windows to pass, once with the sweeper and once
// without, side by side; then the sweeper's cost on its own; and an
// extrapolation to the guide's 5,000 requests/s and 24 hours. The command
// `idemkv bench ttl` runs it.
//
// # Basics
//
//	o, _ := retention.Profile("quick")
//	rep, err := retention.Run(ctx, o)
//	rep.WriteTable(os.Stdout)
//	rep.Plot("plots")
//
// The run compresses the guide's day: every time constant shrinks with the
// retention (the sweeper's interval is Retention/144, as the engine's 10
// minutes are against 24 hours). In the sweeper run the harness drives the
// passes itself, in alternating slices with passes back to back and with
// none, so that latency with and without the sweeper at work is measured on
// the same store over the same stretch of time.
//
// # Caveats
//
//   - The slices overstate the sweeper's effect: each on-slice also deletes
//     what expired during the off-slice before it, so the sweeper deletes
//     at (on + off) / on times the steady rate while it works.
//   - The memtable must stay small beside the window's live set
//     (Options.MemTableSize), or records never reach the LSM as they do at
//     full scale.
package retention

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/idemkv/idemkv/bench"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/ttl"
)

// Options configure Run. The zero value of every field means the default
// stated on it; Profile returns the standard configurations.
type Options struct {
	// Options are the harness's: directory, engine options (Retention, the
	// sweep options and the clock are set by the run, and a Lease unset or
	// longer than Retention becomes the shorter of 30 s and Retention/2),
	// compaction priority, tenants and progress.
	bench.Options
	// Retention is the records' retention window: the guide's 24 hours,
	// compressed. Default: 60 s.
	Retention time.Duration
	// Periods is how many retention windows each run lasts. Default: 6.
	Periods int
	// Rate is the constant request rate, requests per second (each a new
	// key, claimed and completed, no effect). Default: 5,000, the guide's.
	Rate float64
	// Clients is the number of concurrent clients sharing the rate.
	// Default: 64.
	Clients int
	// SampleEvery is the interval between disk samples. Default: 1 s.
	SampleEvery time.Duration
	// SweepInterval is the sweeper's interval in the measured run. Default:
	// Retention / 144, the ratio of the engine's default interval (10 min)
	// to the guide's 24 h: the run compresses every time constant alike.
	SweepInterval time.Duration
	// SweepRate is the sweeper's rate limit, records examined per second.
	// Default: the engine's default.
	SweepRate float64
	// SweepChunk is the sweeper's chunk size. Default: the engine's.
	SweepChunk int
	// SweepOn and SweepOff are the lengths of the sweeper run's alternating
	// slices, with passes back to back and with none. Default: 5 s each.
	// Each on-slice deletes what expired during the off-slice too, so the
	// sweeper deletes at (on+off)/on times the steady rate while it works:
	// twice with the defaults.
	SweepOn, SweepOff time.Duration
	// NoCompare skips the run without the sweeper (which measures what the
	// sweeper costs the foreground).
	NoCompare bool
	// CostKeys is the number of records the sweeper-cost measurement
	// expires and sweeps. Default: 200,000.
	CostKeys int
	// MemTableSize is the engine's memtable size, unless Engine sets one.
	// Default: the engine's default (8 MiB). Keep it well below the
	// window's live set (rate × retention × about 100 B), so that
	// records, tombstones and compactions go through the LSM as they do at
	// full scale, where the live set dwarfs any memtable; both profiles
	// use 2 MiB (a 5 MB and a 30 MB live set).
	MemTableSize uint64
}

// profiles are the standard configurations: "quick" (10 s windows, 6 of
// them, about 2.5 minutes) and "full" (60 s windows, 6 of them, about 13
// minutes), both with 2 MiB memtables.
var profiles = map[string]Options{
	"quick": {Options: bench.Options{Profile: "quick"}, Retention: 10 * time.Second, CostKeys: 50_000, MemTableSize: 2 << 20},
	"full":  {Options: bench.Options{Profile: "full"}, Retention: time.Minute, CostKeys: 500_000, MemTableSize: 2 << 20},
}

// Profile returns the standard configuration named name, one of
// bench.Profiles.
func Profile(name string) (*Options, error) { return bench.Profile(name, profiles) }

// sweepSlice is the default length of the alternating slices of the
// sweeper run.
const sweepSlice = 5 * time.Second

// EnsureDefaults returns a copy of o (which may be nil) with every zero
// field set to its default.
func (o *Options) EnsureDefaults() *Options {
	var c Options
	if o != nil {
		c = *o
	}
	c.Retention = cmp.Or(c.Retention, time.Minute)
	c.Periods = cmp.Or(c.Periods, 6)
	c.Rate = cmp.Or(c.Rate, 5000)
	c.Clients = cmp.Or(c.Clients, 64)
	c.SampleEvery = cmp.Or(c.SampleEvery, time.Second)
	c.SweepInterval = cmp.Or(c.SweepInterval, max(10*time.Millisecond, c.Retention/144))
	c.SweepOn = cmp.Or(c.SweepOn, sweepSlice)
	c.SweepOff = cmp.Or(c.SweepOff, sweepSlice)
	c.CostKeys = cmp.Or(c.CostKeys, 200_000)
	// The engine's memtable and lease, unless set: a lease must fit in
	// the window. Its other fields are left to engine.Open, since each
	// store sets its own retention.
	var e engine.Options
	if c.Engine != nil {
		e = *c.Engine
	}
	e.MemTableSize = cmp.Or(e.MemTableSize, c.MemTableSize)
	if e.Lease == 0 || e.Lease > c.Retention {
		e.Lease = min(30*time.Second, c.Retention/2)
	}
	c.Engine = &e
	c.Options = *c.Options.EnsureDefaults()
	return &c
}

// Validate reports options Run cannot run.
func (o *Options) Validate() error {
	errs := []error{o.Options.Validate()}
	if o.Retention < 0 || o.Retention > 0 && o.Retention < time.Second {
		errs = append(errs, fmt.Errorf("retention %v under a second (records keep whole seconds)", o.Retention))
	}
	if o.Periods < 0 || o.Periods == 1 {
		errs = append(errs, fmt.Errorf("%d periods; the steady state needs at least 2", o.Periods))
	}
	if o.Rate < 0 || o.Clients < 0 || o.SampleEvery < 0 || o.CostKeys < 0 || o.SweepOn < 0 || o.SweepOff < 0 {
		errs = append(errs, errors.New("rate, clients, sample interval, cost keys and sweep slices must be positive"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("bench: ttl: %w", err)
	}
	return nil
}

// Report is the result of Run. Its JSON field names are stable.
type Report struct {
	Meta  Meta      `json:"meta"`  // the run, the machine and the options
	Runs  []Steady  `json:"runs"`  // "sweeper" first, then "no-sweeper" unless NoCompare
	Cost  SweepCost `json:"cost"`  // the sweeper's cost per record, measured apart
	Guide Guide     `json:"guide"` // the extrapolation to the guide's scale
}

// Meta describes the run: the harness's fields and the options.
type Meta struct {
	bench.Meta
	RetentionSeconds float64 `json:"retention_seconds"`      // the retention window, in seconds
	Periods          int     `json:"periods"`                // the number of windows each run lasted
	Rate             float64 `json:"rate"`                   // the request rate, requests/s
	Clients          int     `json:"clients"`                // the number of concurrent clients
	SweepIntervalSec float64 `json:"sweep_interval_seconds"` // the sweeper's interval, in seconds
	SweepRate        float64 `json:"sweep_rate"`             // the sweeper's rate limit, records examined per second
	// SweepOnSeconds is the length of the sweeper run's slices with passes
	// under way, in seconds.
	SweepOnSeconds  float64 `json:"sweep_on_seconds"`
	SweepOffSeconds float64 `json:"sweep_off_seconds"` // the length of its slices without, in seconds
	// CompactionNice is the nice value of the stores' compactions
	// (Options.CompactionNice; --background-nice), 0 for none.
	CompactionNice int `json:"compaction_nice"`
}

// Run runs the retention measurement o describes (nil: defaults).
func Run(ctx context.Context, opts *Options) (*Report, error) {
	o := opts.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	names := []string{"sweeper"}
	if !o.NoCompare {
		names = append(names, "no-sweeper")
	}
	samples := int(time.Duration(o.Periods) * o.Retention / o.SampleEvery)
	run, err := bench.Start(&o.Options, "bench ttl", len(names)*samples)
	if err != nil {
		return nil, err
	}
	defer run.Close()
	rep := &Report{}
	for _, name := range names {
		rf, err := steadyRun(ctx, o, run, name)
		if err != nil {
			return nil, fmt.Errorf("bench: ttl %s: %w", name, err)
		}
		rep.Runs = append(rep.Runs, rf)
	}
	if rep.Cost, err = sweepCost(ctx, o, run.Dir("cost")); err != nil {
		return nil, fmt.Errorf("bench: ttl cost: %w", err)
	}
	rep.Guide = guide(rep.Runs[0], rep.Cost, o.Engine)
	rep.Meta = Meta{Meta: run.Meta(), RetentionSeconds: o.Retention.Seconds(), Periods: o.Periods, Rate: o.Rate,
		Clients: o.Clients, SweepIntervalSec: o.SweepInterval.Seconds(),
		SweepRate:      (&ttl.Options{Rate: o.SweepRate}).EnsureDefaults().Rate,
		SweepOnSeconds: o.SweepOn.Seconds(), SweepOffSeconds: o.SweepOff.Seconds(),
		CompactionNice: o.CompactionNice}
	return rep, nil
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error { return bench.WriteJSON(w, r) }
