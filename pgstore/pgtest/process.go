package pgtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// The postmaster's runs: start, readiness, crash, stop, restart, and
// its log.

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
