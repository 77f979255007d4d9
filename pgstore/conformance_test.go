package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/pgstore"
	"github.com/idemkv/idemkv/pgstore/pgtest"
	"github.com/idemkv/idemkv/storetest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// harness is a pgstore.Store on a fresh database of the shared test
// server, with a manual clock; Reopen closes the store and opens it again
// on the same database, as a process restart would.
type harness struct {
	t     *testing.T
	dsn   string
	cfg   *storetest.Config
	clock *fakeclock.Clock
	s     *pgstore.Store
}

func newHarness(t *testing.T, cfg *storetest.Config) storetest.Harness {
	c := cfg.EnsureDefaults()
	c.DurableRenewals = true
	h := &harness{t: t, dsn: pgtest.Shared(t).CreateDatabase(t), cfg: c,
		clock: fakeclock.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))}
	h.open()
	return h
}

func (h *harness) open() {
	s, err := pgstore.Open(context.Background(), h.dsn, &pgstore.Options{Clock: h.clock, Lease: h.cfg.Lease,
		Retention: h.cfg.Retention, RetentionClasses: h.cfg.Classes, NoBackgroundSweep: true})
	if err != nil {
		h.t.Fatalf("open: %v", err)
	}
	h.s = s
}

func (h *harness) Store() idemkv.Store                 { return h.s }
func (h *harness) Config() storetest.Config            { return *h.cfg }
func (h *harness) Now() time.Time                      { return h.clock.Now() }
func (h *harness) Advance(d time.Duration)             { h.clock.Advance(d) }
func (h *harness) ReadEffect(k []byte) ([]byte, error) { return h.s.GetData(ctx, k) }
func (h *harness) Close()                              { _ = h.s.Close() }

func (h *harness) Sweep() error {
	_, err := h.s.Sweep(context.Background())
	return err
}

func (h *harness) Reopen() {
	if err := h.s.Close(); err != nil {
		h.t.Fatalf("close: %v", err)
	}
	h.open()
}

// TestConformance runs the store contract's conformance suite, the rapid
// model and the porcupine check included, against a real PostgreSQL.
func TestConformance(t *testing.T) {
	storetest.Run(t, newHarness)
}
