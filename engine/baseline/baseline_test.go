package baseline

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/storetest"
	"github.com/stretchr/testify/require"
)

// TestConformance runs the store contract's conformance suite against the
// baseline on a real on-disk Pebble store: the reference the engine is
// measured against keeps the same contract. The suite's porcupine check
// (storetest.Linearizable) takes seconds here where the engine takes under
// one, since every claim and completion of its rounds is a synced write.
func TestConformance(t *testing.T) {
	open := func(dir string, cfg *storetest.Config, clock idemkv.Clock) (storetest.DirStore, error) {
		return Open(dir, &engine.Options{Clock: clock, Lease: cfg.Lease, Retention: cfg.Retention, RetentionClasses: cfg.Classes,
			CacheSize: 1 << 20, MemTableSize: 1 << 20, Shards: 4})
	}
	// Local claims are written to disk, so they survive a reopen; their
	// renewals are held in memory (Config.DurableRenewals stays false), a
	// remote claim's are written, as the contract asks.
	storetest.Run(t, storetest.DirHarness(open, false))
}

// TestSyncedWrites pins the cost model the package doc states: a local
// request is two synced batches (claim, completion), a replay none; a
// remote claim's renewal is one, a local claim's none.
func TestSyncedWrites(t *testing.T) {
	ctx := context.Background()
	db, err := Open(t.TempDir(), &engine.Options{CacheSize: 1 << 20, MemTableSize: 1 << 20})
	require.NoError(t, err)
	defer db.Close()
	require.EqualValues(t, 1, db.Commits(), "the epoch at Open")

	id := idemkv.ID{Tenant: "t", Endpoint: "POST /x", Key: "k"}
	req := idemkv.ClaimRequest{ID: id, Fingerprint: []byte("fp")}
	c, err := db.Claim(ctx, req)
	require.NoError(t, err)
	require.Equal(t, idemkv.Acquired, c.Outcome)
	require.EqualValues(t, 2, db.Commits())
	require.NoError(t, db.Complete(ctx, c.Lease, idemkv.Result{Status: 201, Pointer: "/p/1"},
		func(w idemkv.Effects) error { return w.Set([]byte("e/k"), []byte("v")) }))
	require.EqualValues(t, 3, db.Commits())

	c, err = db.Claim(ctx, req)
	require.NoError(t, err)
	require.Equal(t, idemkv.Replay, c.Outcome)
	require.Equal(t, "/p/1", c.Record.Result.Pointer)
	req.Fingerprint = []byte("other")
	c, err = db.Claim(ctx, req)
	require.NoError(t, err)
	require.Equal(t, idemkv.Mismatch, c.Outcome)
	require.EqualValues(t, 3, db.Commits(), "replays and mismatches write nothing")

	remote := idemkv.ClaimRequest{ID: idemkv.ID{Tenant: "t", Endpoint: "POST /x", Key: "r"}, Fingerprint: []byte("fp"),
		Mode: idemkv.ModeRemote}
	c, err = db.Claim(ctx, remote)
	require.NoError(t, err)
	require.Equal(t, idemkv.Acquired, c.Outcome)
	require.EqualValues(t, 4, db.Commits())
	_, err = db.Renew(ctx, c.Lease, time.Minute)
	require.NoError(t, err)
	require.EqualValues(t, 5, db.Commits(), "a remote claim's renewal is written")
	local := idemkv.ClaimRequest{ID: idemkv.ID{Tenant: "t", Endpoint: "POST /x", Key: "l"}, Fingerprint: []byte("fp")}
	c, err = db.Claim(ctx, local)
	require.NoError(t, err)
	require.EqualValues(t, 6, db.Commits())
	_, err = db.Renew(ctx, c.Lease, time.Minute)
	require.NoError(t, err)
	require.EqualValues(t, 6, db.Commits(), "a local claim's renewal is held in memory")

	v, err := db.GetData(ctx, []byte("e/k"))
	require.NoError(t, err)
	require.Equal(t, "v", string(v))
	require.NoError(t, db.Close())
	_, err = db.Claim(ctx, req)
	require.True(t, errors.Is(err, idemkv.ErrClosed), "%v", err)
}
