package main

import (
	"context"
	"flag"
	"io"
	"os"
	"time"

	"github.com/idemkv/idemkv/bench"
	"github.com/idemkv/idemkv/bench/retention"
)

func init() {
	register(&command{
		name:    "bench ttl",
		args:    "[--profile quick|full] [--retention D] [--periods N] [--rate R] [--no-compare] [--gomaxprocs N] [--background-nice N] [--data DIR] [--json FILE] [--plot DIR]",
		summary: "measure retention: disk usage over several windows with and without the sweeper, and the sweeper's cost (docs/benchmarks.md)",
		flags:   benchTTLFlags,
	})
}

func benchTTLFlags(fs *flag.FlagSet) func(context.Context, io.Writer) error {
	profile := "quick"
	var (
		window, interval    time.Duration
		sweepOn, sweepOff   time.Duration
		periods, chunk      int
		rate, sweepRate     float64
		noCompare           bool
		data, jsonOut, plot string
		bg                  backgroundFlags
	)
	profileFlag(fs, &profile, "`quick` (10 s windows, about 2.5 minutes) or full (60 s windows, about 13 minutes) (default quick)")
	fs.DurationVar(&window, "retention", 0, "the retention window (default: the profile's)")
	fs.IntVar(&periods, "periods", 0, "how many windows each run lasts (default 6)")
	fs.Float64Var(&rate, "rate", 0, "constant requests per second (default 5000, the guide's)")
	fs.DurationVar(&interval, "sweep-interval", 0, "the sweeper's interval (default retention/144, the engine's 10 minutes against 24 hours)")
	fs.Float64Var(&sweepRate, "sweep-rate", 0, "the sweeper's records examined per second (default the engine's)")
	fs.BoolVar(&noCompare, "no-compare", false, "skip the run without the sweeper")
	fs.DurationVar(&sweepOn, "sweep-on", 0, "the sweeper run's slices with passes under way (default 5s)")
	fs.DurationVar(&sweepOff, "sweep-off", 0, "the sweeper run's slices without (default 5s); the sweeper deletes at (on+off)/on times the steady rate while it works")
	var memtable uint64
	fs.IntVar(&chunk, "sweep-chunk", 0, "the sweeper's records per chunk (default the engine's)")
	fs.Uint64Var(&memtable, "memtable", 0, "the engine's memtable size in bytes (default: the profile's)")
	bg.register(fs, true)
	fs.StringVar(&data, "data", "", "create the stores in a temporary directory under `DIR` (removed afterwards)")
	fs.StringVar(&jsonOut, "json", "", "write every figure as JSON to `FILE`")
	fs.StringVar(&plot, "plot", "", "write ttl-disk.png into `DIR`")
	return func(ctx context.Context, stdout io.Writer) error {
		cfg, err := retention.Profile(profile)
		if err != nil {
			return err
		}
		if window != 0 {
			cfg.Retention = window
		}
		cfg.Periods, cfg.Rate, cfg.SweepInterval, cfg.SweepRate = periods, rate, interval, sweepRate
		cfg.NoCompare, cfg.Dir = noCompare, data
		cfg.SweepChunk = chunk
		cfg.SweepOn, cfg.SweepOff = sweepOn, sweepOff
		if memtable != 0 {
			cfg.MemTableSize = memtable
		}
		if err := bg.validate(); err != nil {
			return usageError{err}
		}
		if err := cfg.Validate(); err != nil {
			return usageError{err}
		}
		bg.setProcs()
		cfg.CompactionNice = bg.nice
		return measureAndReport(stdout, os.Stderr, "bench ttl", jsonOut, func(progress func(bench.Progress)) (*retention.Report, error) {
			cfg.Progress = progress
			return retention.Run(ctx, cfg)
		}, func(rep *retention.Report) error {
			if plot == "" {
				return nil
			}
			_, err := rep.Plot(plot)
			return err
		})
	}
}
