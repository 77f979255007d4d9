package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/idemkv/idemkv/bench/fleet"
	"github.com/idemkv/idemkv/pgstore/pgtest"
)

func init() {
	register(&command{
		name:    "bench postgres",
		args:    "[--url URL] [--concurrency 16,64] [--duration D] [--warmup D] [--rounds N] [--pool N] [--data DIR] [--json FILE]",
		summary: "measure the PostgreSQL store against a naive SQL baseline on the same server, with the engine beside them, and their bytes per key (docs/benchmarks.md)",
		flags:   benchPostgresFlags,
	})
}

func benchPostgresFlags(fs *flag.FlagSet) func(context.Context, io.Writer) error {
	var (
		o              fleet.Options
		url, data, out string
	)
	fs.StringVar(&url, "url", "", "measure in the PostgreSQL database at `URL` (its idemkv_* tables must be new; naive_* tables are dropped); default: a PostgreSQL 15 server started in a temporary directory, fsync on")
	intsFlag(fs, "concurrency", "comma-separated `list` of closed-loop clients (default 16,64)", 1, 1024, "bad concurrency %q (want 1..1024)", &o.Concurrency)
	durationFlag(fs, "duration", "how long each store runs at each point, each round (default 3s)", 1, &o.Duration)
	durationFlag(fs, "warmup", "how long each PostgreSQL side runs, unmeasured, before the first point (default 2s)", 1, &o.Warmup)
	fs.Func("pool", "connections of each PostgreSQL store's pool (default 16)", func(s string) error {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 1000 {
			return fmt.Errorf("bad pool size %q (want 1..1000)", s)
		}
		o.Pool = int32(n)
		return nil
	})
	fs.IntVar(&o.Rounds, "rounds", 2, "how many times each point runs every store, alternating the order")
	fs.StringVar(&data, "data", "", "create the engine's store in a temporary directory under `DIR` (a server the command starts lives in the system's temporary directory)")
	fs.StringVar(&out, "json", "", "write every figure as JSON to `FILE`")
	return func(ctx context.Context, stdout io.Writer) error {
		if o.Rounds < 1 {
			return usageError{errors.New("--rounds must be at least 1")}
		}
		dir, err := os.MkdirTemp(data, "idemkv-bench-postgres-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		o.EngineDir = dir
		o.DSN = url
		if url == "" {
			srv, err := pgtest.StartServer()
			if err != nil {
				return fmt.Errorf("start PostgreSQL (or give --url): %w", err)
			}
			defer srv.Close()
			if o.DSN, err = srv.CreateDatabaseNamed("bench"); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "PostgreSQL 15 in %s, fsync on\n", srv.Dir())
		}
		o.Logf = func(format string, args ...any) { fmt.Fprintf(stdout, format+"\n", args...) }
		start := time.Now()
		rep, err := fleet.Run(ctx, &o)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "\n%s, %v\n", time.Now().UTC().Format("2006-01-02 15:04 MST"), time.Since(start).Round(time.Second))
		if err := rep.Print(stdout); err != nil {
			return err
		}
		if out != "" {
			b, err := json.MarshalIndent(rep, "", "  ")
			if err != nil {
				return err
			}
			return os.WriteFile(out, append(b, '\n'), 0o644)
		}
		return nil
	}
}
