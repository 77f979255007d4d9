// Package storetest is the conformance suite for idemkv.Store
// implementations. Every backend (the Pebble engine and the PostgreSQL
// store, pgstore) runs the same suite through a Harness, so they keep one
// contract.
//
// # Basics
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T, cfg *storetest.Config) storetest.Harness {
//			return newMyHarness(t, cfg)
//		})
//	}
//
// The suite drives time through the harness (never by sleeping), restarts
// the store through it, and reads effects back through it. Besides a few
// scenarios it checks the store two ways against models of the contract:
// random sequences of calls, one at a time, against a plain model of every
// record (with reopens and sweeps in between), and concurrent histories of
// many clients against a sequential model with porcupine (Linearizable).
// Two scenarios hold the business data and the outbox to the contract:
// concurrent read-modify-writes that must serialize (skipped by a store
// whose Effects do not read), and events that exist exactly when their
// outcome commits (skipped by a store that is no idemkv.Outbox).
// Others hold the remote half to what a reconciler relies on: the
// downstream identity of a logical request (the same OperationID after a
// release, a resolution with no effect, an eviction, an expiry, a
// takeover and a restart), a Release's compensations (committed with it,
// fenced as it is), when a record was marked uncertain (Record.Marked),
// and a remote lease as renewed, durably.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
)

// Config is what the suite asks of a new store.
type Config struct {
	// Lease is the store's default lease; Retention the window of its
	// default retention class.
	Lease, Retention time.Duration
	// Classes are the further retention classes the store must offer, by
	// name.
	Classes map[string]time.Duration
	// VolatileLocalClaims is set by the harness, not the suite: true if the
	// store keeps local (ModeLocal) claims in memory only, so that they
	// vanish on Reopen.
	VolatileLocalClaims bool
	// DurableRenewals is set by the harness: true if the store also
	// writes the renewal of a local claim durably, so that it survives
	// Reopen (a store shared by several processes must); false if a local
	// claim's renewal lives in memory. A remote claim's renewal is
	// durable on every store (the contract), whatever this says.
	DurableRenewals bool
}

// Harness is a store under test together with control over its world.
// Store, Config, Now and Advance may be called from many goroutines at
// once, and while the store's operations run; Reopen and Close are called
// alone.
type Harness interface {
	// Store returns the store; it changes after Reopen.
	Store() idemkv.Store
	// Config returns the configuration the store was opened with.
	Config() Config
	// Now reads the store's clock; Advance moves it forward.
	Now() time.Time
	Advance(d time.Duration)
	// Reopen closes the store and opens it again on the same data, as a
	// process restart would. Leases held by callers are not revoked by it.
	Reopen()
	// ReadEffect reads a value written through idemkv.Effects, or returns
	// an error wrapping idemkv.ErrNotFound.
	ReadEffect(key []byte) ([]byte, error)
	// Close releases the store and its data.
	Close()
}

// Sweeper is implemented by a Harness whose store deletes expired records
// (a TTL sweeper). The state machine then sweeps at random points.
type Sweeper interface {
	// Sweep runs one full pass of the store's sweeper.
	Sweep() error
}

// NewHarness opens a fresh, empty store configured by cfg (nil: the
// defaults, see Config.EnsureDefaults). It reports failures through t and
// registers its own cleanup.
type NewHarness func(t *testing.T, cfg *Config) Harness

var ctx = context.Background()

// Run runs the whole suite, Linearizable included.
func Run(t *testing.T, newHarness NewHarness) {
	t.Run("OneWinner", func(t *testing.T) { oneWinner(t, newHarness) })
	t.Run("TenantIsolation", func(t *testing.T) { tenantIsolation(t, newHarness) })
	t.Run("StaleHolderFenced", func(t *testing.T) { staleHolderFenced(t, newHarness) })
	t.Run("RetentionClasses", func(t *testing.T) { retentionClasses(t, newHarness) })
	t.Run("OperationIdentity", func(t *testing.T) { operationIdentity(t, newHarness) })
	t.Run("ReleaseCompensations", func(t *testing.T) { releaseCompensations(t, newHarness) })
	t.Run("MarkedUncertain", func(t *testing.T) { markedUncertain(t, newHarness) })
	t.Run("RemoteRenewal", func(t *testing.T) { remoteRenewal(t, newHarness) })
	t.Run("ResolveSince", func(t *testing.T) { resolveSince(t, newHarness) })
	t.Run("StateMachine", func(t *testing.T) { stateMachine(t, newHarness) })
	t.Run("Transactions", func(t *testing.T) { transactions(t, newHarness) })
	t.Run("Events", func(t *testing.T) { events(t, newHarness) })
	t.Run("DataStore", func(t *testing.T) { dataStore(t, newHarness) })
	t.Run("Linearizable", func(t *testing.T) { Linearizable(t, newHarness) })
}

// EnsureDefaults returns a copy of c (which may be nil) with every zero
// field set to its default: a 30 s lease, a 24 h default window and, if
// c names no classes, a "money" class of 30 days.
func (c *Config) EnsureDefaults() *Config {
	var d Config
	if c != nil {
		d = *c
	}
	if d.Lease == 0 {
		d.Lease = 30 * time.Second
	}
	if d.Retention == 0 {
		d.Retention = 24 * time.Hour
	}
	if d.Classes == nil {
		d.Classes = map[string]time.Duration{"money": 30 * 24 * time.Hour}
	}
	return &d
}

// retentionClasses: a claim names a configured class or gets an error that
// leaves nothing behind, and a completed record lives exactly its class's
// window.
func retentionClasses(t *testing.T, newHarness NewHarness) {
	h := newHarness(t, nil)
	defer h.Close()
	s := h.Store()
	id := idemkv.ID{Tenant: "t", Endpoint: "POST /transfers", Key: "tr_1"}
	_, err := s.Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: []byte{1}, Retention: "no-such-class"})
	if !errors.Is(err, idemkv.ErrInvalidArgument) {
		t.Fatalf("claim with an unknown class: %v, want ErrInvalidArgument", err)
	}
	if _, err := s.Get(ctx, id); !errors.Is(err, idemkv.ErrNotFound) {
		t.Fatalf("after a refused claim: %v, want ErrNotFound", err)
	}
	c, err := s.Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: []byte{1}, Retention: "money"})
	must(t, err)
	must(t, s.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, nil))
	h.Advance(24 * time.Hour) // past the default window, inside "money"
	got, err := s.Get(ctx, id)
	must(t, err)
	if got.Class != "money" || got.Result.Status != 201 {
		t.Fatalf("record %+v, want class money, status 201", got)
	}
	h.Advance(29*24*time.Hour - time.Second)
	if _, err := s.Get(ctx, id); err != nil {
		t.Fatalf("a second before expiry: %v", err)
	}
	h.Advance(time.Second)
	if _, err := s.Get(ctx, id); !errors.Is(err, idemkv.ErrNotFound) {
		t.Fatalf("at expiry: %v, want ErrNotFound", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// oneWinner: of many concurrent claims of one key, in both modes, exactly
// one acquires and the rest see InProgress.
func oneWinner(t *testing.T, newHarness NewHarness) {
	h := newHarness(t, nil)
	defer h.Close()
	for round := range 10 {
		id := idemkv.ID{Tenant: "t", Endpoint: "POST /x", Key: fmt.Sprintf("k%d", round)}
		const n = 16
		var wg sync.WaitGroup
		out := make([]idemkv.Outcome, n)
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() {
				c, err := h.Store().Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: []byte("fp"), Mode: idemkv.Mode(i % 2)})
				out[i], errs[i] = c.Outcome, err
			})
		}
		wg.Wait()
		won := 0
		for i := range n {
			must(t, errs[i])
			switch out[i] {
			case idemkv.Acquired:
				won++
			case idemkv.InProgress:
			default:
				t.Fatalf("round %d: unexpected outcome %v", round, out[i])
			}
		}
		if won != 1 {
			t.Fatalf("round %d: %d winners", round, won)
		}
	}
}

// tenantIsolation: the same key string under two tenants names two
// records; neither blocks nor replays the other.
func tenantIsolation(t *testing.T, newHarness NewHarness) {
	h := newHarness(t, nil)
	defer h.Close()
	s := h.Store()
	a := idemkv.ID{Tenant: "alice", Endpoint: "POST /x", Key: "same"}
	b := idemkv.ID{Tenant: "bob", Endpoint: "POST /x", Key: "same"}
	ca, err := s.Claim(ctx, idemkv.ClaimRequest{ID: a, Fingerprint: []byte("A")})
	must(t, err)
	cb, err := s.Claim(ctx, idemkv.ClaimRequest{ID: b, Fingerprint: []byte("B")})
	must(t, err)
	if ca.Outcome != idemkv.Acquired || cb.Outcome != idemkv.Acquired {
		t.Fatalf("outcomes %v %v, want both acquired", ca.Outcome, cb.Outcome)
	}
	must(t, s.Complete(ctx, ca.Lease, idemkv.Result{Status: 201, Body: []byte("alice")}, nil))
	must(t, s.Complete(ctx, cb.Lease, idemkv.Result{Status: 201, Body: []byte("bob")}, nil))
	for id, want := range map[idemkv.ID]string{a: "alice", b: "bob"} {
		fp := []byte(string(want[0] - 'a' + 'A'))
		c, err := s.Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: fp})
		must(t, err)
		if c.Outcome != idemkv.Replay || string(c.Record.Result.Body) != want {
			t.Fatalf("%v: %v %q, want replay %q", id, c.Outcome, c.Record.Result.Body, want)
		}
	}
}

// staleHolderFenced: after a takeover, the stale holder's Complete fails
// with ErrFenced and its effects do not land.
func staleHolderFenced(t *testing.T, newHarness NewHarness) {
	h := newHarness(t, nil)
	defer h.Close()
	s := h.Store()
	id := idemkv.ID{Tenant: "t", Endpoint: "POST /x", Key: "k"}
	req := idemkv.ClaimRequest{ID: id, Fingerprint: []byte("fp")}
	a, err := s.Claim(ctx, req)
	must(t, err)
	h.Advance(h.Config().Lease + time.Second)
	b, err := s.Claim(ctx, req)
	must(t, err)
	if b.Outcome != idemkv.Acquired || !b.Lease.Takeover() || b.Lease.Token <= a.Lease.Token {
		t.Fatalf("takeover: %+v", b)
	}
	err = s.Complete(ctx, a.Lease, idemkv.Result{Status: 200}, func(w idemkv.Effects) error {
		return w.Set([]byte("effect/k"), []byte("stale"))
	})
	if !errors.Is(err, idemkv.ErrFenced) {
		t.Fatalf("stale complete: %v, want ErrFenced", err)
	}
	if _, err := h.ReadEffect([]byte("effect/k")); !errors.Is(err, idemkv.ErrNotFound) {
		t.Fatalf("stale effect landed: %v", err)
	}
	must(t, s.Complete(ctx, b.Lease, idemkv.Result{Status: 200}, nil))
}
