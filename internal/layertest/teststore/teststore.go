// Package teststore opens the store the tests of the packages built on
// the Store contract (once, inbox, reconcile, saga, outbox) run on, so
// that each suite runs, unchanged, on both stores: the Pebble engine, and
// PostgreSQL (package pgstore, on the test binary's shared server, see
// package pgstore/pgtest). The suites live beside it, in
// internal/layertest/<package>.
//
// A suite's TestMain calls Main: it runs the tests on the engine, then
// runs the test binary again with IDEMKV_TEST_STORE=postgres, where Open
// opens pgstore. Without PostgreSQL's binaries the second run is skipped,
// unless IDEMKV_REQUIRE_POSTGRES=1 (as CI sets), when it fails.
package teststore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/pgstore"
	"github.com/idemkv/idemkv/pgstore/pgtest"
	"github.com/idemkv/idemkv/ttl"
)

// EnvStore names the environment variable that picks the store.
const EnvStore = "IDEMKV_TEST_STORE"

// Store is what the suites use of a store.
type Store interface {
	idemkv.DataStore
	idemkv.Outbox
	Sweep(ctx context.Context) (ttl.Pass, error)
}

var (
	_ Store = (*engine.Engine)(nil)
	_ Store = (*pgstore.Store)(nil)
)

// Options are the settings the suites give a store.
type Options struct {
	Clock            idemkv.Clock
	Lease            time.Duration
	RetentionClasses ttl.Classes
	MaxBodySize      int
}

// Postgres reports whether this run's stores are PostgreSQL.
func Postgres() bool { return os.Getenv(EnvStore) == "postgres" }

// Name is the store of this run, for logs: "engine" or "postgres".
func Name() string {
	if Postgres() {
		return "postgres"
	}
	return "engine"
}

// databases maps a test's store directory to its database, so that
// opening the same dir again (a restart) opens the same data.
var databases sync.Map

// Open opens the store that lives in dir (a t.TempDir()): the engine in
// it, or the PostgreSQL database made for it the first time. Open on the
// same dir again opens the same data, as a restart would. No background
// sweeper runs.
func Open(t testing.TB, dir string, o Options) Store {
	t.Helper()
	if !Postgres() {
		e, err := engine.Open(dir, &engine.Options{Clock: o.Clock, Lease: o.Lease, RetentionClasses: o.RetentionClasses,
			MaxBodySize: o.MaxBodySize, NoBackgroundSweep: true, CacheSize: 8 << 20, MemTableSize: 4 << 20})
		if err != nil {
			t.Fatalf("teststore: open the engine: %v", err)
		}
		return e
	}
	dsn, ok := databases.Load(dir)
	if !ok {
		dsn, _ = databases.LoadOrStore(dir, pgtest.Shared(t).CreateDatabase(t))
	}
	s, err := pgstore.Open(context.Background(), dsn.(string), &pgstore.Options{Clock: o.Clock, Lease: o.Lease,
		RetentionClasses: o.RetentionClasses, MaxBodySize: o.MaxBodySize, NoBackgroundSweep: true,
		OutboxPoll: 50 * time.Millisecond})
	if err != nil {
		t.Fatalf("teststore: open pgstore: %v", err)
	}
	return s
}

// RequireSound fails t unless the store's own check finds no problem.
func RequireSound(t testing.TB, s Store) {
	t.Helper()
	var problems []string
	switch s := s.(type) {
	case *engine.Engine:
		rep, err := s.Check(context.Background())
		if err != nil {
			t.Fatalf("check: %v", err)
		}
		for _, p := range rep.Problems {
			problems = append(problems, fmt.Sprintf("%+v", p))
		}
		if rep.ProblemCount > 0 && len(problems) == 0 {
			problems = []string{fmt.Sprintf("%d problems", rep.ProblemCount)}
		}
	case *pgstore.Store:
		rep, err := s.Check(context.Background())
		if err != nil {
			t.Fatalf("check: %v", err)
		}
		problems = rep.Problems
	default:
		t.Fatalf("teststore: no check for %T", s)
	}
	if len(problems) > 0 {
		t.Fatalf("the store's check found problems: %v", problems)
	}
}

// Main runs the package's tests on the engine, then on PostgreSQL in a
// second run of the test binary, and exits with the first failure's
// status. checks, if any, run after the engine's run (goleak.Find, say).
func Main(m *testing.M, checks ...func() error) {
	if Postgres() {
		pgtest.Main(m)
		return
	}
	code := m.Run()
	for _, check := range checks {
		if err := check(); err != nil && code == 0 {
			fmt.Fprintln(os.Stderr, "teststore: after the tests:", err)
			code = 1
		}
	}
	if code != 0 {
		os.Exit(code)
	}
	if testing.Short() {
		// The second run checks the store contract on PostgreSQL, not this
		// package's Go code: -short (the race pass of .ci/run) leaves it to
		// the full run.
		fmt.Fprintln(os.Stderr, "teststore: -short: the tests ran on the engine only")
		os.Exit(0)
	}
	if _, ok := pgtest.Available(); !ok {
		if os.Getenv("IDEMKV_REQUIRE_POSTGRES") == "1" {
			fmt.Fprintln(os.Stderr, "teststore: PostgreSQL's binaries are missing, and IDEMKV_REQUIRE_POSTGRES=1")
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "teststore: PostgreSQL's binaries are missing: the tests ran on the engine only")
		os.Exit(0)
	}
	os.Exit(runOnPostgres())
}

// runOnPostgres runs this test binary again with the same flags (but not
// go test's log of what the tests read, which is the first run's) on
// PostgreSQL.
func runOnPostgres() int {
	var args []string
	for _, a := range os.Args[1:] {
		if !strings.HasPrefix(a, "-test.testlogfile") {
			args = append(args, a)
		}
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), EnvStore+"=postgres")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "teststore: run the tests on PostgreSQL:", err)
		return 1
	}
	return 0
}
