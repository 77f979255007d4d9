package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestBench runs `bench --profile quick` with a tiny duration on one
// workload and checks the table, the JSON file's documented fields, the
// charts, and that the data directory is cleaned up.
func TestBench(t *testing.T) {
	data, out := t.TempDir(), t.TempDir()
	jsonFile, plots := filepath.Join(out, "bench.json"), filepath.Join(out, "plots")
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"bench", "--profile", "quick", "--duration", "50ms",
		"--workloads", "unique", "--concurrency", "1,4", "--data", data, "--json", jsonFile, "--plot", plots},
		&stdout, &stderr)
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	require.Contains(t, stdout.String(), "profile quick")
	require.Contains(t, stdout.String(), "Sizing against the guide")
	require.Empty(t, stderr.String(), "no error output")

	left, err := os.ReadDir(data)
	require.NoError(t, err)
	require.Empty(t, left, "the temporary data directory is removed")

	b, err := os.ReadFile(jsonFile)
	require.NoError(t, err)
	var rep map[string]any
	require.NoError(t, json.Unmarshal(b, &rep))
	requireFields(t, rep, "meta", "fsync", "points", "comparisons", "sizing")
	meta := rep["meta"].(map[string]any)
	requireFields(t, meta, "date", "go_version", "goos", "goarch", "cpu_model", "num_cpu", "gomaxprocs",
		"profile", "options", "wall_seconds")
	require.Equal(t, "quick", meta["profile"])
	opts := meta["options"].(map[string]any)
	requireFields(t, opts, "workloads", "concurrency", "duration_seconds", "retry_fraction", "remote_latency_us",
		"preload_keys", "sizing_keys", "body_keys", "body_bytes", "verify_keys", "engine")
	require.Equal(t, 0.05, opts["duration_seconds"])
	requireFields(t, opts["engine"].(map[string]any), "cache_bytes", "memtable_bytes", "bloom_bits_per_key", "compression")
	requireFields(t, rep["fsync"].(map[string]any), "samples", "p50_us", "p99_us", "max_us", "mean_us", "start_p50_us", "end_p50_us")

	points := rep["points"].([]any)
	require.Len(t, points, 4, "two concurrencies, two targets")
	for _, p := range points {
		p := p.(map[string]any)
		requireFields(t, p, "workload", "concurrency", "target", "duration_seconds", "requests", "requests_per_sec",
			"outcomes", "latency_us", "fsyncs", "fsyncs_per_request", "wal_fsyncs_per_request", "synced_batches",
			"synced_batches_per_request", "wal_bytes_per_request", "cpu_seconds_per_request", "keys_stored",
			"table_bytes", "disk_bytes_per_key", "write_amp", "verified_keys",
			"commits", "writes_per_commit", "commit_mean_us", "commit_busy", "commit_sync_wait_share")
		requireFields(t, p["latency_us"].(map[string]any), "p50", "p99", "p999", "max", "mean")
		requireFields(t, p["outcomes"].(map[string]any), "acquired", "replay", "in_progress", "mismatch")
		require.Equal(t, "unique", p["workload"])
		require.Greater(t, p["requests"].(float64), 0.0)
		require.Greater(t, p["fsyncs"].(float64), 0.0)
		if p["target"] == "engine" {
			// Every synced write of the engine goes through its committer.
			require.Greater(t, p["commits"].(float64), 0.0)
			require.GreaterOrEqual(t, p["writes_per_commit"].(float64), 1.0)
			require.Greater(t, p["commit_busy"].(float64), 0.0)
			require.Greater(t, p["commit_sync_wait_share"].(float64), 0.0)
			require.LessOrEqual(t, p["commit_sync_wait_share"].(float64), 1.0)
		} else {
			require.Zero(t, p["commits"].(float64), "the baseline commits through Pebble alone")
		}
	}
	for _, c := range rep["comparisons"].([]any) {
		requireFields(t, c.(map[string]any), "workload", "concurrency", "target", "reference",
			"target_requests_per_sec", "reference_requests_per_sec", "ratio", "target_p50_us", "reference_p50_us")
	}
	sz := rep["sizing"].(map[string]any)
	requireFields(t, sz, "guide_requests_per_sec", "keys_per_day", "guide_bytes_per_key", "targets")
	require.Equal(t, 432e6, sz["keys_per_day"])
	for _, st := range sz["targets"].([]any) {
		st := st.(map[string]any)
		requireFields(t, st, "target", "keys", "bytes_per_key", "store_bytes_per_day", "bytes_per_key_with_body",
			"store_bytes_per_day_with_bodies", "peak_unique_requests_per_sec", "headroom",
			"fsyncs_per_request", "synced_batches_per_request")
		require.Greater(t, st["bytes_per_key"].(float64), 0.0)
	}

	charts, err := filepath.Glob(filepath.Join(plots, "*.png"))
	require.NoError(t, err)
	require.ElementsMatch(t, []string{filepath.Join(plots, "latency-unique.png"), filepath.Join(plots, "throughput-unique.png")}, charts)
}

// TestParseByteSize: --memory-limit's sizes, decimal and binary.
func TestParseByteSize(t *testing.T) {
	for s, want := range map[string]int64{"": 0, "0": 0, "0MiB": 0, "1800MiB": 1800 << 20, "2GB": 2e9, "2 gib": 2 << 30,
		"1.5GiB": 3 << 29, "512KiB": 512 << 10, "100B": 100, "3TB": 3e12, " 64MB ": 64e6} {
		got, err := parseByteSize(s)
		require.NoError(t, err, "%q", s)
		require.Equal(t, want, got, "%q", s)
	}
	for _, s := range []string{"1800", "MiB", "x", "1.2.3GB", "-5MB", "NaNMiB", "InfGB", "1e400MiB", "5 M iB"} {
		_, err := parseByteSize(s)
		require.Error(t, err, "%q", s)
	}
}

func requireFields(t *testing.T, m map[string]any, names ...string) {
	t.Helper()
	for _, n := range names {
		require.Contains(t, m, n)
	}
}

// TestBenchUsage checks that bad flags are usage errors: exit status 2,
// the reason and the usage on stderr, nothing on stdout, nothing run.
func TestBenchUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--profile", "slow"}, "want quick, full or day"},
		{[]string{"--profile", "day", "--records", "5", "--store", "/nonexistent/x"}, "bad store sizes"},
		{[]string{"--workloads", "unique,nope"}, `unknown workload "nope"`},
		{[]string{"--concurrency", "1,0"}, `bad concurrency "0"`},
		{[]string{"--concurrency", "many"}, `bad concurrency "many"`},
		{[]string{"--duration", "soon"}, `bad duration "soon"`},
		{[]string{"--duration", "-1s"}, `bad duration "-1s"`},
		{[]string{"--retry-fraction", "2"}, `bad fraction "2"`},
		{[]string{"--remote-latency", "x"}, `bad duration "x"`},
		{[]string{"--profile", "day", "--memory-limit", "1800"}, `bad size "1800" (want a number and a unit`},
		{[]string{"--profile", "day", "--background-nice", "25"}, "--background-nice 25 outside 0..19"},
		{[]string{"--memory-limit", "lots"}, `bad size "lots"`},
		{[]string{"--memory-limit", "-1GiB"}, `bad size "-1GiB"`},
		{[]string{"--memory-limit", "2XB"}, `bad size "2XB"`},
		{[]string{"--memory-limit", "0.1B"}, `bad size "0.1B"`},
		{[]string{"--memory-limit", "1e30TB"}, `size "1e30TB" is too large`},
		{[]string{"--l0-compaction-threshold", "0"}, `bad threshold "0"`},
		{[]string{"http", "--l0-compaction-threshold", "-4"}, `bad threshold "-4"`},
		{[]string{"--compression", "lz4"}, `unknown compression profile "lz4"`},
		{[]string{"http", "--compression", ""}, `unknown compression profile ""`},
		{[]string{"--background-nice", "20"}, "--background-nice 20 outside 0..19"},
		{[]string{"http", "--background-nice", "-1"}, "--background-nice -1 outside 0..19"},
		{[]string{"http", "--gomaxprocs", "-2"}, "--gomaxprocs may not be negative"},
		{[]string{"ttl", "--background-nice", "20"}, "--background-nice 20 outside 0..19"},
		{[]string{"ttl", "--gomaxprocs", "-1"}, "--gomaxprocs may not be negative"},
		{[]string{"--bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"extra"}, `unexpected argument "extra"`},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), append([]string{"bench"}, tc.args...), &stdout, &stderr)
		require.Equal(t, exitUsage, code, "%v", tc.args)
		require.Contains(t, stderr.String(), tc.want, "%v", tc.args)
		require.Contains(t, stderr.String(), "Usage: idemkv bench")
		require.Empty(t, stdout.String())
	}
	var stdout bytes.Buffer
	require.Equal(t, exitOK, run(context.Background(), []string{"help", "bench"}, &stdout, &bytes.Buffer{}))
	for _, flag := range []string{"--profile", "--workloads", "--concurrency", "--duration", "--data", "--json", "--plot"} {
		require.Contains(t, stdout.String(), flag[1:])
	}
}
