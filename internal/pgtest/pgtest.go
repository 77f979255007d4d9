package pgtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

const (
	// readyTimeout bounds how long a start waits for the server to accept
	// connections. A start takes well under a second, and crash recovery
	// after Kill little more; the bound only turns a hung start (a full
	// disk, an overloaded CI machine) into a test failure.
	readyTimeout = 60 * time.Second

	// pollInterval is how often a start tries to connect while it waits.
	pollInterval = 20 * time.Millisecond

	// stopTimeout bounds a fast shutdown (SIGINT: clients disconnected,
	// a shutdown checkpoint written) before Stop resorts to SIGKILL.
	stopTimeout = 30 * time.Second

	// adminTimeout bounds CREATE DATABASE and DROP DATABASE.
	adminTimeout = 30 * time.Second

	// portAttempts bounds how many free ports a new server tries: another
	// process may bind the port between its pick and the server's bind.
	portAttempts = 10

	// The environment: where the binaries are, and whether their absence
	// fails tests rather than skips them.
	binEnv     = "IDEMKV_PG_BIN"
	requireEnv = "IDEMKV_REQUIRE_POSTGRES"

	// superuser is the bootstrap superuser initdb creates (-U); it
	// authenticates without a password (--auth=trust) from 127.0.0.1.
	superuser = "postgres"
)

var (
	errNotFound = errors.New("PostgreSQL 15 binaries not found")

	// errPortInUse: the server could not bind its port. A new server
	// picks another port; Restart, bound to the port, fails.
	errPortInUse = errors.New("port in use")

	// errShmemInUse: processes of a killed server, orphaned backends that
	// have not yet noticed the postmaster's death, are still attached to
	// its shared memory, and PostgreSQL refuses to start beside them.
	// Restart waits for them to exit.
	errShmemInUse = errors.New("shared memory of a previous server still in use")
)

// An Option changes how Start configures its server.
type Option func(*config)

type config struct {
	fsync bool
}

// WithoutFsync runs the server with fsync=off, which saves the fsyncs of
// the WAL at each commit and of the data files at each checkpoint. Commits
// then survive a crash of the server (Kill) but not of the machine; use it
// only where a test's subject is not durability.
func WithoutFsync() Option { return func(c *config) { c.fsync = false } }

// A Server is a PostgreSQL server run by the test process. Its methods
// are safe for concurrent use.
type Server struct {
	bin  string              // the directory holding initdb and postgres
	dir  string              // holds data/ (PGDATA) and postgres.log
	port int                 // picked by the first start, kept by Restart
	cfg  config              //
	cred *syscall.Credential // the server's user; nil for the test process's own
	dbs  atomic.Int64        // databases created, for their unique names

	mu struct {
		sync.Mutex
		proc *process // nil while stopped
	}
}

// A process is one run of the postmaster, from start to exit.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited and been reaped
}

// Start creates a cluster in a new temporary directory, starts a server
// on it, and waits until the server accepts connections. When the test
// ends the server is stopped and the directory removed (after the server
// log's tail is written to the test log, if the test failed).
//
// Start skips the test if no PostgreSQL 15 binaries are found, or fails
// it if IDEMKV_REQUIRE_POSTGRES=1; it fails the test if the server does
// not start.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	cfg := config{fsync: true}
	for _, o := range opts {
		o(&cfg)
	}
	s, err := start(cfg)
	if err != nil {
		fail(t, err)
	}
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			t.Logf("pgtest: tail of %s:\n%s", s.logPath(), s.logTail(4<<10))
		}
		_ = os.RemoveAll(s.dir)
	})
	return s
}

// StartServer is Start outside a test (for the benchmark harness): the
// caller stops the server with Close, which also removes its directory.
func StartServer(opts ...Option) (*Server, error) {
	cfg := config{fsync: true}
	for _, o := range opts {
		o(&cfg)
	}
	return start(cfg)
}

// Close stops a server StartServer started and removes its directory.
func (s *Server) Close() error {
	s.Stop()
	return os.RemoveAll(s.dir)
}

// CreateDatabaseNamed creates the database name (which the caller drops,
// or Close removes with the server).
func (s *Server) CreateDatabaseNamed(name string) (string, error) {
	if err := s.admin("CREATE DATABASE " + pgx.Identifier{name}.Sanitize()); err != nil {
		return "", err
	}
	return s.DSN(name), nil
}

// fail skips or fails t for err, a failure to start a server.
func fail(t testing.TB, err error) {
	t.Helper()
	if errors.Is(err, errNotFound) && os.Getenv(requireEnv) != "1" {
		t.Skipf("pgtest: %v (set %s=1 to fail instead)", err, requireEnv)
	}
	t.Fatalf("pgtest: %v", err)
}

// start creates a cluster in a new temporary directory and starts a server
// on it, on a free port. It removes the directory if it fails.
func start(cfg config) (*Server, error) {
	bin, ok := Available()
	if !ok {
		return nil, fmt.Errorf("%w (%s); install postgresql-15, or set %s to the directory holding initdb and postgres",
			errNotFound, search().why, binEnv)
	}
	cred, err := serverUser()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, dir: dir, cfg: cfg, cred: cred}
	if err := s.initdb(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		if s.port, err = freePort(); err != nil {
			break
		}
		s.mu.Lock()
		err = s.startLocked()
		s.mu.Unlock()
		if err == nil {
			return s, nil
		}
		if !errors.Is(err, errPortInUse) || attempt == portAttempts {
			break
		}
	}
	_ = os.RemoveAll(dir)
	return nil, err
}

// serverUser returns whom the server must run as: nil (the test process's
// own user) unless the test process is root, which PostgreSQL refuses to
// run as; then the user "postgres".
func serverUser() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("the test runs as root, which PostgreSQL refuses to run as, and there is no user to run it as instead: %w", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user postgres: uid %q: %w", u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user postgres: gid %q: %w", u.Gid, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// initdb creates the cluster in s.dir/data, first handing s.dir to the
// server's user if that is not the test process's own.
//
// --no-sync skips only initdb's final fsync of the new cluster's files: a
// test server does not outlive a crash of the machine. The server itself
// runs with fsync as configured.
func (s *Server) initdb() error {
	if s.cred != nil {
		if err := os.Chown(s.dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return fmt.Errorf("hand %s to the postgres user: %w", s.dir, err)
		}
	}
	cmd := exec.Command(filepath.Join(s.bin, "initdb"),
		"-D", s.DataDir(),
		"-U", superuser,
		"--auth=trust",
		"-E", "UTF8",
		"--locale=C", // fast, and the same on every machine; server messages in English
		"--no-sync",
		"--no-instructions",
	)
	cmd.Dir = s.dir
	cmd.SysProcAttr = sysProcAttr(s.cred)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb %s: %w\n%s", s.DataDir(), err, out)
	}
	return nil
}

// freePort returns a loopback port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pick a port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startLocked starts the postmaster on s.dir and s.port and waits until it
// accepts connections. On failure the process is gone, and the error
// holds what the server logged.
// REQUIRES: s.mu held, s.mu.proc nil.
func (s *Server) startLocked() error {
	logf, err := os.OpenFile(s.logPath(), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	from, err := logf.Seek(0, io.SeekEnd)
	if err != nil {
		logf.Close()
		return err
	}
	fsync := "on"
	if !s.cfg.fsync {
		fsync = "off"
	}
	cmd := exec.Command(filepath.Join(s.bin, "postgres"),
		"-D", s.DataDir(),
		"-p", strconv.Itoa(s.port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=", // TCP only: no socket path to clash or to outgrow 107 bytes
		"-c", "max_connections=200",
		"-c", "shared_buffers=128MB",
		"-c", "fsync="+fsync,
	)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = logf, logf // the server logs to stderr (no logging collector)
	cmd.SysProcAttr = sysProcAttr(s.cred)
	err = cmd.Start()
	logf.Close() // the server has its own descriptor
	if err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	if err := s.waitReady(p, from); err != nil {
		p.kill()
		return err
	}
	s.mu.proc = p
	return nil
}

// waitReady waits until the server p accepts connections (and has
// finished crash recovery), or exits, or readyTimeout passes. from is
// where this run's lines begin in the log.
func (s *Server) waitReady(p *process, from int64) error {
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		err := s.ping(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			log := s.logSince(from)
			switch {
			case strings.Contains(log, "Address already in use"):
				err = errPortInUse
			case strings.Contains(log, "pre-existing shared memory block"):
				err = errShmemInUse
			default:
				err = errors.New("postgres exited")
			}
			return fmt.Errorf("start on port %d: %w: %s\n%s", s.port, err, p.cmd.ProcessState, log)
		case <-ctx.Done():
			return fmt.Errorf("start on port %d: not ready after %v: %v\n%s", s.port, readyTimeout, err, s.logSince(from))
		case <-tick.C:
		}
	}
}

// ping connects to the server and checks it is s's. It fails while the
// server is not listening yet, while it is starting up or recovering
// (SQLSTATE 57P03), and if the port is another server's: one that took
// the port after freePort picked it (s's own postgres then exits, unable
// to bind, and the start is retried on another port).
func (s *Server) ping(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, s.DSN("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var dir string
	if err := conn.QueryRow(ctx, "SHOW data_directory").Scan(&dir); err != nil {
		return err
	}
	theirs, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("another server is on the port (data directory %s): %w", dir, err)
	}
	ours, err := os.Stat(s.DataDir())
	if err != nil {
		return err
	}
	if !os.SameFile(theirs, ours) {
		return fmt.Errorf("another server is on the port (data directory %s)", dir)
	}
	return nil
}

// kill sends SIGKILL to the server, all its processes where killTree can
// find them, and waits for the postmaster to be reaped.
func (p *process) kill() {
	if err := killTree(p.cmd.Process); err != nil {
		_ = p.cmd.Process.Kill() // the postmaster at least
	}
	<-p.done
}

// DSN returns a URL for database db, as user postgres over TCP on
// 127.0.0.1, without TLS: postgres://postgres@127.0.0.1:PORT/DB?sslmode=disable.
// It stays the same across Kill, Stop and Restart.
func (s *Server) DSN(db string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(superuser),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)),
		Path:     "/" + db,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// Port returns the TCP port the server listens on, on 127.0.0.1.
func (s *Server) Port() int { return s.port }

// Dir returns the server's directory. It holds the cluster, in data/
// (DataDir), and the server's log, postgres.log, to which each start
// appends.
func (s *Server) Dir() string { return s.dir }

// DataDir returns the cluster's directory, PGDATA.
func (s *Server) DataDir() string { return filepath.Join(s.dir, "data") }

func (s *Server) logPath() string { return filepath.Join(s.dir, "postgres.log") }

// CreateDatabase creates a database of its own for t, from template1, and
// returns its DSN. The database is dropped when t ends, after the
// connections to it are closed or, failing that, terminated (DROP
// DATABASE ... WITH (FORCE)); a failure to drop it is ignored. Its name
// is derived from t's and unique on s.
func (s *Server) CreateDatabase(t testing.TB) string {
	t.Helper()
	name := dbName(t.Name(), s.dbs.Add(1))
	ident := pgx.Identifier{name}.Sanitize()
	if err := s.admin("CREATE DATABASE " + ident); err != nil {
		t.Fatalf("pgtest: create database %s: %v", name, err)
	}
	t.Cleanup(func() { _ = s.admin("DROP DATABASE IF EXISTS " + ident + " WITH (FORCE)") })
	return s.DSN(name)
}

// admin runs sql in database postgres, on a connection of its own.
func (s *Server) admin(sql string) error {
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.DSN("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// dbName returns the name of the n-th database created on a server, for
// the test named test: its name lower-cased, in [a-z0-9_], cut to keep
// the whole within PostgreSQL's 63 bytes.
func dbName(test string, n int64) string {
	b := []byte(strings.ToLower(test))
	for i, c := range b {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			b[i] = '_'
		}
	}
	if len(b) > 40 {
		b = b[:40]
	}
	return fmt.Sprintf("t_%s_%d", b, n)
}

// Kill crashes the server: it sends SIGKILL to the postmaster and to all
// its processes (backends, checkpointer, WAL writer) at once, and waits
// for the postmaster to exit. There is no shutdown checkpoint; clients see
// their connections break; nothing more of the server runs or writes.
// Restart then runs crash recovery. Kill on a stopped server does nothing.
//
// Outside Linux, only the postmaster is sent SIGKILL; its backends exit
// when they notice, which may be after Kill returns (a backend running a
// query notices when it finishes), and Restart waits for them.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.mu.proc; p != nil {
		p.kill()
		s.mu.proc = nil
	}
}

// Stop shuts the server down (SIGINT, PostgreSQL's fast shutdown: clients
// are disconnected, open transactions roll back, a shutdown checkpoint is
// written) and waits for it to exit, sending SIGKILL if it has not within
// 30 s. Stop on a stopped server does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.mu.proc
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
	case <-time.After(stopTimeout):
		p.kill()
	}
	s.mu.proc = nil
}

// Restart starts the server again after Kill or Stop, on the same data
// directory and port, and waits until it accepts connections (after Kill,
// until crash recovery has replayed the WAL). It fails the test if the
// server is running, or does not start within 60 s (for example, if
// another process took the port meanwhile).
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.proc != nil {
		t.Fatalf("pgtest: Restart of a running server")
	}
	deadline := time.Now().Add(readyTimeout)
	for {
		err := s.startLocked()
		if err == nil {
			return
		}
		// After Kill, the old server's backends may not have exited yet:
		// outside Linux, or if they could not be listed.
		if !errors.Is(err, errShmemInUse) || time.Now().After(deadline) {
			t.Fatalf("pgtest: restart: %v", err)
		}
		time.Sleep(pollInterval)
	}
}

// logSince returns the server log from offset from on.
func (s *Server) logSince(from int64) string {
	f, err := os.Open(s.logPath())
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	b, err := io.ReadAll(io.NewSectionReader(f, from, 1<<20))
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// logTail returns the last n bytes of the server log.
func (s *Server) logTail(n int64) string {
	fi, err := os.Stat(s.logPath())
	if err != nil {
		return err.Error()
	}
	return s.logSince(max(0, fi.Size()-n))
}

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
