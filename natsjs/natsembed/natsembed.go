// Package natsembed starts a NATS server with JetStream inside this
// process, for `idemkv serve --events embedded` and the demo: a broker to
// try the outbox and the inbox with, without running nats-server.
//
// It is a package of its own, apart from natsjs, because it links the
// whole server into the binary: a program that only talks to a NATS
// server elsewhere imports natsjs and not the server.
//
//	srv, err := natsembed.Start(dir, 0)
//	defer srv.Shutdown()
//	p, err := natsjs.Connect(srv.URL(), nil)
package natsembed

import (
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// A Server is a NATS server with JetStream running inside this process
// (`idemkv serve --events embedded`): one node, listening on loopback
// only, without authentication, its streams on disk. Other processes on
// the machine may connect to URL; nothing off the machine can.
type Server struct {
	srv  *server.Server
	port int
}

// readyTimeout bounds how long Start waits for the server to accept
// connections; recovering large streams can take a while.
const readyTimeout = time.Minute

// Start starts a server with its JetStream store in dir (created if
// needed; a restart on the same dir recovers the streams) and its client
// port on 127.0.0.1:port, or on a free port if port is 0.
//
// Every stored message is synced to disk before its PubAck (the server's
// sync_always): the relay removes an event from the outbox once it is
// acknowledged, so an acknowledged message must survive a crash of the
// machine. This costs an fsync per publish. The server logs nothing.
func Start(dir string, port int) (*Server, error) {
	if dir == "" {
		return nil, fmt.Errorf("natsembed: empty store directory")
	}
	if port < 0 || port > 65535 {
		return nil, fmt.Errorf("natsembed: port %d outside 0..65535", port)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	srv, err := server.NewServer(&server.Options{
		ServerName: "idemkv-embedded",
		Host:       "127.0.0.1",
		Port:       port,
		NoLog:      true,
		NoSigs:     true,
		JetStream:  true,
		StoreDir:   dir,
		SyncAlways: true,
	})
	if err != nil {
		return nil, fmt.Errorf("natsembed: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(readyTimeout) {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, fmt.Errorf("natsembed: server on port %d with store %s: not ready after %v", port, dir, readyTimeout)
	}
	// Addr is the listener's, so it names the port a random one became.
	addr, ok := srv.Addr().(*net.TCPAddr)
	if !ok {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, fmt.Errorf("natsembed: server listens on %v, not TCP", srv.Addr())
	}
	return &Server{srv: srv, port: addr.Port}, nil
}

// URL returns the client URL, nats://127.0.0.1:port.
func (s *Server) URL() string {
	return "nats://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
}

// Port returns the client port.
func (s *Server) Port() int { return s.port }

// Shutdown stops the server and waits until it has stopped: clients are
// disconnected and the store is closed. Calling it again does nothing.
func (s *Server) Shutdown() {
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
}
