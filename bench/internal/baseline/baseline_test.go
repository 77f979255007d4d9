package baseline

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/storetest"
	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// TestConformance runs the store contract's conformance suite against the
// baseline on a real on-disk Pebble store: the reference the engine is
// measured against keeps the same contract.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, cfg storetest.Config) storetest.Harness {
		h := &harness{t: t, dir: t.TempDir(), clock: fakeclock.New(t0)}
		cfg.VolatileLocalClaims = false // local claims are written to disk
		h.cfg = cfg
		h.opts = engine.Options{Clock: h.clock, Lease: cfg.Lease, Retention: cfg.Retention,
			CacheSize: 1 << 20, MemTableSize: 1 << 20, Shards: 4}
		h.open()
		return h
	})
}

type harness struct {
	t     *testing.T
	dir   string
	clock *fakeclock.Clock
	cfg   storetest.Config
	opts  engine.Options
	db    *DB
}

func (h *harness) open() {
	db, err := Open(h.dir, &h.opts)
	if err != nil {
		h.t.Fatalf("open: %v", err)
	}
	h.db = db
}

func (h *harness) Store() idemkv.Store                 { return h.db }
func (h *harness) Config() storetest.Config            { return h.cfg }
func (h *harness) Now() time.Time                      { return h.clock.Now() }
func (h *harness) Advance(d time.Duration)             { h.clock.Advance(d) }
func (h *harness) ReadEffect(k []byte) ([]byte, error) { return h.db.GetData(k) }

func (h *harness) Reopen() {
	if err := h.db.Close(); err != nil {
		h.t.Fatalf("close: %v", err)
	}
	h.open()
}

func (h *harness) Close() { _ = h.db.Close() }

// TestSyncedWrites pins the cost model the package doc states: a local
// request is two synced batches (claim, completion), a replay none.
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

	v, err := db.GetData([]byte("e/k"))
	require.NoError(t, err)
	require.Equal(t, "v", string(v))
	require.NoError(t, db.Close())
	_, err = db.Claim(ctx, req)
	require.True(t, errors.Is(err, idemkv.ErrClosed), "%v", err)
}
