package engine

import (
	"testing"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/tier"
	"github.com/idemkv/idemkv/storetest"
)

// openForConformance opens the engine the conformance suite drives, on a
// real on-disk Pebble store, with small caches and extra options.
func openForConformance(extra func(*Options)) storetest.OpenFunc {
	return func(dir string, cfg *storetest.Config, clock idemkv.Clock) (storetest.DirStore, error) {
		o := Options{Clock: clock, Lease: cfg.Lease, Retention: cfg.Retention, RetentionClasses: cfg.Classes,
			CacheSize: 1 << 20, MemTableSize: 1 << 20, Shards: 4}
		if extra != nil {
			extra(&o)
		}
		return Open(dir, &o)
	}
}

// harness is the suite's harness for the engine: a store in a directory,
// whose local claims live in memory (they vanish on reopen) and whose
// remote claims' renewals are written (they survive it).
func harness(open storetest.OpenFunc) storetest.NewHarness {
	dir := storetest.DirHarness(open, true)
	return func(t *testing.T, cfg *storetest.Config) storetest.Harness {
		c := cfg.EnsureDefaults()
		c.DurableRenewals = true
		return dir(t, c)
	}
}

// TestConformance runs the store contract's conformance suite against the
// engine, the porcupine check (storetest.Linearizable) included. Local
// claims live in memory, so they vanish on reopen. The engine drops expired
// local leases only once a shard holds minReapAt slots, far more than the
// few hundred keys a round of the porcupine check uses, whose model has no
// such drop.
func TestConformance(t *testing.T) {
	storetest.Run(t, harness(openForConformance(nil)))
}

// TestConformanceClaimFilterRebuilding runs the conformance suite with a
// claim filter sized for two keys and the replay cache off: the filter
// fills after a few claims and is rebuilt in the background while the
// suite's operations go on, and every lookup it lets through goes to
// Pebble. A key missing from a rebuilt filter would be claimed as new.
func TestConformanceClaimFilterRebuilding(t *testing.T) {
	tier.Require(t, "the conformance suite already runs with the filter on")
	storetest.Run(t, harness(openForConformance(func(o *Options) {
		o.ReplayCacheSize = -1
		o.claimFilterMinKeys = 2
	})))
}
