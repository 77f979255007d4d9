// Package pgtest runs a real PostgreSQL 15 server for tests, so that code
// written against PostgreSQL is tested against the server it will meet in
// production rather than against a mock or an embedded look-alike.
//
// It is pgstore's test harness, exported as net/http/httptest is
// net/http's: pgstore's tests use it, and so does whatever else tests
// against PostgreSQL (the suites of once, inbox, outbox, reconcile and
// saga in their run on pgstore, the command, the simulation, the
// benchmark harness). It sits beside pgstore rather than among the
// library's internal packages because it needs the PostgreSQL driver
// (pgx), as pgstore does.
//
// A server is the postgres binary itself, started as a child of the test
// process on a fresh data directory (initdb), listening on 127.0.0.1 only,
// on a free port, with no Unix socket. It runs with fsync on: a commit is
// on disk when it returns, as in production. Tests get isolation from a
// database of their own (CreateDatabase), not from a server of their own:
// initdb and a start cost one to two seconds, a database a quarter of
// one (fsync on; a tenth without).
//
// # Basics
//
// A package whose tests share one server per test binary:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
//	func TestStore(t *testing.T) {
//		dsn := pgtest.Shared(t).CreateDatabase(t) // dropped when t ends
//		pool, err := pgxpool.New(ctx, dsn)
//		...
//	}
//
// A test that crashes the server starts one of its own, so that it
// disturbs no other test:
//
//	srv := pgtest.Start(t)        // stopped and removed when t ends
//	dsn := srv.CreateDatabase(t)
//	... commit ...
//	srv.Kill()     // SIGKILL to every server process: a crash
//	srv.Restart(t) // same data directory and port; crash recovery runs
//	... the commit is there ...
//
// A test of failover gives its server a streaming standby, synchronous
// or not, and promotes it after killing the primary:
//
//	primary := pgtest.Start(t)
//	standby := primary.StartStandby(t, true) // commits wait for it
//	primary.Kill()
//	standby.Promote(t)
//
// StartServer and Close run a server outside a test (the benchmark
// harness).
//
// # Finding the binaries
//
// The binaries are looked for in $IDEMKV_PG_BIN if it is set (and only
// there), else in /usr/lib/postgresql/15/bin (Debian, Ubuntu), the
// directory of initdb on $PATH, the files of the Debian package
// postgresql-15, /usr/lib/postgresql/*/bin, /usr/pgsql-15/bin (RHEL) and
// Homebrew's postgresql@15. A directory counts only if it holds initdb and
// postgres and `postgres --version` reports major version 15: the store
// is tested against the version it supports, not whichever one happens to
// be installed. Available reports the directory found.
//
// When none is found, Start and Shared skip the test, unless the
// environment variable IDEMKV_REQUIRE_POSTGRES is "1" (CI sets it), in
// which case they fail it.
//
// # Caveats
//
// PostgreSQL refuses to run as root. When the test process is root (as in
// containers), initdb and postgres run as the user "postgres" (which the
// distribution packages create), and the server's directory is chowned to
// it; the directory must then be reachable by that user ($TMPDIR must not
// be under a directory only root can enter). Without that user, a root
// test process cannot start a server, and Start fails.
//
// Kill is a crash of the server's processes, not of the machine: what
// PostgreSQL has written reaches the kernel's page cache and survives,
// fsync or not. A test of Kill and Restart therefore shows that committed
// transactions survive crash recovery (the WAL is replayed); that they
// would also survive a power cut is what fsync=on (the default; `SHOW
// fsync` reads it back) is for, and no test here can show it.
// WithoutFsync gives that guarantee up for speed: such a server still
// survives Kill but not a crash of the machine.
//
// The server is a child of the test process and receives SIGKILL (on
// Linux, through PR_SET_PDEATHSIG) if the test process dies, so a killed
// `go test` leaves no server running. It does leave the server's
// temporary directory (pgtest-* under $TMPDIR) behind.
//
// Shared's server outlives the test that first asks for it and is stopped
// by Main after all tests have run, so Shared requires TestMain to call
// Main. Main calls os.Exit and so cannot be combined with another
// TestMain wrapper such as goleak.VerifyTestMain; a package that needs
// both checks for leaks in its tests instead (goleak.VerifyNone).
package pgtest
