package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Streaming replication: a standby is a Server of its own (a directory, a
// port, Kill, Stop, Restart), made from a base backup of its primary and
// following the primary's WAL as it is written. Promote turns it into a
// primary, as an operator or a failover manager would after the primary
// is lost.
//
// Nothing needs configuring on the primary first. PostgreSQL 15's
// defaults stream (wal_level=replica, max_wal_senders=10), and initdb
// --auth=trust writes a pg_hba.conf that lets the replication pseudo-
// database in from 127.0.0.1 ("host replication all 127.0.0.1/32
// trust"): pg_basebackup, which connects exactly so, would fail otherwise.

// standbys numbers the standbys the test binary starts, for their names.
var standbys atomic.Int64

// StartStandby makes a streaming standby of s and starts it: pg_basebackup
// (-R -X stream, through a physical replication slot named after the
// standby, so that s keeps the WAL the standby has not received even
// while it is stopped) copies s's cluster into a new temporary directory,
// and the standby starts on a free loopback port, connects to s as
// application_name "standbyN" (N counts the test binary's standbys) and
// streams from s. It returns once s reports the standby streaming
// (pg_stat_replication). The standby is a hot standby: it answers reads,
// and refuses writes (SQLSTATE 25006) until Promote. When the test ends
// it is stopped and its directory removed.
//
// With sync, s is made to wait for the standby at every commit
// (synchronous_standby_names set to the standby's name and
// synchronous_commit=on, by ALTER SYSTEM and pg_reload_conf), and
// StartStandby returns once s reports it synchronous: from then on a
// commit on s returns only after the standby has its WAL on disk, so a
// transaction acknowledged by s survives s's loss (Kill) once the standby
// is promoted; and while the standby is stopped, commits on s wait. s
// keeps that setting, in its postgresql.auto.conf, for as long as it
// runs; the standby, and so a primary promoted from it, does not.
//
// s must be a server of the test's own (Start): the slot, and with sync
// the setting, outlive the standby, and would hold WAL or stall the
// commits of every other test on Shared's.
//
// StartStandby fails the test if s is Shared's, or not running, or the
// standby does not start or connect within 60 s.
func (s *Server) StartStandby(t testing.TB, sync bool) *Server {
	t.Helper()
	shared.Lock()
	isShared := s == shared.srv
	shared.Unlock()
	if isShared {
		t.Fatalf("pgtest: StartStandby on the shared server: start a server of the test's own")
	}
	sb, err := s.startStandby(sync)
	if err != nil {
		t.Fatalf("pgtest: standby of the server on port %d: %v", s.port, err)
	}
	t.Cleanup(func() {
		sb.Stop()
		if t.Failed() {
			t.Logf("pgtest: tail of %s:\n%s", sb.logPath(), sb.logTail(4<<10))
		}
		_ = os.RemoveAll(sb.dir)
	})
	return sb
}

// Promote ends the standby's recovery (pg_promote, waiting for it to
// finish) and waits until the server accepts writes. The standby no
// longer follows its primary; whatever WAL it had received is replayed
// first. It fails the test if s is not a running standby or is not
// promoted within 60 s.
func (s *Server) Promote(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	var promoted bool
	if err := s.queryRow(ctx, "SELECT pg_promote(wait => true, wait_seconds => 60)", &promoted); err != nil {
		t.Fatalf("pgtest: promote the server on port %d: %v", s.port, err)
	}
	if !promoted {
		t.Fatalf("pgtest: promote the server on port %d: not promoted within 60 s", s.port)
	}
	// pg_promote returns once recovery has ended; a new session is then
	// read-write. Check it as a client would.
	err := s.poll(ctx, func(ctx context.Context) (bool, error) {
		var readOnly string
		err := s.queryRow(ctx, "SHOW transaction_read_only", &readOnly)
		return err == nil && readOnly == "off", nil
	})
	if err != nil {
		t.Fatalf("pgtest: promote the server on port %d: still read-only: %v", s.port, err)
	}
}

// startStandby makes and starts a standby of s. It removes the standby's
// directory if it fails.
func (s *Server) startStandby(sync bool) (_ *Server, err error) {
	name := fmt.Sprintf("standby%d", standbys.Add(1))
	dir, err := os.MkdirTemp("", "pgtest-standby-")
	if err != nil {
		return nil, err
	}
	sb := &Server{bin: s.bin, dir: dir, cfg: s.cfg, cred: s.cred}
	defer func() {
		if err != nil {
			sb.Kill()
			_ = os.RemoveAll(dir)
		}
	}()
	if err := sb.baseBackup(s, name); err != nil {
		return nil, err
	}
	if err := sb.startOnFreePort(); err != nil {
		return nil, err
	}
	return sb, s.awaitStandby(name, sync)
}

// Rebuild makes s, a server that is not running (after Kill or Stop), a
// standby of primary, as an operator rebuilds a lost primary as the
// standby of the one promoted in its place: s's data directory is
// replaced by a base backup of primary, and s starts on its own port
// again, so that a client's multi-host URL naming both servers still
// names them. With sync, primary waits for s at every commit, as with
// StartStandby. It returns once primary reports s streaming (and, with
// sync, synchronous); it fails the test if s is running, or the backup
// or the start fails, or s does not stream within 60 s.
func (s *Server) Rebuild(t testing.TB, primary *Server, sync bool) {
	t.Helper()
	s.mu.Lock()
	running := s.mu.proc != nil
	s.mu.Unlock()
	if running {
		t.Fatalf("pgtest: Rebuild of the running server on port %d", s.port)
	}
	name := fmt.Sprintf("standby%d", standbys.Add(1))
	err := os.RemoveAll(s.DataDir())
	if err == nil {
		err = s.baseBackup(primary, name)
	}
	if err == nil {
		s.mu.Lock()
		err = s.startLocked()
		s.mu.Unlock()
	}
	if err == nil {
		err = primary.awaitStandby(name, sync)
	}
	if err != nil {
		t.Fatalf("pgtest: rebuild the server on port %d as a standby of port %d: %v", s.port, primary.port, err)
	}
}

// awaitStandby waits until s streams to the standby name and, with sync,
// makes s wait for it at every commit (see StartStandby).
func (s *Server) awaitStandby(name string, sync bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if err := s.waitReplica(ctx, name, "async", "potential", "sync", "quorum"); err != nil {
		return err
	}
	if !sync {
		return nil
	}
	for _, set := range []string{
		"ALTER SYSTEM SET synchronous_standby_names = '" + name + "'",
		"ALTER SYSTEM SET synchronous_commit = on",
		"SELECT pg_reload_conf()",
	} {
		if err := s.admin(set); err != nil {
			return err
		}
	}
	if err := s.waitReplica(ctx, name, "sync"); err != nil {
		return err
	}
	// pg_stat_replication's sync_state is computed with the settings of
	// the session asking and of the standby's WAL sender, which both
	// reloaded; a commit, though, waits only once the checkpointer, which
	// the postmaster signals with them, has reloaded too and published
	// that a synchronous standby is named. A CHECKPOINT, which the
	// checkpointer takes only after handling the reload it was signalled,
	// makes sure it has.
	return s.admin("CHECKPOINT")
}

// baseBackup copies primary's cluster into sb's data directory, as a
// standby of primary named name.
func (sb *Server) baseBackup(primary *Server, name string) error {
	if sb.cred != nil {
		if err := os.Chown(sb.dir, int(sb.cred.Uid), int(sb.cred.Gid)); err != nil {
			return fmt.Errorf("hand %s to the postgres user: %w", sb.dir, err)
		}
	}
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=%s application_name=%s", primary.port, superuser, name)
	cmd := exec.Command(filepath.Join(sb.bin, "pg_basebackup"),
		"-d", conninfo,
		"-D", sb.DataDir(),
		"-R",           // standby.signal, and primary_conninfo in postgresql.auto.conf
		"-X", "stream", // the WAL written during the backup, streamed alongside it
		"-C", "-S", name, // a replication slot: the primary keeps WAL until the standby has it
		"-c", "fast", // an immediate checkpoint rather than a spread one
		"--no-sync", // as initdb's: the copy does not outlive a crash of the machine
		"-w",        // never prompt for a password (there is none: trust)
	)
	cmd.Dir = sb.dir
	cmd.SysProcAttr = sysProcAttr(sb.cred)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pg_basebackup from port %d: %w\n%s", primary.port, err, out)
	}
	// Settings of the standby's own, after those -R wrote and those copied
	// from the primary (the last of a name wins): its name, which
	// PostgreSQL 15's -R happens to carry over from the connection
	// string, here not left to that; and no
	// synchronous standby of its own, whatever the primary had, so that a
	// primary promoted from it does not wait for a standby it lacks.
	auto, err := os.OpenFile(filepath.Join(sb.DataDir(), "postgresql.auto.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(auto, "# pgtest: a standby of the server on port %d\nprimary_conninfo = '%s'\nsynchronous_standby_names = ''\n",
		primary.port, conninfo)
	return errors.Join(err, auto.Close())
}

// startOnFreePort starts sb on a free port, trying another if the one it
// picked was taken meanwhile.
func (sb *Server) startOnFreePort() error {
	for attempt := 1; ; attempt++ {
		var err error
		if sb.port, err = freePort(); err != nil {
			return err
		}
		sb.mu.Lock()
		err = sb.startLocked()
		sb.mu.Unlock()
		if err == nil || !errors.Is(err, errPortInUse) || attempt == portAttempts {
			return err
		}
	}
}

// waitReplica waits until s lists the standby name as streaming, in one
// of the sync states states.
func (s *Server) waitReplica(ctx context.Context, name string, states ...string) error {
	err := s.poll(ctx, func(ctx context.Context) (bool, error) {
		var n int
		err := s.queryRow(ctx, `SELECT count(*) FROM pg_stat_replication
			WHERE application_name = $1 AND state = 'streaming' AND sync_state = ANY($2)`, &n, name, states)
		return n == 1, err
	})
	if err != nil {
		return fmt.Errorf("standby %s not streaming (sync state %v): %w", name, states, err)
	}
	return nil
}

// poll calls cond every pollInterval until it reports done, returns an
// error, or ctx ends.
func (s *Server) poll(ctx context.Context, cond func(context.Context) (bool, error)) error {
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		done, err := cond(ctx)
		if done || err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// queryRow runs sql with args in database postgres, on a connection of
// its own, and scans its one row into dest.
func (s *Server) queryRow(ctx context.Context, sql string, dest any, args ...any) error {
	conn, err := pgx.Connect(ctx, s.DSN("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, sql, args...).Scan(dest)
}
