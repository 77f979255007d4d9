package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/internal/tier"
)

// Environment of TestServeKillLoop.
const (
	killCyclesEnv = "IDEMKV_KILL_CYCLES" // kill cycles (default 5)
	killSeedEnv   = "IDEMKV_KILL_SEED"   // seed of the kill timing (default: the clock)
)

// TestServeKillLoop is the kill-and-check loop against the payments
// service: it starts "idemkv serve" as a child process on loopback, drives
// it with concurrent clients that retry every key after any error, 409 or
// 503 (as real clients do), kills it with SIGKILL at random moments and
// restarts it, cycle after cycle. At the end it retries every key until it
// is answered, then counts the payments each key created, through the
// service's own listing: every acknowledged payment must be there (lost =
// 0), no key may have created two (doubled = 0), and idemkv check must
// find the store sound after every kill and at the end.
func TestServeKillLoop(t *testing.T) {
	tier.Require(t, "starts and kills processes for several seconds")
	cycles, seed := killKnobs(t, killCyclesEnv)
	rng := rand.New(rand.NewPCG(seed, 0x6b696c6c))
	dir := t.TempDir()

	// 120 new keys a cycle, 500 to an account (the listing's page is
	// 1,000).
	keys := 120 * cycles
	q := newKeyQueue(keys)
	hc := retryingClient()
	inFlightAtKill := killCycles(t, dir, q, hc, cycles, func() time.Duration {
		return time.Duration(50+rng.IntN(250)) * time.Millisecond
	})

	// Recovery: retry everything not yet answered until it is.
	srv := recoverKeys(t, dir, q, hc)
	lost, doubled := countPayments(t, hc, srv.url, q, keys)

	require.NoError(t, srv.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, srv.cmd.Wait(), "graceful shutdown")
	requireCheckClean(t, dir, "at the end")
	t.Logf("%d kill cycles, %d requests, %d payments acknowledged, lost %d, doubled %d, %d requests cut off by a kill (each retried to one payment)",
		cycles, q.sent.Load(), len(q.acked), lost, doubled, inFlightAtKill)
}

// newKeyQueue holds keys new keys, 500 to an account.
func newKeyQueue(keys int) *keyQueue {
	q := &keyQueue{acked: map[job]string{}}
	for i := range keys {
		q.todo = append(q.todo, job{tenant: fmt.Sprintf("acct_kill_%d", i/500), key: fmt.Sprintf("order-%05d", i)})
	}
	return q
}

// killCycles runs cycles kill cycles over dir: it starts serve with
// flags, lets eight clients drive q's keys through hc for window(), kills
// serve with SIGKILL, and checks the store as the kill left it. It returns
// how many requests a kill cut off.
func killCycles(t *testing.T, dir string, q *keyQueue, hc *http.Client, cycles int, window func() time.Duration, flags ...string) int64 {
	var cut atomic.Int64
	for cycle := range cycles {
		srv := startServe(t, dir, flags...)
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() { q.drive(ctx, t, hc, srv.url, &cut) })
		}
		// Let the clients work for a random moment, then pull the plug.
		<-time.NewTimer(window()).C
		require.NoError(t, srv.cmd.Process.Kill(), "cycle %d", cycle)
		_ = srv.cmd.Wait()
		cancel()
		wg.Wait()
		// The oracle, on the store exactly as the kill left it.
		requireCheckClean(t, dir, fmt.Sprintf("cycle %d", cycle))
	}
	return cut.Load()
}

// recoverKeys starts serve with flags over dir and retries every key not
// yet answered until it is (for at most two minutes); it returns the
// running serve.
func recoverKeys(t *testing.T, dir string, q *keyQueue, hc *http.Client, flags ...string) served {
	srv := startServe(t, dir, flags...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { q.drive(ctx, t, hc, srv.url, nil) })
	}
	wg.Wait()
	require.Empty(t, q.todo, "keys never answered after recovery")
	return srv
}

// retryingClient is the kill loops' client: package client's Transport,
// which keeps each request's key across its own retries, honouring
// Retry-After; the loops re-queue what it gives up on.
func retryingClient() *http.Client {
	hc := client.New(nil, &client.Options{MaxAttempts: 4, MaxInterval: 200 * time.Millisecond})
	hc.Timeout = 10 * time.Second
	return hc
}

// countPayments lists every account's payments through the service and
// checks them against what was acknowledged: it returns the keys whose
// acknowledged payment is missing (lost) and those with more than one
// (doubled), failing the test on either.
func countPayments(t *testing.T, hc *http.Client, url string, q *keyQueue, keys int) (lost, doubled int) {
	created := map[job][]string{}
	total := 0
	for a := 0; a*500 < keys; a++ {
		tenant := fmt.Sprintf("acct_kill_%d", a)
		req, _ := http.NewRequest("GET", url+"/v1/payments?limit=1000", nil)
		req.Header.Set("Authorization", "Bearer "+tenant)
		resp, err := hc.Do(req)
		require.NoError(t, err)
		var list struct {
			Data []struct {
				ID          string `json:"id"`
				Description string `json:"description"`
			} `json:"data"`
			HasMore bool `json:"has_more"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&list))
		resp.Body.Close()
		require.False(t, list.HasMore)
		for _, p := range list.Data {
			j := job{tenant: tenant, key: p.Description}
			created[j] = append(created[j], p.ID)
		}
		total += len(list.Data)
	}
	for j, id := range q.acked {
		switch ids := created[j]; {
		case len(ids) == 0:
			lost++
			t.Errorf("%v: acknowledged as %s, but no payment exists", j, id)
		case len(ids) > 1:
			doubled++
			t.Errorf("%v: %d payments %v", j, len(ids), ids)
		case ids[0] != id:
			lost++
			t.Errorf("%v: acknowledged as %s, stored as %s", j, id, ids[0])
		}
	}
	require.Len(t, q.acked, keys, "every key is answered in the end")
	require.Equal(t, keys, total, "one payment per key")
	return lost, doubled
}

// killKnobs reads a kill loop's cycles from cyclesEnv (default 5) and its
// seed from IDEMKV_KILL_SEED (default: the clock), and logs the seed.
func killKnobs(t *testing.T, cyclesEnv string) (cycles int, seed uint64) {
	cycles = 5
	if s := os.Getenv(cyclesEnv); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err)
		cycles = n
	}
	seed = uint64(time.Now().UnixNano())
	if s := os.Getenv(killSeedEnv); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err)
		seed = n
	}
	t.Logf("seed %d (rerun with %s=%d)", seed, killSeedEnv, seed)
	return cycles, seed
}

// served is a running "idemkv serve" child.
type served struct {
	cmd    *exec.Cmd
	url    string
	banner string // the line that says where it listens
}

// startServe starts the test binary as "idemkv serve" on a free loopback
// port over dir, with a 1 s lease and flags, and waits for it to say where
// it listens.
func startServe(t *testing.T, dir string, flags ...string) served {
	t.Helper()
	return startServeEnv(t, dir, nil, flags...)
}

// startServeEnv is startServe with env added to the child's environment.
func startServeEnv(t *testing.T, dir string, env []string, flags ...string) served {
	t.Helper()
	args := append([]string{"serve", "--addr", "127.0.0.1:0", "--data", dir, "--lease", "1s"}, flags...)
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(append(os.Environ(), "IDEMKV_TEST_AS_MAIN=1"), env...)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = io.Discard
	require.NoError(t, cmd.Start())
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if _, rest, ok := strings.Cut(sc.Text(), "payments service on "); ok {
			url, _, _ := strings.Cut(rest, " ")
			go io.Copy(io.Discard, stdout)
			return served{cmd: cmd, url: url, banner: sc.Text()}
		}
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	t.Fatalf("serve did not start: %v", sc.Err())
	return served{}
}

// job is one idempotency key of one account.
type job struct{ tenant, key string }

// keyQueue holds the keys still to be answered and the payment each
// answered key was acknowledged with.
type keyQueue struct {
	mu    sync.Mutex
	todo  []job
	acked map[job]string
	sent  atomic.Int64
}

func (q *keyQueue) next() (job, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.todo) == 0 {
		return job{}, false
	}
	k := q.todo[0]
	q.todo = q.todo[1:]
	return k, true
}

func (q *keyQueue) retry(k job) {
	q.mu.Lock()
	q.todo = append(q.todo, k)
	q.mu.Unlock()
}

// drive sends keys until ctx ends or none is left. A key goes back to the
// queue after anything but a 201; a request cut off by a kill (ctx already
// done when it fails) is counted in cut.
func (q *keyQueue) drive(ctx context.Context, t *testing.T, client *http.Client, url string, cut *atomic.Int64) {
	q.driveTo(ctx, t, client, func() string { return url }, cut)
}

// driveTo is drive sending each request to the service pick names.
func (q *keyQueue) driveTo(ctx context.Context, t *testing.T, client *http.Client, pick func() string, cut *atomic.Int64) {
	for ctx.Err() == nil {
		k, ok := q.next()
		if !ok {
			return
		}
		url := pick()
		body := fmt.Sprintf(`{"amount":%d,"currency":"USD","card":"tok_visa","description":%q}`, 100+len(k.key), k.key)
		req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/payments", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+k.tenant)
		req.Header.Set("Idempotency-Key", k.key)
		q.sent.Add(1)
		resp, err := client.Do(req)
		if err != nil {
			if cut != nil {
				cut.Add(1)
			}
			q.retry(k)
			continue
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			// The server died between the headers and the body: the
			// answer is lost like any cut connection's.
			if cut != nil {
				cut.Add(1)
			}
			q.retry(k)
			continue
		}
		switch resp.StatusCode {
		case http.StatusCreated:
			var p struct {
				ID string `json:"id"`
			}
			if err := json.Unmarshal(b, &p); err != nil {
				t.Errorf("%v: bad 201 body %q", k, b)
				return
			}
			q.mu.Lock()
			if prev, dup := q.acked[k]; dup && prev != p.ID {
				t.Errorf("%v: acknowledged as %s and as %s", k, prev, p.ID)
			}
			q.acked[k] = p.ID
			q.mu.Unlock()
		case http.StatusConflict, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			// In progress (a killed attempt's lease has not run out),
			// being reconciled (the processor's answer was lost) or the
			// store is busy: come back after Retry-After.
			q.retry(k)
			wait, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
			backoff := time.NewTimer(time.Duration(max(wait, 1)) * time.Second)
			select {
			case <-backoff.C:
			case <-ctx.Done():
				backoff.Stop()
			}
		default:
			t.Errorf("%v: unexpected %d: %s", k, resp.StatusCode, b)
			return
		}
	}
}

// requireCheckClean runs "idemkv check" on the store in dir, which no
// process may have open, and fails the test unless every invariant holds.
func requireCheckClean(t *testing.T, dir, when string) {
	t.Helper()
	var out, errOut strings.Builder
	require.Equal(t, exitOK, run(context.Background(), []string{"check", "--data", dir}, &out, &errOut),
		"check %s: %s%s", when, out.String(), errOut.String())
}
