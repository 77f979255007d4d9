// Package natstest starts a real JetStream server inside the test process,
// for tests: a NATS server with JetStream on disk, so that tests of
// publishers and consumers talk to the broker they will meet in
// production rather than to a mock. It is in the natsjs module, so that
// the library's module does not require nats-server, not even for tests.
//
// The server listens on a random loopback port, keeps its JetStream store
// in a directory of t.TempDir(), logs nothing, and is shut down (and waited
// for) when the test ends. Stop and Restart take it down and bring it back
// on the same port and store, for tests of a broker outage: clients
// reconnect to the same URL and find the streams and messages they left.
//
//	srv := natstest.Start(t)
//	nc := srv.Connect(t)
//	...
//	srv.Stop()    // clients see a disconnect; publishes fail
//	srv.Restart(t) // same URL, same streams
package natstest

import (
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// readyTimeout bounds how long Start and Restart wait for the server to
// accept connections. Start-up takes milliseconds; the bound only turns a
// hung start into a test failure.
const readyTimeout = 10 * time.Second

// A Server is an in-process nats-server with JetStream. Its methods are
// safe for concurrent use.
type Server struct {
	dir string

	mu struct {
		sync.Mutex
		port int            // 0 until the first start picks one
		srv  *server.Server // nil while stopped
	}
}

// Start starts a server with JetStream enabled and its store in a new
// directory of t.TempDir(), waits until it accepts connections, and
// registers its shutdown with t.Cleanup. It fails the test if the server
// does not start.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{dir: t.TempDir()}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.startLocked(); err != nil {
		t.Fatalf("natstest: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

// startLocked starts a server on s.dir and on s.mu.port (a random port
// when it is 0, which it then records).
// REQUIRES: s.mu held, s.mu.srv nil.
func (s *Server) startLocked() error {
	port := s.mu.port
	if port == 0 {
		port = server.RANDOM_PORT
	}
	opts := &server.Options{
		ServerName: "natstest",
		Host:       "127.0.0.1",
		Port:       port,
		NoLog:      true,
		NoSigs:     true,
		// No HTTP monitoring, no cluster: the client port only.
		HTTPPort:           0,
		JetStream:          true,
		StoreDir:           s.dir,
		JetStreamMaxMemory: 64 << 20,
		JetStreamMaxStore:  1 << 30,
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return fmt.Errorf("new server: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(readyTimeout) {
		srv.Shutdown()
		srv.WaitForShutdown()
		return fmt.Errorf("server on port %d with store %s not ready after %v", port, s.dir, readyTimeout)
	}
	if s.mu.port == 0 {
		addr, ok := srv.Addr().(*net.TCPAddr)
		if !ok {
			srv.Shutdown()
			srv.WaitForShutdown()
			return fmt.Errorf("server listens on %v, not TCP", srv.Addr())
		}
		s.mu.port = addr.Port
	}
	s.mu.srv = srv
	return nil
}

// URL returns the client URL, nats://127.0.0.1:port. It stays the same
// across Stop and Restart.
func (s *Server) URL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return "nats://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(s.mu.port))
}

// Dir returns the JetStream store directory.
func (s *Server) Dir() string { return s.dir }

// Stop shuts the server down and waits until it has stopped: its clients
// are disconnected and its store is closed (flushed to the files; what a
// stream holds survives to Restart). Stop on a stopped server does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.srv == nil {
		return
	}
	s.mu.srv.Shutdown()
	s.mu.srv.WaitForShutdown()
	s.mu.srv = nil
}

// Restart starts the server again on the same port and store after Stop,
// and waits until it accepts connections; clients reconnecting to URL find
// the streams as Stop left them. It fails the test if the server is
// running or does not start (for example, if another process took the
// port meanwhile).
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.srv != nil {
		t.Fatalf("natstest: Restart of a running server")
	}
	if err := s.startLocked(); err != nil {
		t.Fatalf("natstest: restart: %v", err)
	}
}

// Connect returns a client connection to the server, closed when the test
// ends. It reconnects for ever, every 10ms, so that a test can wait for a
// restarted server with a reconnect handler (nats.ReconnectHandler in
// opts) instead of sleeping; opts are applied after these defaults.
func (s *Server) Connect(t testing.TB, opts ...nats.Option) *nats.Conn {
	t.Helper()
	all := append([]nats.Option{
		nats.Name("natstest"),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(10 * time.Millisecond),
		nats.ReconnectJitter(0, 0),
	}, opts...)
	nc, err := nats.Connect(s.URL(), all...)
	if err != nil {
		t.Fatalf("natstest: connect %s: %v", s.URL(), err)
	}
	t.Cleanup(nc.Close)
	return nc
}
