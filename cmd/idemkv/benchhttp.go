package main

import (
	"context"
	"flag"
	"io"
	"os"
	"time"

	"github.com/idemkv/idemkv/bench"
	"github.com/idemkv/idemkv/bench/httpoverhead"
)

func init() {
	register(&command{
		name:    "bench http",
		args:    "[--profile quick|full] [--rate R] [--clients N] [--slice D] [--slices N] [--l0-compaction-threshold N] [--gomaxprocs N] [--background-nice N] [--data DIR] [--json FILE]",
		summary: "measure the HTTP middleware's latency overhead over a bare handler on loopback (docs/benchmarks.md)",
		flags:   benchHTTPFlags,
	})
}

func benchHTTPFlags(fs *flag.FlagSet) func(context.Context, io.Writer) error {
	profile := "quick"
	var (
		rate          float64
		clients, n    int
		slice         time.Duration
		data, jsonOut string
		pf            pebbleFlags
		bg            backgroundFlags
	)
	profileFlag(fs, &profile, "`quick` (3 s slices, about 25 s) or full (10 s slices, about 2.5 minutes) (default quick)")
	fs.Float64Var(&rate, "rate", 0, "requests per second (default 5000, the guide's)")
	fs.IntVar(&clients, "clients", 0, "concurrent clients (default 64)")
	fs.DurationVar(&slice, "slice", 0, "how long each handler is driven at a time (default: the profile's)")
	fs.IntVar(&n, "slices", 0, "measured slices per handler (default: the profile's)")
	pf.register(fs)
	bg.register(fs, true)
	fs.StringVar(&data, "data", "", "create the stores in a temporary directory under `DIR` (removed afterwards)")
	fs.StringVar(&jsonOut, "json", "", "write every figure as JSON to `FILE`")
	return func(ctx context.Context, stdout io.Writer) error {
		cfg, err := httpoverhead.Profile(profile)
		if err != nil {
			return err
		}
		cfg.Rate, cfg.Clients, cfg.Dir = rate, clients, data
		if err := bg.validate(); err != nil {
			return usageError{err}
		}
		cfg.Engine = pf.apply(cfg.Engine)
		bg.setProcs()
		cfg.CompactionNice = bg.nice
		if slice != 0 {
			cfg.Slice = slice
		}
		if n != 0 {
			cfg.Slices = n
		}
		if err := cfg.Validate(); err != nil {
			return usageError{err}
		}
		return measureAndReport(stdout, os.Stderr, "bench http", jsonOut, func(progress func(bench.Progress)) (*httpoverhead.Report, error) {
			cfg.Progress = progress
			return httpoverhead.Run(ctx, cfg)
		}, nil)
	}
}
