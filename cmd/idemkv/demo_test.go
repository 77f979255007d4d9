package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/idemkv/idemkv/pgstore/pgtest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMain lets the test binary stand in for the idemkv binary: when
// IDEMKV_TEST_AS_MAIN is set it runs main with its own arguments, with
// IDEMKV_TEST_FAULT as the demo's fault and IDEMKV_TEST_NOFILE as its file
// descriptor limit, and exits with main's status.
func TestMain(m *testing.M) {
	if os.Getenv("IDEMKV_TEST_AS_MAIN") != "" {
		testFault = os.Getenv("IDEMKV_TEST_FAULT")
		if n, err := strconv.ParseUint(os.Getenv("IDEMKV_TEST_NOFILE"), 10, 64); err == nil {
			rl := syscall.Rlimit{Cur: n, Max: n}
			if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
				panic(err)
			}
		}
		main()
		panic("main returned")
	}
	pgtest.Main(m) // runs the tests, then stops the PostgreSQL server if one started
}

// TestDemo runs the demo twice against one kept directory: every scenario
// must pass, and a second run over a used store must pass too.
func TestDemo(t *testing.T) {
	dir := t.TempDir()
	for run := 1; run <= 2; run++ {
		var out bytes.Buffer
		err := runDemo(context.Background(), demoConfig{out: &out, dir: dir})
		require.NoError(t, err, "run %d:\n%s", run, out.String())
		require.Contains(t, out.String(), fmt.Sprintf("%d/%d scenarios behaved as the guide requires.", len(scenarios), len(scenarios)))
		require.NotContains(t, out.String(), "FAILED")
	}
	_, err := os.Stat(dir)
	require.NoError(t, err, "--data directory must be kept")
}

// TestDemoNoticesDoubleCharge makes the client send a new key with every
// retry, so retries charge again: the demo must fail, and scenario 1 must
// say so from the processor's and the account's books.
func TestDemoNoticesDoubleCharge(t *testing.T) {
	var out bytes.Buffer
	err := runDemo(context.Background(), demoConfig{out: &out, dir: t.TempDir(), fault: faultNewKeyOnRetry})
	require.Error(t, err)
	require.Contains(t, err.Error(), "scenario 1 (Lost response, then retry): the card was charged 2 times and the account has 2 payments")
	require.Contains(t, out.String(), "FAILED")
	require.NotContains(t, out.String(), fmt.Sprintf("%d/%d scenarios", len(scenarios), len(scenarios)))
}

// TestExitStatus runs the binary (the test binary standing in for it) and
// checks its exit status and where its messages go.
func TestExitStatus(t *testing.T) {
	for _, tc := range []struct {
		name       string
		args       []string
		fault      string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{"failing scenario", []string{"demo"}, faultNewKeyOnRetry, 1, "FAILED", "scenario 1 (Lost response, then retry)"},
		{"unknown command", []string{"bogus"}, "", 2, "", "unknown command \"bogus\""},
		{"unknown flag", []string{"demo", "--bogus"}, "", 2, "", "flag provided but not defined: -bogus"},
		{"extra argument", []string{"demo", "extra"}, "", 2, "", "unexpected argument \"extra\""},
		{"no command", nil, "", 2, "", "Usage: idemkv COMMAND"},
		{"help", []string{"help"}, "", 0, "demo", ""},
		{"help demo", []string{"help", "demo"}, "", 0, "--data", ""},
		{"demo -h", []string{"demo", "-h"}, "", 0, "Usage: idemkv demo [--data DIR]", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], tc.args...)
			cmd.Env = append(os.Environ(), "IDEMKV_TEST_AS_MAIN=1", "IDEMKV_TEST_FAULT="+tc.fault)
			cmd.Dir = t.TempDir()
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			code := 0
			var exitErr *exec.ExitError
			if errors.As(err, &exitErr) {
				code = exitErr.ExitCode()
			} else {
				require.NoError(t, err)
			}
			require.Equal(t, tc.wantCode, code, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
			require.Contains(t, stdout.String(), tc.wantStdout)
			require.Contains(t, stderr.String(), tc.wantStderr)
			if tc.wantCode == 2 {
				require.Empty(t, stdout.String(), "usage errors go to stderr")
				require.True(t, strings.Contains(stderr.String(), "Usage:"), "a usage error prints usage")
			}
		})
	}
}
