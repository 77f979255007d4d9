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
	"github.com/idemkv/idemkv/internal/tier"
	"github.com/idemkv/idemkv/pgstore/pgtest"
)

// failoverKeysEnv sets TestServeSurvivesFailover's keys (default 200 a
// failover); failoverRoundsEnv its failovers (default 1; the long form,
// docs/reliability.md, runs 5); IDEMKV_KILL_SEED its seed, as for
// TestServeKillLoop.
const (
	failoverKeysEnv   = "IDEMKV_FAILOVER_KEYS"
	failoverRoundsEnv = "IDEMKV_FAILOVER_ROUNDS"
)

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
// and find the new primary through the URL. With more than one round
// (IDEMKV_FAILOVER_ROUNDS), the lost primary is then rebuilt, on its own
// address, as the synchronous standby of the new one, which is crashed in
// its turn once more keys are acknowledged, and so on.
//
// During each outage the service must answer 503 store-unavailable (a
// problem+json, with Retry-After) to what it cannot claim or settle, or
// 409/504 as at any time, and nothing else. At the end every key has
// been answered 201, every payment acknowledged before, during or after
// the failovers is on the last primary (lost 0: a 201 follows a commit
// the standby confirmed), no key made two payments or two charges
// (doubled 0), nothing is left to settle, and idemkv check --store finds
// the last primary sound.
func TestServeSurvivesFailover(t *testing.T) {
	tier.Require(t, "starts a primary, a standby and two serve processes, and fails over")
	keys, rounds, seed := failoverKnobs(t)
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
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rounds)*2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { q.driveTo(ctx, t, hc, pick, nil) })
	}

	servers := [2]*pgtest.Server{primary, standby} // servers[cur] is the primary
	cur := 0
	for round := range rounds {
		// Crash the primary once a random share of this round's keys is
		// acknowledged, with the clients at full speed.
		share := keys / (rounds + 1)
		killAfter := round*share + share/2 + rng.IntN(share)
		waitAcked(t, ctx, q, killAfter)
		ackedAtKill := q.ackedCount()
		// An outage with nothing left to pay would see no 503.
		require.Less(t, ackedAtKill, keys, "every key was paid before failover %d: raise %s", round+1, failoverKeysEnv)
		seen := ans.count(phaseOutage, "503 store-unavailable")
		ans.phase.Store(phaseOutage)
		killed := time.Now()
		servers[cur].Kill()
		// The outage: as long as a failover manager would take to decide,
		// shortened.
		<-time.NewTimer(time.Duration(300+rng.IntN(700)) * time.Millisecond).C
		// And at least until the service has told a client the store is away.
		ans.waitFor(t, ctx, phaseOutage, "503 store-unavailable", seen)
		ackedAtPromote := q.ackedCount()
		promoting := time.Now()
		servers[1-cur].Promote(t)
		promoted := time.Now()
		ans.phase.Store(phaseAfter)
		t.Logf("failover %d: acknowledged %d at the kill, %d at the promotion; outage %v, promotion %v",
			round+1, ackedAtKill, ackedAtPromote, promoting.Sub(killed).Round(time.Millisecond), promoted.Sub(promoting).Round(time.Millisecond))
		if round < rounds-1 {
			rebuilding := time.Now()
			servers[cur].Rebuild(t, servers[1-cur], true)
			t.Logf("failover %d: the lost primary rebuilt as the new standby in %v", round+1, time.Since(rebuilding).Round(time.Millisecond))
		}
		cur = 1 - cur
	}

	wg.Wait()
	require.NoError(t, ctx.Err(), "keys never answered after the failover")
	require.Empty(t, q.todo, "keys never answered after the failover")
	newPrimary := servers[cur].DSN(db)
	lost, doubled := countPayments(t, hc, pick(), q, keys)
	charges := requireOneChargePerKey(t, purl, keys)
	for _, srv := range srvs {
		require.NoError(t, srv.cmd.Process.Signal(syscall.SIGTERM))
		require.NoError(t, srv.cmd.Wait(), "graceful shutdown")
	}
	requireStoreCheckClean(t, newPrimary, "on the last promoted standby")
	requireNothingToSettle(t, newPrimary)

	ans.requireOnlyRetryable(t)
	require.False(t, ans.firstAfterPromotion().IsZero(), "no 201 after a promotion")
	t.Logf("%d keys, %d failovers, %d requests (%d attempts), lost %d, doubled %d; processor: %d charges",
		keys, rounds, q.sent.Load(), ans.attempts.Load(), lost, doubled, charges)
	for p, name := range phaseNames {
		t.Logf("answers %s: %s", name, ans.summary(p))
	}
}

// failoverKnobs reads TestServeSurvivesFailover's failovers from
// IDEMKV_FAILOVER_ROUNDS (default 1), its keys from IDEMKV_FAILOVER_KEYS
// (default 200 a failover) and its seed from IDEMKV_KILL_SEED (default:
// the clock), and logs the seed.
func failoverKnobs(t *testing.T) (keys, rounds int, seed uint64) {
	rounds = 1
	if s := os.Getenv(failoverRoundsEnv); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err)
		require.GreaterOrEqual(t, n, 1, failoverRoundsEnv)
		rounds = n
	}
	keys = 200 * rounds
	if s := os.Getenv(failoverKeysEnv); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err)
		require.GreaterOrEqual(t, n, 10*rounds, failoverKeysEnv)
		keys = n
	}
	seed = uint64(time.Now().UnixNano())
	if s := os.Getenv(killSeedEnv); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err)
		seed = n
	}
	t.Logf("seed %d (rerun with %s=%d)", seed, killSeedEnv, seed)
	return keys, rounds, seed
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
	phaseOutage        // from a primary's crash to its standby's promotion
	phaseAfter         // the standby is the primary (until the next crash)
)

var phaseNames = [...]string{"before the first kill", "during an outage", "after a promotion"}

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

// count is how many attempts were answered answer in phase so far.
func (a *answerLog) count(phase int, answer string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.mu.counts[phase][answer]
}

// waitFor waits until more than seen attempts have been answered answer
// in phase.
func (a *answerLog) waitFor(t *testing.T, ctx context.Context, phase int, answer string, seen int) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for a.count(phase, answer) <= seen {
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
