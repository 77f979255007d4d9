package day

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv/bench"
	"github.com/stretchr/testify/require"
)

// childEnv, set, makes this test binary the child of Options.Child: it
// holds the records, run directory and kept store of smallDay's options.
const childEnv = "IDEMKV_DAY_TEST_CHILD"

func TestMain(m *testing.M) {
	if v := os.Getenv(childEnv); v != "" {
		os.Exit(servePhaseForTest(v))
	}
	os.Exit(m.Run())
}

func servePhaseForTest(v string) int {
	parts := strings.SplitN(v, "|", 3)
	if len(parts) != 3 {
		fmt.Fprintf(os.Stderr, "bad %s %q\n", childEnv, v)
		return 2
	}
	records, _ := strconv.ParseInt(parts[0], 10, 64)
	o := smallDay(records, parts[1], parts[2])
	o.Log = func(line string) { fmt.Fprintln(os.Stderr, line) }
	if err := ServePhase(ctx, o, os.Stdin, os.NewFile(3, "phase result")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// smallDay is TestRunSmallDay's run: records in the large store, its run
// directory and the directory the large store is kept in.
func smallDay(records int64, dir, kept string) *Options {
	return &Options{Options: bench.Options{Dir: dir, Tenants: 10}, Records: records, Small: records / 10,
		Duration: 3 * time.Second, Window: 500 * time.Millisecond, Rate: 2000, Clients: []int{8}, Point: 300 * time.Millisecond,
		Rounds: 1, SweepInterval: 200 * time.Millisecond, Store: kept, MemoryLimit: 3 << 30}
}

// runInChildren makes o's phases run in this test binary, started again.
func runInChildren(t *testing.T, o *Options) {
	t.Setenv(childEnv, fmt.Sprintf("%d|%s|%s", o.Records, o.Dir, o.Store))
	o.Child = []string{os.Args[0]}
}

// A phase the child cannot run fails the run with the child's reason.
func TestChildFailureIsTheRunsError(t *testing.T) {
	o := smallDay(1000, t.TempDir(), t.TempDir())
	runInChildren(t, o)
	var lines []string
	_, err := runChild(ctx, o, phaseRequest{Kind: "nonsense"}, func(f string, a ...any) { lines = append(lines, fmt.Sprintf(f, a...)) })
	require.ErrorContains(t, err, `unknown phase "nonsense"`)

	o.Child = []string{os.Args[0] + ".missing"}
	_, err = runChild(ctx, o, phaseRequest{Kind: phaseOpen}, func(string, ...any) {})
	require.ErrorContains(t, err, "starting the open phase's process")
}
