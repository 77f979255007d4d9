package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2/sstable/block"
	"github.com/idemkv/idemkv/bench"
	"github.com/idemkv/idemkv/bench/day"
	"github.com/idemkv/idemkv/bench/workloads"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/pgstore/pgtest"
	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

func init() {
	register(&command{
		name:    "bench",
		args:    "[--profile quick|full|day] [--workloads unique,retry,...] [--concurrency 1,16,64,256] [--duration D] [--data DIR] [--scale N,...] [--scale-rounds R] [--postgres] [--records N] [--store DIR] [--scan-restart] [--memory-limit SIZE] [--json FILE] [--plot DIR]",
		summary: "measure the engine against a hand-written raw-Pebble baseline, side by side; --profile day: the guide's full day of records on one node (docs/benchmarks.md)",
		flags:   benchWorkloadsFlags,
	})
}

func benchWorkloadsFlags(fs *flag.FlagSet) func(context.Context, io.Writer) error {
	f := benchFlags{profile: "quick"}
	fs.Func("profile", "`quick` (about a minute) or full (10 to 15 minutes): durations, preload and sizing sizes; or day: a store of the guide's 432 M records, loaded, restarted, checked and run at 5,000 requests/s beside a 1 M store (about two hours, 35 GB of disk) (default quick)", func(s string) error {
		if !slices.Contains(bench.Profiles(), s) && s != "day" {
			return errors.New("want quick, full or day")
		}
		f.profile = s
		return nil
	})
	fs.Int64Var(&f.day.Records, "records", 0, "with --profile day: the large store's records (default 432000000)")
	fs.StringVar(&f.day.Store, "store", "", "with --profile day: keep the large store in `DIR`, and use the one an earlier run left there (default: a temporary directory)")
	fs.BoolVar(&f.day.ScanRestart, "scan-restart", false, "with --profile day: also measure a restart without the saved claim filter (a scan of every record key)")
	fs.BoolVar(&f.dayPhase, "phase-child", false, "with --profile day: run one measured phase, as the harness that starts this process asks on its standard input (the harness runs each phase so, in a process of its own)")
	fs.Func("memory-limit", "with --profile day: the Go memory limit of the measured phases, set after the loads, for example 1800MiB or 2GB; 0 for none (default: GOMEMLIMIT's, if set)", func(s string) error {
		n, err := parseByteSize(s)
		if err != nil {
			return err
		}
		f.day.MemoryLimit = n
		if n == 0 {
			f.day.MemoryLimit = -1 // none, GOMEMLIMIT's removed
		}
		return nil
	})
	fs.Func("workloads", "comma-separated `list` of workloads to run: "+strings.Join(workloads.Names(), ",")+" (default all)", func(s string) error {
		names := strings.Split(s, ",")
		for _, n := range names {
			if !slices.Contains(workloads.Names(), n) {
				return fmt.Errorf("unknown workload %q", n)
			}
		}
		f.workloads = names
		return nil
	})
	intsFlag(fs, "concurrency", "comma-separated `list` of concurrent clients per point (default 1,16,64,256)",
		1, 1<<16, "bad concurrency %q (want 1..65536)", &f.concurrency)
	durationFlag(fs, "duration", "how long each point runs, for example 2s (default: the profile's)", 1, &f.duration)
	fs.Func("retry-fraction", "share of retry-workload requests that re-send a recent key, 0..1 (default 0.25)", func(s string) error {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || v <= 0 || v > 1 {
			return fmt.Errorf("bad fraction %q (want a number in (0, 1])", s)
		}
		f.retryFraction = v
		return nil
	})
	durationFlag(fs, "remote-latency", "simulated downstream call of the remote workload, for example 5ms (default 0)", 0, &f.remoteLatency)
	intsFlag(fs, "scale", "comma-separated `list` of live-key counts: also measure unique at 64 clients on the engine over stores bulk-loaded with each, for example 1000000,20000000 (default none)",
		1, math.MaxInt, "bad key count %q", &f.scale)
	fs.Func("scale-rounds", "with --scale: measure every store size this many times, alternating sizes, each time on a fresh copy of the loaded store (default 1)", func(s string) error {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return fmt.Errorf("bad round count %q (want 1 or more)", s)
		}
		f.scaleRounds = n
		return nil
	})
	fs.Func("claim-filter-bits", "bits per key of the engine's claim filter; negative turns it off (default 10)", func(s string) error {
		n, err := strconv.Atoi(s)
		if err != nil || n == 0 || n > 64 {
			return fmt.Errorf("bad bits per key %q (want -1, or 1..64)", s)
		}
		f.claimFilterBits = n
		return nil
	})
	f.pebble.register(fs)
	f.bg.register(fs, false)
	fs.StringVar(&f.data, "data", "", "create the stores in a temporary directory under `DIR` (removed afterwards; default the system's)")
	fs.StringVar(&f.json, "json", "", "write every figure as JSON to `FILE`")
	fs.StringVar(&f.plot, "plot", "", "write PNG charts into `DIR` (created if needed)")
	fs.BoolVar(&f.postgres, "postgres", false, "also measure the PostgreSQL store (pgstore) at every point, in a PostgreSQL 15 server started in a temporary directory (fsync on)")
	return func(ctx context.Context, stdout io.Writer) error {
		if f.postgres {
			srv, err := pgtest.StartServer()
			if err != nil {
				return fmt.Errorf("--postgres: start PostgreSQL: %w", err)
			}
			defer srv.Close()
			f.more = append(f.more, workloads.PostgresTarget(func(_ context.Context, name string) (string, error) {
				return srv.CreateDatabaseNamed(name)
			}, nil))
		}
		if f.profile == "day" {
			return runDay(ctx, f, stdout, os.Stderr)
		}
		return runBench(ctx, f, stdout, os.Stderr)
	}
}

// intsFlag defines a flag of comma-separated integers from lo to hi,
// stored in *dst; a part that is not one fails with bad, formatted with
// the part.
func intsFlag(fs *flag.FlagSet, name, usage string, lo, hi int, bad string, dst *[]int) {
	fs.Func(name, usage, func(s string) error {
		var ns []int
		for _, part := range strings.Split(s, ",") {
			n, err := strconv.Atoi(part)
			if err != nil || n < lo || n > hi {
				return fmt.Errorf(bad, part)
			}
			ns = append(ns, n)
		}
		*dst = ns
		return nil
	})
}

// durationFlag defines a flag of a duration of at least lo, stored in *dst.
func durationFlag(fs *flag.FlagSet, name, usage string, lo time.Duration, dst *time.Duration) {
	fs.Func(name, usage, func(s string) error {
		d, err := time.ParseDuration(s)
		if err != nil || d < lo {
			return fmt.Errorf("bad duration %q", s)
		}
		*dst = d
		return nil
	})
}

// byteUnits are the units parseByteSize takes, decimal and binary.
var byteUnits = []byteUnit{{"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}}

type byteUnit struct {
	name string
	size float64
}

// parseByteSize parses a size such as 1800MiB, 2GB or 1.5GiB into bytes.
// A size other than 0 needs its unit: a bare 1800 is more likely MiB
// meant than bytes. "" and "0" are 0.
func parseByteSize(s string) (int64, error) {
	bad := fmt.Errorf("bad size %q (want a number and a unit: B, KB, MB, GB, TB, KiB, MiB, GiB or TiB, for example 1800MiB or 2GB; or 0)", s)
	t := strings.TrimSpace(s)
	if t == "" || t == "0" {
		return 0, nil
	}
	num := strings.TrimRightFunc(t, func(r rune) bool { return r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' })
	unit := strings.TrimSpace(t[len(num):])
	num = strings.TrimSpace(num)
	i := slices.IndexFunc(byteUnits, func(u byteUnit) bool { return strings.EqualFold(u.name, unit) })
	v, err := strconv.ParseFloat(num, 64)
	if i < 0 || err != nil || math.IsNaN(v) || v < 0 {
		return 0, bad
	}
	b := v * byteUnits[i].size
	if v > 0 && b < 1 {
		return 0, bad
	}
	if b >= math.MaxInt64 {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return int64(b), nil
}

// benchFlags are the bench command's parsed flags.
type benchFlags struct {
	profile       string
	workloads     []string
	concurrency   []int
	duration      time.Duration
	retryFraction float64
	remoteLatency time.Duration
	scale         []int
	scaleRounds   int
	// claimFilterBits is engine.Options.ClaimFilterBitsPerKey (0: default).
	claimFilterBits int
	pebble          pebbleFlags
	bg              backgroundFlags
	data            string
	json, plot      string
	postgres        bool
	more            []workloads.Target // measured beside the engine and the baseline
	day             day.Options        // --profile day's own flags
	dayPhase        bool               // --phase-child: run one phase of a day run
}

// pebbleFlags are the engine's Pebble settings that bench and bench http
// take for A/B runs; both targets of a run share them.
type pebbleFlags struct {
	l0Threshold int                       // engine.Options.L0CompactionThreshold (0: default)
	compression *block.CompressionProfile // engine.Options.Compression (nil: default)
}

func (p *pebbleFlags) register(fs *flag.FlagSet) {
	fs.Func("l0-compaction-threshold", "engine.Options.L0CompactionThreshold for both stores, for A/B runs (default 16)", func(s string) error {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 1000 {
			return fmt.Errorf("bad threshold %q (want 1..1000)", s)
		}
		p.l0Threshold = n
		return nil
	})
	fs.Func("compression", "engine.Options.Compression for both stores, by Pebble's profile name (Snappy, Fastest, Fast, Balanced, Good, ZSTD, MinLZ, NoCompression), for A/B runs (default Balanced)", func(s string) error {
		if p.compression = block.CompressionProfileByName(s); p.compression == nil {
			return fmt.Errorf("unknown compression profile %q", s)
		}
		return nil
	})
}

// apply sets the flags given into o, allocating it if needed.
func (p pebbleFlags) apply(o *engine.Options) *engine.Options {
	if p == (pebbleFlags{}) {
		return o
	}
	if o == nil {
		o = &engine.Options{}
	}
	if p.l0Threshold != 0 {
		o.L0CompactionThreshold = p.l0Threshold
	}
	if p.compression != nil {
		o.Compression = p.compression
	}
	return o
}

// runBench runs the benchmark: the table on stdout, a progress bar on
// stderr if it is a terminal, and the JSON and charts if asked for.
func runBench(ctx context.Context, f benchFlags, stdout io.Writer, stderr *os.File) error {
	cfg, err := workloads.Profile(f.profile)
	if err != nil {
		return err
	}
	if f.workloads != nil {
		cfg.Workloads = f.workloads
	}
	if f.scale != nil {
		cfg.ScaleKeys = f.scale
	}
	if f.scaleRounds > 0 {
		cfg.ScaleRounds = f.scaleRounds
	}
	if f.concurrency != nil {
		cfg.Concurrency = f.concurrency
	}
	if f.duration > 0 {
		cfg.Duration = f.duration
	}
	cfg.RetryFraction = f.retryFraction
	cfg.RemoteLatency = f.remoteLatency
	cfg.Dir = f.data
	cfg.MoreTargets = f.more
	if f.claimFilterBits != 0 {
		if cfg.Engine == nil {
			cfg.Engine = &engine.Options{}
		}
		cfg.Engine.ClaimFilterBitsPerKey = f.claimFilterBits
	}
	if err := f.bg.validate(); err != nil {
		return usageError{err}
	}
	f.bg.setProcs()
	cfg.CompactionNice = f.bg.nice
	cfg.Engine = f.pebble.apply(cfg.Engine)
	return measureAndReport(stdout, stderr, "bench", f.json, func(progress func(bench.Progress)) (*workloads.Report, error) {
		cfg.Progress = progress
		return workloads.Run(ctx, cfg)
	}, func(rep *workloads.Report) error {
		if f.plot == "" {
			return nil
		}
		_, err := rep.Plot(f.plot)
		return err
	})
}

// profileFlag defines the --profile flag of a bench command: one of
// bench.Profiles, stored in *p.
func profileFlag(fs *flag.FlagSet, p *string, usage string) {
	fs.Func("profile", usage, func(s string) error {
		if !slices.Contains(bench.Profiles(), s) {
			return errors.New("want quick or full")
		}
		*p = s
		return nil
	})
}

// report is what every bench command prints.
type report interface {
	WriteTable(io.Writer) error
	WriteJSON(io.Writer) error
}

// measureAndReport creates the JSON output first (an unwritable path fails
// before minutes of measuring), runs measure with a progress bar on stderr
// if it is a terminal, and then prints the report's table on stdout,
// writes its JSON, and calls plot if it is not nil.
func measureAndReport[R report](stdout io.Writer, stderr *os.File, name, jsonPath string,
	measure func(progress func(bench.Progress)) (R, error), plot func(R) error) error {
	var jsonFile *os.File
	if jsonPath != "" {
		var err error
		if jsonFile, err = os.Create(jsonPath); err != nil {
			return err
		}
		defer jsonFile.Close()
	}
	if path := os.Getenv("IDEMKV_CPUPROFILE"); path != "" {
		// A CPU profile of the whole measurement, for `go tool pprof`.
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	progress, done := progressBar(stderr, name)
	rep, err := measure(progress)
	done()
	if err != nil {
		return err
	}
	if err := rep.WriteTable(stdout); err != nil {
		return err
	}
	if jsonFile != nil {
		if err := rep.WriteJSON(jsonFile); err != nil {
			return err
		}
		if err := jsonFile.Close(); err != nil {
			return err
		}
	}
	if plot != nil {
		return plot(rep)
	}
	return nil
}

// progressBar returns a Progress callback drawing a bar on stderr if it is
// a terminal (and doing nothing otherwise), and the function that ends it.
func progressBar(stderr *os.File, name string) (func(bench.Progress), func()) {
	if !term.IsTerminal(int(stderr.Fd())) {
		return nil, func() {}
	}
	bar := progressbar.NewOptions(1,
		progressbar.OptionSetWriter(stderr),
		progressbar.OptionSetDescription(name),
		progressbar.OptionShowCount(),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionClearOnFinish(),
	)
	return func(p bench.Progress) {
		bar.ChangeMax(p.Total)
		bar.Describe(p.Step)
		_ = bar.Set(p.Done)
	}, func() { _ = bar.Finish() }
}
