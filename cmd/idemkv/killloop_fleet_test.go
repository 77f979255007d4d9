package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/tier"
	"github.com/idemkv/idemkv/natsjs/natstest"
	"github.com/idemkv/idemkv/pgstore"
	"github.com/idemkv/idemkv/pgstore/pgtest"
)

// fleetKillCyclesEnv sets TestServeFleetKillLoop's kill cycles (default
// 5); IDEMKV_KILL_SEED its seed, as for TestServeKillLoop.
const fleetKillCyclesEnv = "IDEMKV_FLEET_KILL_CYCLES"

// TestServeFleetKillLoop is the kill loop of a fleet: three "idemkv serve
// --store postgres://..." child processes on one PostgreSQL database,
// charging one idemkv processor that times out a third of its charges
// after making them, under clients that send each request of a key to a
// process picked at random and retry after any error, 409 or 503. Each
// cycle kills one of the processes with SIGKILL at a random moment and
// starts it again; what it was doing is taken over (a retry on another
// process, after the 1 s lease) or reconciled (by another process's
// reconciler). At the end every key answers 201 with the payment it was
// acknowledged with (lost 0), no key made two payments or two charges
// (doubled 0), nothing is left to settle, and idemkv check --store finds
// the store sound after every kill (the others still running) and at the
// end.
func TestServeFleetKillLoop(t *testing.T) {
	tier.Require(t, "starts and kills processes for several seconds")
	cycles, seed := killKnobs(t, fleetKillCyclesEnv)
	rng := rand.New(rand.NewPCG(seed, 0x666c6565))
	purl := startFlakyProcessor(t, seed)
	dsn := pgtest.Shared(t).CreateDatabase(t)
	ns := natstest.Start(t)
	flags := []string{"--store", dsn, "--processor", purl, "--processor-timeout", "200ms",
		"--reconcile-interval", "50ms", "--reconcile-grace", "300ms", "--events", ns.URL()}

	var (
		mu   sync.Mutex
		srvs [3]served
	)
	for i := range srvs {
		srvs[i] = startServe(t, t.TempDir(), flags...)
	}
	pick := func() string { // from the clients' goroutines: the global source
		mu.Lock()
		defer mu.Unlock()
		return srvs[rand.IntN(len(srvs))].url
	}
	keys := 60 * cycles
	q := newKeyQueue(keys)
	hc := retryingClient()
	var cut atomic.Int64
	for cycle := range cycles {
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() { q.driveTo(ctx, t, hc, pick, &cut) })
		}
		<-time.NewTimer(time.Duration(100+rng.IntN(400)) * time.Millisecond).C
		mu.Lock()
		victim := rng.IntN(len(srvs))
		require.NoError(t, srvs[victim].cmd.Process.Kill(), "cycle %d", cycle)
		_ = srvs[victim].cmd.Wait()
		mu.Unlock()
		// The others keep serving the clients for a moment, then the
		// oracle runs with the two survivors up.
		<-time.NewTimer(time.Duration(rng.IntN(200)) * time.Millisecond).C
		cancel()
		wg.Wait()
		requireStoreCheckClean(t, dsn, fmt.Sprintf("cycle %d", cycle))
		mu.Lock()
		srvs[victim] = startServe(t, t.TempDir(), flags...)
		mu.Unlock()
	}

	// Recovery: every key is retried, against any process, until it is
	// answered.
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { q.driveTo(ctx, t, hc, pick, nil) })
	}
	wg.Wait()
	cancel()
	require.Empty(t, q.todo, "keys never answered after recovery")
	settle := time.Since(start)
	lost, doubled := countPayments(t, hc, srvs[0].url, q, keys)
	charges := requireOneChargePerKey(t, purl, keys)
	for lag := -1; lag != 0; { // the relays drain what the kills left
		require.Less(t, time.Since(start), 3*time.Minute, "the outbox did not drain")
		lag = outboxLag(t, srvs[0].url)
	}
	msgs := requireOneMessagePerPayment(t, ns, q, keys)

	for _, srv := range srvs {
		require.NoError(t, srv.cmd.Process.Signal(syscall.SIGTERM))
		require.NoError(t, srv.cmd.Wait(), "graceful shutdown")
	}
	requireStoreCheckClean(t, dsn, "at the end")
	requireNothingToSettle(t, dsn)
	t.Logf("%d kill cycles over 3 processes, %d requests, %d payments acknowledged, lost %d, doubled %d, %d requests cut off by a kill; "+
		"processor: %d charges for %d keys; stream: %d messages; recovery settled everything in %v",
		cycles, q.sent.Load(), len(q.acked), lost, doubled, cut.Load(), charges, keys, msgs, settle.Round(time.Millisecond))
}

// requireStoreCheckClean runs "idemkv check --store url".
func requireStoreCheckClean(t *testing.T, url, when string) {
	t.Helper()
	var out, errOut strings.Builder
	require.Equal(t, exitOK, run(context.Background(), []string{"check", "--store", url}, &out, &errOut),
		"check %s: %s%s", when, out.String(), errOut.String())
}

// requireNothingToSettle fails unless the store at url lists no record
// awaiting reconciliation and none escalated.
func requireNothingToSettle(t *testing.T, url string) {
	s, err := pgstore.Open(context.Background(), url, &pgstore.Options{NoBackgroundSweep: true, NoListen: true})
	require.NoError(t, err)
	defer s.Close()
	for _, esc := range []bool{false, true} {
		page, err := s.List(context.Background(), idemkv.ListRequest{Escalated: esc})
		require.NoError(t, err)
		require.Empty(t, page.Records, "escalated %v", esc)
	}
}
