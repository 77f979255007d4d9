// Package tier says which tier of the test suite a test binary runs.
//
// `go test ./...`, the README's test command, runs the fast tier: every
// package's own tests, the conformance suite and the layers' suites on
// both stores, and the property tests, linearizability rounds and
// simulation seeds at reduced counts. `go test -tags system -timeout 30m
// ./...` runs the system tier as well: tests that start and kill processes (SIGKILL
// loops, a failover, fleets, PostgreSQL servers killed and promoted),
// the conformance suite again under other engine settings, and the
// property tests and simulations at their full counts. .ci/run runs both.
//
// Only tests and the conformance suite (storetest) import it.
package tier

import (
	"flag"
	"strconv"
	"testing"
)

// System reports whether the binary was built for the system tier
// (-tags system).
func System() bool { return system }

// Require skips t, saying what it is, unless the system tier runs.
func Require(t testing.TB, what string) {
	t.Helper()
	if !system {
		t.Skipf("system tier (%s): run with go test -tags system", what)
	}
}

// Count returns full in the system tier and fast in the fast tier.
func Count(full, fast int) int {
	if system {
		return full
	}
	return fast
}

// FastChecks is how many cases a rapid property checks in the fast tier
// (rapid's default, and the system tier's, is 100).
const FastChecks = 20

// LimitRapid lowers rapid's -rapid.checks to FastChecks in the fast tier,
// unless the command line set it. Call it before rapid.Check; it holds
// for the rest of the binary.
func LimitRapid() {
	if system {
		return
	}
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "rapid.checks" })
	if !set && flag.Lookup("rapid.checks") != nil {
		_ = flag.Set("rapid.checks", strconv.Itoa(FastChecks))
	}
}
