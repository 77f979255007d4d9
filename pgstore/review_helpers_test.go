package pgstore_test

import (
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/pgstore"
	"github.com/idemkv/idemkv/pgstore/pgtest"
	"github.com/stretchr/testify/require"
)

// reviewStore opens a store on a fresh database of the shared server;
// mod, if not nil, adjusts the options.
func reviewStore(t *testing.T, mod func(*pgstore.Options)) (*pgstore.Store, string) {
	t.Helper()
	dsn := pgtest.Shared(t).CreateDatabase(t)
	return reviewOpenOn(t, dsn, mod), dsn
}

func reviewOpenOn(t *testing.T, dsn string, mod func(*pgstore.Options)) *pgstore.Store {
	t.Helper()
	o := &pgstore.Options{NoBackgroundSweep: true,
		Clock: fakeclock.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))}
	if mod != nil {
		mod(o)
	}
	s, err := pgstore.Open(ctx, dsn, o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func reviewID(key string) idemkv.ID {
	return idemkv.ID{Tenant: "t", Endpoint: "POST /x", Key: key}
}

func reviewClaim(t *testing.T, s *pgstore.Store, id idemkv.ID, mode idemkv.Mode) idemkv.Lease {
	t.Helper()
	c, err := s.Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: []byte{1}, Mode: mode})
	require.NoError(t, err)
	require.Equal(t, idemkv.Acquired, c.Outcome)
	return c.Lease
}
