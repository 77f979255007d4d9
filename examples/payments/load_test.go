package payments

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/internal/tier"
)

// loadSecondsEnv sets how long TestLoad runs (default 3 s).
const loadSecondsEnv = "IDEMKV_LOAD_SECONDS"

// TestLoad drives the payments service with 1,000 concurrent clients over
// loopback, a tenth of whose requests repeat one of their recent keys,
// and checks that nothing leaks: after the run, once the server and the
// clients' connections are closed, the goroutines are back to where they
// were and the heap has not grown beyond the caches' bounds. Every
// request must be answered 201 (a first run or a replay) or 409 (a
// duplicate still running); p50 and p99 are reported.
func TestLoad(t *testing.T) {
	tier.Require(t, "runs for seconds")
	seconds := 3
	if s := os.Getenv(loadSecondsEnv); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err)
		seconds = n
	}
	leaks := goleak.IgnoreCurrent()
	runtime.GC()
	goroutines0 := runtime.NumGoroutine()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	heap0 := ms.HeapAlloc

	// Everything the run builds is reachable only inside runLoad, so that
	// afterwards the heap holds nothing of it (the simulated processor's
	// in-memory ledger grows with every payment, by design).
	runLoad(t, seconds)

	// Every goroutine the run started must end once the server and the
	// connections are closed (goleak retries for a while before failing).
	goleak.VerifyNone(t, leaks)
	// Twice more: sync.Pool's victim caches and finalizers need a second
	// cycle to let go.
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	t.Logf("goroutines %d -> %d; heap %.1f MB -> %.1f MB", goroutines0, runtime.NumGoroutine(), float64(heap0)/1e6, float64(ms.HeapAlloc)/1e6)
	require.Less(t, ms.HeapAlloc, heap0+32<<20, "heap grew by more than 32 MB after everything was closed")
}

// runLoad is TestLoad's run: the service, its clients and their figures.
func runLoad(t *testing.T, seconds int) {
	eng, err := engine.Open(t.TempDir(), &engine.Options{NoBackgroundSweep: true, ReplayCacheSize: 4 << 20, CacheSize: 8 << 20})
	require.NoError(t, err)
	svc, err := New(Config{Store: eng})
	require.NoError(t, err)
	srv := httptest.NewServer(svc.Handler())
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1000, MaxConnsPerHost: 1000}, Timeout: 30 * time.Second}

	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		hist     = hdrhistogram.New(1, int64(time.Minute), 3)
		requests atomic.Int64
		dups     atomic.Int64
		statuses sync.Map // status -> *atomic.Int64
	)
	deadline := time.Now().Add(time.Duration(seconds) * time.Second)
	for c := range 1000 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c), 1))
			var recent []string
			for n := 0; time.Now().Before(deadline); n++ {
				key := fmt.Sprintf("c%d-%d", c, n)
				if len(recent) > 0 && rng.IntN(10) == 0 {
					key = recent[rng.IntN(len(recent))]
					dups.Add(1)
				} else if recent = append(recent, key); len(recent) > 8 {
					recent = recent[1:]
				}
				req, _ := http.NewRequest("POST", srv.URL+"/v1/payments",
					strings.NewReader(`{"amount":500,"currency":"EUR","card":"tok_load"}`))
				req.Header.Set("Authorization", fmt.Sprintf("Bearer acct_%d", c%50))
				req.Header.Set("Idempotency-Key", key)
				start := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					t.Errorf("client %d: %v", c, err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				d := time.Since(start)
				requests.Add(1)
				v, _ := statuses.LoadOrStore(resp.StatusCode, new(atomic.Int64))
				v.(*atomic.Int64).Add(1)
				if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusConflict {
					t.Errorf("client %d: status %d", c, resp.StatusCode)
					return
				}
				mu.Lock()
				hist.RecordValue(int64(d))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	srv.Close()
	client.CloseIdleConnections()
	rep, err := eng.Check(context.Background())
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "check: %v", rep.Problems)
	require.NoError(t, eng.Close())

	var byStatus []string
	statuses.Range(func(k, v any) bool {
		byStatus = append(byStatus, fmt.Sprintf("%v: %d", k, v.(*atomic.Int64).Load()))
		return true
	})
	t.Logf("1000 clients, %d s: %d requests (%d repeats of a recent key), %s; p50 %v, p99 %v, max %v",
		seconds, requests.Load(), dups.Load(), strings.Join(byStatus, ", "),
		time.Duration(hist.ValueAtQuantile(50)), time.Duration(hist.ValueAtQuantile(99)), time.Duration(hist.Max()))
	require.Positive(t, requests.Load())
}
