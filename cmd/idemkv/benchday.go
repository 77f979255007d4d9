package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/idemkv/idemkv/bench"
	"github.com/idemkv/idemkv/bench/day"
	"github.com/idemkv/idemkv/engine"
)

// runDay runs `bench --profile day`: the store of a full day at the
// guide's rate (package bench/day). Its long phases print a line each to
// stderr as they go, terminal or not: a run takes hours.
func runDay(ctx context.Context, f benchFlags, stdout io.Writer, stderr *os.File) error {
	cfg, err := day.Profile("day")
	if err != nil {
		return err
	}
	cfg.Records, cfg.Store, cfg.ScanRestart, cfg.MemoryLimit = f.day.Records, f.day.Store, f.day.ScanRestart, f.day.MemoryLimit
	if f.duration > 0 {
		cfg.Duration = f.duration
	}
	if f.concurrency != nil {
		cfg.Clients = f.concurrency
	}
	cfg.Dir = f.data
	if f.claimFilterBits != 0 {
		cfg.Engine = &engine.Options{ClaimFilterBitsPerKey: f.claimFilterBits}
	}
	cfg.Engine = f.pebble.apply(cfg.Engine)
	if err := cfg.EnsureDefaults().Validate(); err != nil {
		return usageError{err}
	}
	if err := f.bg.validate(); err != nil {
		return usageError{err}
	}
	if f.bg != (backgroundFlags{}) { // --gomaxprocs, --background-nice: as serve runs
		if cfg.Engine, _, err = f.bg.apply(cfg.Engine); err != nil {
			return err
		}
	}
	if f.dayPhase {
		cfg.Log = func(line string) { fmt.Fprintln(stderr, line) }
		return day.ServePhase(ctx, cfg, os.Stdin, os.NewFile(3, "phase result"))
	}
	// Each measured phase runs in a process of its own: this command line
	// again, told so by --phase-child.
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cfg.Child = append(append([]string{exe}, os.Args[1:]...), "--phase-child")
	start := time.Now()
	cfg.Log = func(line string) {
		fmt.Fprintf(stderr, "%s +%v %s\n", time.Now().UTC().Format("15:04:05"), time.Since(start).Round(time.Second), line)
	}
	return measureAndReport(stdout, stderr, "bench day", f.json, func(progress func(bench.Progress)) (*day.Report, error) {
		cfg.Progress = progress
		return day.Run(ctx, cfg)
	}, func(rep *day.Report) error {
		if f.plot == "" {
			return nil
		}
		_, err := rep.Plot(f.plot)
		return err
	})
}
