package pgtest

import (
	"context"
	"errors"
	"fmt"
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
