// Package workspace holds the tests of the repository's layout:
// TestModules, which makes the README's test command cover the whole
// repository, and TestLibraryRequirements, which keeps the library's
// module to the requirements it lists, each with its reason.
//
// The repository is a Go workspace (go.work at its root): the library is
// the root module, and the PostgreSQL store, the NATS JetStream adapter,
// the examples, the benchmark harness, the command, the simulation and
// the cross-store suites are modules of their own, so that a program
// importing the library requires none of their dependencies. `go test
// ./...` at the root matches the root module's packages only, so
// TestModules runs `go test ./...` in every other module of the
// workspace, in the same tier (-tags system, -short and -race carry
// over), and fails with the output of any that fails.
//
// It reads every file of those modules first, so that go test's cache
// notices a change in them and does not answer with a stale result.
// Set IDEMKV_MODULES=separate to skip it where each module is tested on
// its own (.ci/run does, to print each module's result).
package workspace
