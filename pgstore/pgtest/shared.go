package pgtest

import (
	"os"
	"sync"
	"testing"
)

// The shared server: started by the first Shared, stopped by Main.
var shared struct {
	sync.Mutex
	main bool    // Main is running the tests, and will stop srv
	srv  *Server // nil until the first Shared, or if it failed
	err  error   // the first Shared's failure, reported to every caller
}

// Shared returns the test binary's shared server, starting it on first
// use. It runs with the defaults (fsync on) until Main stops it after all
// tests; isolate tests with CreateDatabase. Kill, Stop and Restart on it
// disturb every test using it: a test that needs them starts its own
// server.
//
// Shared fails the test unless the package's TestMain calls Main. It
// skips or fails the test as Start does, and if the server failed to
// start once, it fails every caller with that error.
func Shared(t testing.TB) *Server {
	t.Helper()
	shared.Lock()
	if !shared.main {
		shared.Unlock()
		t.Fatalf("pgtest: Shared needs the package's TestMain to call pgtest.Main, which stops the server")
	}
	if shared.srv == nil && shared.err == nil {
		shared.srv, shared.err = start(config{fsync: true})
	}
	srv, err := shared.srv, shared.err
	shared.Unlock()
	if err != nil {
		fail(t, err)
	}
	return srv
}

// Main runs the tests, then stops the shared server if one was started
// and removes its directory, then exits with the tests' status. Call it
// from TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
func Main(m *testing.M) {
	shared.Lock()
	shared.main = true
	shared.Unlock()

	code := m.Run()

	shared.Lock()
	srv := shared.srv
	shared.srv, shared.main = nil, false
	shared.Unlock()
	if srv != nil {
		srv.Stop()
		_ = os.RemoveAll(srv.dir)
	}
	os.Exit(code)
}
