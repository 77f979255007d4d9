package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/idemkv/idemkv/bench"
	"github.com/idemkv/idemkv/bench/events"
)

func init() {
	register(&command{
		name:    "bench events",
		args:    "[--profile quick|full] [--concurrency 1,16,64,256] [--duration D] [--rounds N] [--no-relay] [--one-entity] [--rates R,...] [--load-duration D] [--clients N] [--backlog N] [--jetstream-dir DIR] [--no-lag] [--data DIR] [--json FILE]",
		summary: "measure completions with an event against without, the outbox relay's lag and throughput to JetStream, and an inbox consumer (docs/benchmarks.md)",
		flags:   benchEventsFlags,
	})
}

func benchEventsFlags(fs *flag.FlagSet) func(context.Context, io.Writer) error {
	profile := "quick"
	var (
		concurrency          []int
		duration, loadFor    time.Duration
		rounds, clients      int
		backlog              int
		rates                []float64
		noRelay, noLag, one  bool
		data, jsDir, jsonOut string
		pf                   pebbleFlags
		bg                   backgroundFlags
	)
	profileFlag(fs, &profile, "`quick` (1 s sides, a 10 s load, about 2 minutes) or full (5 s sides, a 60 s load, about 8 minutes) (default quick)")
	intsFlag(fs, "concurrency", "comma-separated `list` of concurrent clients of the overhead points (default 1,16,64,256)",
		1, 1<<16, "bad concurrency %q (want 1..65536)", &concurrency)
	durationFlag(fs, "duration", "how long each side of an overhead point runs, for example 2s (default: the profile's)", 1, &duration)
	fs.IntVar(&rounds, "rounds", 0, "how many times each overhead point runs both sides, alternating which goes first (default: the profile's)")
	fs.BoolVar(&one, "one-entity", false, "emit every event with an empty key (one entity) instead of its payment's id, to separate the cost of looking up a new entity's sequence")
	fs.BoolVar(&noRelay, "no-relay", false, "run the overhead points without a relay (the outbox grows) instead of one into a publisher with no broker")
	fs.Func("rates", "comma-separated `list` of open-loop loads relayed to JetStream, completions a second (default 5000, the guide's)", func(s string) error {
		var rs []float64
		for _, part := range strings.Split(s, ",") {
			v, err := strconv.ParseFloat(part, 64)
			if err != nil || v < 1 || v > 1e6 {
				return fmt.Errorf("bad rate %q (want 1..1000000)", part)
			}
			rs = append(rs, v)
		}
		rates = rs
		return nil
	})
	durationFlag(fs, "load-duration", "how long each load is offered (default: the profile's, 10s for quick)", 1, &loadFor)
	fs.IntVar(&clients, "clients", 0, "client goroutines that carry a load (default 128)")
	fs.IntVar(&backlog, "backlog", 0, "events of each drain of the relay and of JetStream alone, and messages the consumers read (default: the profile's)")
	fs.StringVar(&jsDir, "jetstream-dir", "", "keep the JetStream server's store in a temporary directory under `DIR` (default: the run's directory, on the engine's disk)")
	fs.BoolVar(&noLag, "no-lag", false, "skip the loads, drains and consumers (no JetStream server)")
	pf.register(fs)
	bg.register(fs, false)
	fs.StringVar(&data, "data", "", "create the stores in a temporary directory under `DIR` (removed afterwards)")
	fs.StringVar(&jsonOut, "json", "", "write every figure as JSON to `FILE`")
	return func(ctx context.Context, stdout io.Writer) error {
		cfg, err := events.Profile(profile)
		if err != nil {
			return err
		}
		cfg.Concurrency, cfg.Rates, cfg.Clients, cfg.NoRelay, cfg.NoLag = concurrency, rates, clients, noRelay, noLag
		cfg.OneEntity = one
		cfg.Dir, cfg.JetStreamDir = data, jsDir
		if duration > 0 {
			cfg.Duration = duration
		}
		if loadFor > 0 {
			cfg.LoadDuration = loadFor
		}
		if rounds != 0 {
			cfg.Rounds = rounds
		}
		if backlog != 0 {
			cfg.Backlog = backlog
		}
		if err := bg.validate(); err != nil {
			return usageError{err}
		}
		if err := cfg.Validate(); err != nil {
			return usageError{err}
		}
		cfg.Engine = pf.apply(cfg.Engine)
		bg.setProcs()
		cfg.CompactionNice = bg.nice
		return measureAndReport(stdout, os.Stderr, "bench events", jsonOut, func(progress func(bench.Progress)) (*events.Report, error) {
			cfg.Progress = progress
			return events.Run(ctx, cfg)
		}, nil)
	}
}
