package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/idemkv/idemkv/examples/processor"
	"github.com/idemkv/idemkv/internal/tier"
	"github.com/idemkv/idemkv/pgstore/pgtest"
	"github.com/stretchr/testify/require"
)

// httpIn is one POST /v1/payments: its idempotency key.
type httpIn struct{ Key string }

// httpOut is what the client saw: the status and the payment id of a
// 201, or Status 0 when the request timed out or its connection failed
// (the outcome is unknown to the client).
type httpOut struct {
	Status int
	ID     string
}

// httpState is one key's state: whether its payment exists, and its id.
type httpState struct {
	Created bool
	ID      string
}

// httpModel is the service's contract for one key, as a client sees it:
//
//   - 201 either creates the key's payment (the first) or replays it,
//     with the same id;
//   - 409 (in progress) and 503 (nothing was charged; retry) come only
//     from a request that took effect before the payment existed;
//   - a request that timed out tells the client nothing, so any state
//     allows it and it changes none (if it did create the payment, a
//     later 201 is the first the history shows).
var httpModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		for _, op := range history {
			k := op.Input.(httpIn).Key
			byKey[k] = append(byKey[k], op)
		}
		keys := make([]string, 0, len(byKey))
		for k := range byKey {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var out [][]porcupine.Operation
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() any { return httpState{} },
	Step: func(state, input, output any) (bool, any) {
		s, out := state.(httpState), output.(httpOut)
		switch out.Status {
		case 0:
			return true, s
		case http.StatusCreated:
			if !s.Created {
				return true, httpState{Created: true, ID: out.ID}
			}
			return out.ID == s.ID, s
		case http.StatusConflict, http.StatusServiceUnavailable:
			return !s.Created, s
		}
		return false, s
	},
	DescribeOperation: func(input, output any) string {
		out := output.(httpOut)
		return fmt.Sprintf("POST %s -> %d %s", input.(httpIn).Key, out.Status, out.ID)
	},
	DescribeState: func(state any) string {
		s := state.(httpState)
		if !s.Created {
			return "no payment"
		}
		return "payment " + s.ID
	},
}

// TestHTTPLinearizability records concurrent histories of payments against
// "idemkv serve" running as a child process on loopback, with hot keys, a
// slow card processor and clients that give up on some requests early, and
// checks them against httpModel with porcupine.
func TestHTTPLinearizability(t *testing.T) {
	tier.Require(t, "runs for a few seconds")
	for round := range 3 {
		dir := t.TempDir()
		srv := startServe(t, dir, "--provider-latency", "2ms")
		ops := httpLinHistory(round, []string{srv.url}, func(format string, args ...any) { t.Errorf(format, args...) })
		require.NoError(t, srv.cmd.Process.Signal(syscall.SIGTERM))
		require.NoError(t, srv.cmd.Wait())
		requireCheckClean(t, dir, fmt.Sprintf("after round %d", round))
		httpLinCheck(t, round, ops)
	}
}

// TestHTTPLinearizabilityFleet is TestHTTPLinearizability against two
// "idemkv serve --store" processes sharing one PostgreSQL database and
// one idemkv processor (serve requires one with --store), each request
// sent to one of them at random: one key's history across both processes
// must be one linearizable history. The last round serves with --wait:
// a duplicate waits for the first attempt's outcome whichever process
// runs it, so no request is answered 409.
func TestHTTPLinearizabilityFleet(t *testing.T) {
	tier.Require(t, "runs for a few seconds")
	for round := range 3 {
		waits := round == 2
		dsn := pgtest.Shared(t).CreateDatabase(t)
		purl := startTestProcessor(t, processor.Options{Latency: 2 * time.Millisecond})
		args := []string{"--store", dsn, "--processor", purl}
		if waits {
			args = append(args, "--wait", "30s")
		}
		var srvs []served
		var urls []string
		for range 2 {
			srv := startServe(t, t.TempDir(), args...)
			srvs, urls = append(srvs, srv), append(urls, srv.url)
		}
		ops := httpLinHistory(round, urls, func(format string, args ...any) { t.Errorf(format, args...) })
		for _, srv := range srvs {
			require.NoError(t, srv.cmd.Process.Signal(syscall.SIGTERM))
			require.NoError(t, srv.cmd.Wait())
		}
		requireStoreCheckClean(t, dsn, fmt.Sprintf("after round %d", round))
		counts := httpLinCheck(t, round, ops)
		if waits {
			require.Zero(t, counts[http.StatusConflict], "round %d: duplicates answered 409 despite --wait", round)
		}
	}
}

// httpLinHistory runs 16 clients of 40 payments each over 12 hot keys,
// each request to one of urls, an eighth of them given up on within 3 ms,
// and returns the history; errorf reports an unexpected status.
func httpLinHistory(round int, urls []string, errorf func(format string, args ...any)) []porcupine.Operation {
	var (
		clock atomic.Int64 // logical time: call and return order
		mu    sync.Mutex
		ops   []porcupine.Operation
		wg    sync.WaitGroup
	)
	for c := range 16 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(round), uint64(c)))
			for range 40 {
				key := fmt.Sprintf("order-%d", rng.IntN(12))
				url := urls[rng.IntN(len(urls))]
				ctx, cancel := context.WithCancel(context.Background())
				if rng.IntN(8) == 0 {
					ctx, cancel = context.WithTimeout(context.Background(), time.Duration(rng.IntN(3000))*time.Microsecond)
				}
				call := clock.Add(1)
				out := httpPay(ctx, url, key)
				ret := clock.Add(1)
				cancel()
				if out.Status != 0 && out.Status != http.StatusCreated && out.Status != http.StatusConflict && out.Status != http.StatusServiceUnavailable {
					errorf("%s: unexpected status %d", key, out.Status)
				}
				mu.Lock()
				ops = append(ops, porcupine.Operation{ClientId: c, Input: httpIn{key}, Call: call, Output: out, Return: ret})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return ops
}

// httpLinCheck checks a round's history against httpModel and returns
// the count of each status.
func httpLinCheck(t *testing.T, round int, ops []porcupine.Operation) map[int]int {
	res := porcupine.CheckOperationsTimeout(httpModel, ops, 30*time.Second)
	require.Equal(t, porcupine.Ok, res, "round %d: %d operations are not linearizable", round, len(ops))
	counts := map[int]int{}
	for _, op := range ops {
		counts[op.Output.(httpOut).Status]++
	}
	t.Logf("round %d: %d operations linearizable; by status %v (0: gave up)", round, len(ops), counts)
	return counts
}

func httpPay(ctx context.Context, url, key string) httpOut {
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/payments",
		strings.NewReader(`{"amount":700,"currency":"USD","card":"tok_lin"}`))
	req.Header.Set("Authorization", "Bearer acct_lin")
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return httpOut{}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return httpOut{}
	}
	out := httpOut{Status: resp.StatusCode}
	if resp.StatusCode == http.StatusCreated {
		var p struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(b, &p) == nil {
			out.ID = p.ID
		}
	}
	return out
}

// TestHTTPModelHasTeeth checks that the model rejects the histories the
// service must never produce.
func TestHTTPModelHasTeeth(t *testing.T) {
	op := func(client int, call, ret int64, out httpOut) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Input: httpIn{"k"}, Call: call, Output: out, Return: ret}
	}
	created := httpOut{Status: http.StatusCreated, ID: "pay_1"}
	for name, tc := range map[string]struct {
		ops  []porcupine.Operation
		want porcupine.CheckResult
	}{
		"a 409 overlapping the creation":    {[]porcupine.Operation{op(0, 1, 4, created), op(1, 2, 3, httpOut{Status: 409})}, porcupine.Ok},
		"a 409 after the creation returned": {[]porcupine.Operation{op(0, 1, 2, created), op(1, 3, 4, httpOut{Status: 409})}, porcupine.Illegal},
		"two payments for one key":          {[]porcupine.Operation{op(0, 1, 2, created), op(1, 3, 4, httpOut{Status: 201, ID: "pay_2"})}, porcupine.Illegal},
		"a replay of the same payment":      {[]porcupine.Operation{op(0, 1, 2, created), op(1, 3, 4, created)}, porcupine.Ok},
		"a 503 after the creation returned": {[]porcupine.Operation{op(0, 1, 2, created), op(1, 3, 4, httpOut{Status: 503})}, porcupine.Illegal},
		"a timeout anywhere":                {[]porcupine.Operation{op(0, 1, 2, created), op(1, 3, 4, httpOut{})}, porcupine.Ok},
	} {
		require.Equal(t, tc.want, porcupine.CheckOperationsTimeout(httpModel, tc.ops, 0), name)
	}
}
