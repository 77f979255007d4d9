package pgstore_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/pgstore"
	"github.com/idemkv/idemkv/pgstore/pgtest"
)

// TestOneConnectionPool: a store whose pool holds one connection answers
// claims and completions, and its outbox is still notified: the listener
// keeps a connection of its own. (When it took the pool's, every
// statement waited for it forever.)
func TestOneConnectionPool(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	s, err := pgstore.Open(ctx, dsn, &pgstore.Options{MaxConns: 1, NoBackgroundSweep: true, OutboxPoll: time.Hour})
	require.NoError(t, err)
	defer s.Close()
	wait := func(what string, ch <-chan struct{}) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: nothing within 30 s", what)
		}
	}
	wait("the listener's first notice", s.OutboxNotify())

	done := make(chan struct{})
	var c idemkv.Claim
	go func() {
		defer close(done)
		c, err = runLocal(t, s, "one-conn", 1, "v")
	}()
	wait("a RunLocal on a one-connection pool", done)
	require.NoError(t, err)
	require.Equal(t, idemkv.Acquired, c.Outcome)
	wait("the event's notification", s.OutboxNotify())
	evs, err := s.ReadOutbox(ctx, 0, 10)
	require.NoError(t, err)
	require.Len(t, evs, 1)
}

// TestOtherProcessesRelaysAreWoken: a commit with events in one process
// wakes the relays of the others (OutboxNotify), long before their poll,
// though the commit itself sends no NOTIFY: the process's notifier sends
// one after it, also for a commit made just before the store closes.
func TestOtherProcessesRelaysAreWoken(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	open := func() *pgstore.Store {
		s, err := pgstore.Open(ctx, dsn, &pgstore.Options{NoBackgroundSweep: true, OutboxPoll: time.Hour})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	a, b := open(), open()
	notified := func(s *pgstore.Store) bool {
		select {
		case <-s.OutboxNotify():
			return true
		case <-time.After(30 * time.Second):
			return false
		}
	}
	require.True(t, notified(b), "b's listener's first notice")
	for i := range 3 {
		c, err := runLocal(t, a, fmt.Sprint("woken-", i), 1, "v")
		require.NoError(t, err)
		require.Equal(t, idemkv.Acquired, c.Outcome)
		require.True(t, notified(b), "b is told of a's commit %d", i)
	}
	// A commit just before a's Close is still told.
	c, err := runLocal(t, a, "woken-at-close", 1, "v")
	require.NoError(t, err)
	require.Equal(t, idemkv.Acquired, c.Outcome)
	require.NoError(t, a.Close())
	require.True(t, notified(b), "b is told of a's last commit")
}
