package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/ttl"
)

// DirStore is a store that lives in a directory and reads effects back by
// key, as the Pebble engine and the benchmark baseline do.
type DirStore interface {
	idemkv.Store
	idemkv.DataReader
}

// OpenFunc opens the store in dir for cfg, reading the time from clock (a
// manual one). It is called again on the same dir for every Reopen.
type OpenFunc func(dir string, cfg *Config, clock idemkv.Clock) (DirStore, error)

// DirHarness returns a NewHarness for directory stores: each harness gets
// a fresh temporary directory and a manual clock, and Reopen closes the
// store and opens it again on the same directory. volatileLocalClaims says
// whether the store keeps local claims in memory only (see Config).
func DirHarness(open OpenFunc, volatileLocalClaims bool) NewHarness {
	return func(t *testing.T, cfg *Config) Harness {
		c := cfg.EnsureDefaults()
		c.VolatileLocalClaims = volatileLocalClaims
		h := &dirHarness{t: t, dir: t.TempDir(), cfg: c, open: open,
			clock: fakeclock.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))}
		h.reopen()
		return h
	}
}

type dirHarness struct {
	t     *testing.T
	dir   string
	cfg   *Config
	open  OpenFunc
	clock *fakeclock.Clock
	s     DirStore
}

func (h *dirHarness) reopen() {
	s, err := h.open(h.dir, h.cfg, h.clock)
	if err != nil {
		h.t.Fatalf("open: %v", err)
	}
	h.s = s
}

func (h *dirHarness) Store() idemkv.Store                 { return h.s }
func (h *dirHarness) Config() Config                      { return *h.cfg }
func (h *dirHarness) Now() time.Time                      { return h.clock.Now() }
func (h *dirHarness) Advance(d time.Duration)             { h.clock.Advance(d) }
func (h *dirHarness) ReadEffect(k []byte) ([]byte, error) { return h.s.GetData(ctx, k) }
func (h *dirHarness) Close()                              { _ = h.s.Close() }

// Sweep runs the store's sweeper if it has one (see Sweeper).
func (h *dirHarness) Sweep() error {
	s, ok := h.s.(interface {
		Sweep(context.Context) (ttl.Pass, error)
	})
	if !ok {
		return nil
	}
	_, err := s.Sweep(context.Background())
	return err
}

func (h *dirHarness) Reopen() {
	if err := h.s.Close(); err != nil {
		h.t.Fatalf("close: %v", err)
	}
	h.reopen()
}
