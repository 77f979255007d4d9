package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/internal/pgtest"
	"github.com/idemkv/idemkv/internal/tier"
)

// failoverKeysEnv sets TestServeSurvivesFailover's keys (default 200);
// IDEMKV_KILL_SEED its seed, as for TestServeKillLoop.
const failoverKeysEnv = "IDEMKV_FAILOVER_KEYS"

// TestServeSurvivesFailover loses the database under a running fleet: two
// "idemkv serve" child processes share a PostgreSQL primary that has a
// synchronous standby, through a multi-host URL with
// target_session_attrs=read-write (the primary's address, then the
// standby's), and charge one idemkv processor that times out a third of
// its charges after making them. Clients send each request of a key to a
// process picked at random and retry after any error, 409, 503 or 504.
// When a random share of the keys is acknowledged, the primary is crashed
// (SIGKILL to all its processes) and, after a random outage, the standby
// is promoted, as a failover manager would; the processes are not told,
// and find the new primary through the URL.
//
// During the outage the service must answer 503 store-unavailable (a
// problem+json, with Retry-After) to what it cannot claim or settle, or
// 409/504 as at any time, and nothing else. At the end every key has
// been answered 201, every payment acknowledged before, during or after
// the failover is on the promoted standby (lost 0: a 201 follows a
// commit the standby confirmed), no key made two payments or two charges
// (doubled 0), nothing is left to settle, and idemkv check --store finds
// the new primary sound.
func TestServeSurvivesFailover(t *testing.T) {
	tier.Require(t, "starts a primary, a standby and two serve processes, and fails over")
	keys, seed := failoverKnobs(t)
	rng := rand.New(rand.NewPCG(seed, 0x6661696c))

	primary := pgtest.Start(t)
	dsn := primary.CreateDatabase(t)
	pcfg, err := pgx.ParseConfig(dsn)
	require.NoError(t, err)
	db := pcfg.Database
	standby := primary.StartStandby(t, true)
	store := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/%s?sslmode=disable&target_session_attrs=read-write",
		primary.Port(), standby.Port(), db)

	purl := startFlakyProcessor(t, seed)
	flags := []string{"--store", store, "--processor", purl, "--processor-timeout", "200ms",
		"--reconcile-interval", "50ms", "--reconcile-grace", "300ms"}
	var srvs [2]served
	for i := range srvs {
		srvs[i] = startServe(t, t.TempDir(), flags...)
		t.Cleanup(func() { _ = srvs[i].cmd.Process.Kill() }) // if the test stops short
	}
	pick := func() string { return srvs[rand.IntN(len(srvs))].url } // the clients' goroutines: the global source

	q := newKeyQueue(keys)
	ans := &answerLog{}
	hc := client.New(ans, &client.Options{MaxAttempts: 4, MaxInterval: 200 * time.Millisecond})
	hc.Timeout = 10 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { q.driveTo(ctx, t, hc, pick, nil) })
	}

	// Crash the primary once a random share of the keys is acknowledged,
	// with the clients at full speed.
	killAfter := keys/5 + rng.IntN(keys*2/5)
	waitAcked(t, ctx, q, killAfter)
	ackedAtKill := q.ackedCount()
	ans.phase.Store(phaseOutage)
	killed := time.Now()
	primary.Kill()
	// The outage: as long as a failover manager would take to decide,
	// shortened.
	<-time.NewTimer(time.Duration(300+rng.IntN(700)) * time.Millisecond).C
	// And at least until the service has told a client the store is away.
	ans.waitFor(t, ctx, phaseOutage, "503 store-unavailable")
	ackedAtPromote := q.ackedCount()
	promoting := time.Now()
	standby.Promote(t)
	promoted := time.Now()
	ans.phase.Store(phaseAfter)

	wg.Wait()
	require.NoError(t, ctx.Err(), "keys never answered after the failover")
	require.Empty(t, q.todo, "keys never answered after the failover")
	newPrimary := standby.DSN(db)
	lost, doubled := countPayments(t, hc, pick(), q, keys)
	charges := requireOneChargePerKey(t, purl, keys)
	for _, srv := range srvs {
		require.NoError(t, srv.cmd.Process.Signal(syscall.SIGTERM))
		require.NoError(t, srv.cmd.Wait(), "graceful shutdown")
	}
	requireStoreCheckClean(t, newPrimary, "on the promoted standby")
	requireNothingToSettle(t, newPrimary)

	ans.requireOnlyRetryable(t)
	firstOK := ans.firstAfterPromotion()
	require.False(t, firstOK.IsZero(), "no 201 after the promotion")
	t.Logf("%d keys, %d requests (%d attempts), lost %d, doubled %d; processor: %d charges",
		keys, q.sent.Load(), ans.attempts.Load(), lost, doubled, charges)
	t.Logf("acknowledged: %d when the primary was killed, %d when the standby was promoted, %d at the end",
		ackedAtKill, ackedAtPromote, q.ackedCount())
	t.Logf("outage %v (kill to promotion), promotion took %v, first 201 after the promotion %v after the kill (%v after the promotion; clients wait out a 503's Retry-After of 1 s)",
		promoting.Sub(killed).Round(time.Millisecond), promoted.Sub(promoting).Round(time.Millisecond),
		firstOK.Sub(killed).Round(time.Millisecond), firstOK.Sub(promoted).Round(time.Millisecond))
	for p, name := range phaseNames {
		t.Logf("answers %s: %s", name, ans.summary(p))
	}
}

// failoverKnobs reads TestServeSurvivesFailover's keys from
// IDEMKV_FAILOVER_KEYS (default 200) and its seed from IDEMKV_KILL_SEED
// (default: the clock), and logs the seed.
func failoverKnobs(t *testing.T) (keys int, seed uint64) {
	keys = 200
	if s := os.Getenv(failoverKeysEnv); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err)
		require.GreaterOrEqual(t, n, 10, failoverKeysEnv)
		keys = n
	}
	seed = uint64(time.Now().UnixNano())
	if s := os.Getenv(killSeedEnv); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err)
		seed = n
	}
	t.Logf("seed %d (rerun with %s=%d)", seed, killSeedEnv, seed)
	return keys, seed
}

func (q *keyQueue) ackedCount() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.acked)
}

// waitAcked waits until q has n keys acknowledged.
func waitAcked(t *testing.T, ctx context.Context, q *keyQueue, n int) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for q.ackedCount() < n {
		select {
		case <-ctx.Done():
			t.Fatalf("%d keys acknowledged, waiting for %d: %v", q.ackedCount(), n, ctx.Err())
		case <-tick.C:
		}
	}
}

// The phases of a failover, as answerLog records them.
const (
	phaseBefore = iota // the primary is up
	phaseOutage        // from the primary's crash to the standby's promotion
	phaseAfter         // the standby is the primary
)

var phaseNames = [...]string{"before the kill", "during the outage", "after the promotion"}

// answerLog is the clients' base transport, under their retrying one: it
// records the answer to every attempt, by the phase of the failover in
// which it arrived, as "STATUS" or "STATUS PROBLEM-TYPE" (a problem+json)
// or "error".
type answerLog struct {
	phase    atomic.Int32
	attempts atomic.Int64
	mu       struct {
		sync.Mutex
		counts   [3]map[string]int
		odd      []string  // answers no client should get, with their bodies
		firstOK  time.Time // of the first 201 after the promotion
		problems int       // answers 409, 503 or 504 that are not problem+json
	}
}

func (a *answerLog) RoundTrip(req *http.Request) (*http.Response, error) {
	a.attempts.Add(1)
	resp, err := http.DefaultTransport.RoundTrip(req)
	phase := a.phase.Load()
	if err != nil {
		a.record(phase, "error", "", nil)
		return nil, err
	}
	body, rerr := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if rerr != nil {
		a.record(phase, "error", "", nil)
		return nil, rerr
	}
	answer := strconv.Itoa(resp.StatusCode)
	isProblem := resp.Header.Get("Content-Type") == "application/problem+json"
	if isProblem {
		var p struct{ Type string }
		if json.Unmarshal(body, &p) == nil {
			_, kind, _ := strings.Cut(path.Base(p.Type), "#") // ".../http.md#store-unavailable"
			answer += " " + kind
		}
	}
	a.record(phase, answer, resp.Header.Get("Retry-After"), func() bool {
		switch resp.StatusCode {
		case http.StatusCreated, http.StatusOK:
			return true
		case http.StatusConflict, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			return isProblem
		}
		return false
	})
	if !slices.Contains([]int{http.StatusCreated, http.StatusOK, http.StatusConflict,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout}, resp.StatusCode) {
		a.flag(fmt.Sprintf("%s %s: %d %s", phaseNames[phase], req.URL.Path, resp.StatusCode, body))
	}
	return resp, nil
}

// record counts answer in phase; ok, if given, says whether it is well
// formed.
func (a *answerLog) record(phase int32, answer, retryAfter string, ok func() bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.mu.counts[phase] == nil {
		a.mu.counts[phase] = map[string]int{}
	}
	a.mu.counts[phase][answer]++
	if phase == phaseAfter && strings.HasPrefix(answer, "201") && a.mu.firstOK.IsZero() {
		a.mu.firstOK = time.Now()
	}
	if ok != nil && !ok() {
		a.mu.problems++
	}
	if strings.HasPrefix(answer, "503") && retryAfter == "" {
		a.mu.odd = append(a.mu.odd, fmt.Sprintf("%s: a 503 without Retry-After", phaseNames[phase]))
	}
}

func (a *answerLog) flag(s string) {
	a.mu.Lock()
	a.mu.odd = append(a.mu.odd, s)
	a.mu.Unlock()
}

// waitFor waits until an attempt has been answered answer in phase.
func (a *answerLog) waitFor(t *testing.T, ctx context.Context, phase int, answer string) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		a.mu.Lock()
		n := a.mu.counts[phase][answer]
		a.mu.Unlock()
		if n > 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no answer %q %s: %v", answer, phaseNames[phase], ctx.Err())
		case <-tick.C:
		}
	}
}

func (a *answerLog) firstAfterPromotion() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.mu.firstOK
}

// requireOnlyRetryable fails the test if any attempt was answered other
// than 200/201, or 409, 503 or 504 as problem+json (503 with
// Retry-After).
func (a *answerLog) requireOnlyRetryable(t *testing.T) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	require.Empty(t, a.mu.odd, "answers a client of a failing-over service should not get")
	require.Zero(t, a.mu.problems, "409/503/504 answers that are not problem+json")
}

// summary lists phase's answers, most frequent first.
func (a *answerLog) summary(phase int) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	type kv struct {
		answer string
		n      int
	}
	var all []kv
	for k, n := range a.mu.counts[phase] {
		all = append(all, kv{k, n})
	}
	slices.SortFunc(all, func(x, y kv) int {
		if x.n != y.n {
			return y.n - x.n
		}
		return strings.Compare(x.answer, y.answer)
	})
	var b strings.Builder
	for i, e := range all {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%d× %s", e.n, e.answer)
	}
	if b.Len() == 0 {
		return "none"
	}
	return b.String()
}
