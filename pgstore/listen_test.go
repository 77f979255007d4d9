package pgstore_test

import (
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
