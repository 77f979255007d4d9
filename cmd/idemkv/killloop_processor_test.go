package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv/examples/processor"
	"github.com/idemkv/idemkv/internal/logtest"
	"github.com/idemkv/idemkv/internal/tier"
)

// processorKillCyclesEnv sets TestServeProcessorKillLoop's kill cycles
// (default 5); IDEMKV_KILL_SEED its seed, as for TestServeKillLoop.
const processorKillCyclesEnv = "IDEMKV_PROCESSOR_KILL_CYCLES"

// TestServeProcessorKillLoop is the kill loop of the remote half:
// "idemkv serve --processor URL" as a child process, charging an idemkv
// processor (in this process, so that its charges outlive every kill)
// that times out a third of its charges after making them, under clients
// that retry every key, killed with SIGKILL at random moments. At the end,
// within a bounded settle time, every key answers 201 with the payment it
// was acknowledged with, the processor holds exactly one charge per key,
// nothing is left awaiting reconciliation or escalated, and idemkv check
// finds the store sound after every kill and at the end.
func TestServeProcessorKillLoop(t *testing.T) {
	tier.Require(t, "starts and kills processes for several seconds")
	cycles, seed := killKnobs(t, processorKillCyclesEnv)
	rng := rand.New(rand.NewPCG(seed, 0x70726f63))

	purl := startFlakyProcessor(t, seed)
	flags := []string{"--processor", purl, "--processor-timeout", "200ms",
		"--reconcile-interval", "50ms", "--reconcile-grace", "300ms"}

	dir := t.TempDir()
	keys := 60 * cycles
	q := newKeyQueue(keys)
	hc := retryingClient()
	cut := killCycles(t, dir, q, hc, cycles, func() time.Duration {
		return time.Duration(100+rng.IntN(400)) * time.Millisecond
	}, flags...)

	// Recovery: the reconciler settles what the kills and the timeouts
	// left; every key is retried until it is answered.
	start := time.Now()
	srv := recoverKeys(t, dir, q, hc, flags...)
	settle := time.Since(start)
	lost, doubled := countPayments(t, hc, srv.url, q, keys)

	charges := requireOneChargePerKey(t, purl, keys)

	require.NoError(t, srv.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, srv.cmd.Wait(), "graceful shutdown")
	requireCheckClean(t, dir, "at the end")
	for _, list := range [][]string{{"pending", "--data", dir}, {"pending", "--data", dir, "--escalated"}} {
		var out, errOut strings.Builder
		require.Equal(t, exitOK, run(context.Background(), list, &out, &errOut), errOut.String())
		require.Equal(t, 1, strings.Count(out.String(), "\n"), "nothing left to settle: %s", out.String())
	}
	t.Logf("%d kill cycles, %d requests, %d payments acknowledged, lost %d, doubled %d, %d requests cut off by a kill; "+
		"processor: %d charges for %d keys; recovery settled everything in %v",
		cycles, q.sent.Load(), len(q.acked), lost, doubled, cut, charges, keys, settle.Round(time.Millisecond))
}

// startFlakyProcessor runs an idemkv processor in this process (so that
// its charges outlive every kill of serve) that times out a third of its
// charges after making them, until the test ends; it returns its URL.
func startFlakyProcessor(t *testing.T, seed uint64) string {
	return startTestProcessor(t, processor.Options{TimeoutRate: 1.0 / 3, Hold: time.Minute, Rand: rand.New(rand.NewPCG(seed, 1))})
}

// startTestProcessor runs an idemkv processor with o until the test ends
// and returns its URL.
func startTestProcessor(t *testing.T, o processor.Options) string {
	pln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	pctx, pcancel := context.WithCancel(context.Background())
	var pout logtest.Log
	pdone := make(chan error, 1)
	go func() {
		pdone <- runProcessor(pctx, pln, processorConfig{dir: t.TempDir(), retention: time.Hour, o: o}, &pout)
	}()
	t.Cleanup(func() {
		pcancel()
		require.NoError(t, <-pdone)
	})
	return "http://" + pln.Addr().String()
}

// requireOneChargePerKey checks that the processor at purl holds exactly
// one charge for each of the keys order-00000..., named by the payment's
// description (the key); it returns the number of charges.
func requireOneChargePerKey(t *testing.T, purl string, keys int) int {
	resp, err := http.Get(purl + "/v1/charges")
	require.NoError(t, err)
	var all struct{ Charges []processor.Charge }
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&all))
	resp.Body.Close()
	perKey := map[string]int{}
	for _, c := range all.Charges {
		perKey[c.Description]++
	}
	for i := range keys {
		key := fmt.Sprintf("order-%05d", i)
		require.Equal(t, 1, perKey[key], "charges for %s", key)
	}
	require.Len(t, all.Charges, keys)
	return len(all.Charges)
}
