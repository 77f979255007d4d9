package engine

import (
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/storetest"
)

// TestConformance runs the store contract's conformance suite against the
// engine on a real on-disk Pebble store.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, cfg storetest.Config) storetest.Harness {
		h := &harness{t: t, dir: t.TempDir(), clock: fakeclock.New(t0)}
		cfg.VolatileLocalClaims = true
		h.cfg = cfg
		h.opts = Options{Clock: h.clock, Lease: cfg.Lease, Retention: cfg.Retention,
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
	opts  Options
	e     *Engine
}

func (h *harness) open() {
	e, err := Open(h.dir, &h.opts)
	if err != nil {
		h.t.Fatalf("open: %v", err)
	}
	h.e = e
}

func (h *harness) Store() idemkv.Store                 { return h.e }
func (h *harness) Config() storetest.Config            { return h.cfg }
func (h *harness) Now() time.Time                      { return h.clock.Now() }
func (h *harness) Advance(d time.Duration)             { h.clock.Advance(d) }
func (h *harness) ReadEffect(k []byte) ([]byte, error) { return h.e.GetData(k) }

func (h *harness) Reopen() {
	if err := h.e.Close(); err != nil {
		h.t.Fatalf("close: %v", err)
	}
	h.open()
}

func (h *harness) Close() { _ = h.e.Close() }
