package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/idemkv/idemkv/internal/logtest"
	"github.com/idemkv/idemkv/pgstore/pgtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// startServe runs serve with cfg on a loopback port until the test ends.
func startServeOn(t *testing.T, cfg serveConfig) (url string, stop func() error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var out logtest.Log
	done := make(chan error, 1)
	go func() { done <- serve(ctx, ln, cfg, &out) }()
	var once sync.Once
	var serr error
	stop = func() error {
		once.Do(func() {
			cancel()
			serr = <-done
		})
		return serr
	}
	t.Cleanup(func() { _ = stop() })
	return "http://" + ln.Addr().String(), stop
}

func payOnce(t *testing.T, url, key string) (int, string, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url+"/v1/payments", strings.NewReader(`{"amount":5000,"currency":"USD","card":"tok_123"}`))
	req.Header.Set("Authorization", "Bearer acct_1")
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), string(b)
}

// TestServeSharesAPostgreSQLStore runs two serve processes' servers on
// one PostgreSQL database: a payment made through one replays,
// byte-identical, through the other; concurrent duplicates of a key sent
// to both make one payment; and a restarted server still replays.
func TestServeSharesAPostgreSQLStore(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	a, _ := startServeOn(t, serveConfig{dir: t.TempDir(), store: dsn})
	b, stopB := startServeOn(t, serveConfig{dir: t.TempDir(), store: dsn})

	status, replayed, first := payOnce(t, a, "order-1")
	require.Equal(t, http.StatusCreated, status, first)
	assert.Empty(t, replayed)
	status, replayed, again := payOnce(t, b, "order-1")
	assert.Equal(t, http.StatusCreated, status)
	assert.Equal(t, "true", replayed, "the other server replays the stored outcome")
	assert.Equal(t, first, again)

	const dups = 16
	var wg sync.WaitGroup
	fresh := make(chan string, dups)
	for i := range dups {
		url := a
		if i%2 == 1 {
			url = b
		}
		wg.Go(func() {
			status, replayed, body := payOnce(t, url, "order-2")
			if status == http.StatusCreated && replayed == "" {
				fresh <- body
			}
			assert.Contains(t, []int{http.StatusCreated, http.StatusConflict}, status, body)
		})
	}
	wg.Wait()
	close(fresh)
	assert.Len(t, fresh, 1, "exactly one of the duplicates ran the payment")

	require.NoError(t, stopB())
	b, _ = startServeOn(t, serveConfig{dir: t.TempDir(), store: dsn})
	_, replayed, again = payOnce(t, b, "order-1")
	assert.Equal(t, "true", replayed)
	assert.Equal(t, first, again, "a restarted server replays byte for byte")

	req, _ := http.NewRequest("GET", b+"/v1/payments?limit=100", nil)
	req.Header.Set("Authorization", "Bearer acct_1")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	var list struct {
		Data []json.RawMessage `json:"data"`
	}
	require.NoError(t, json.Unmarshal(body, &list))
	assert.Len(t, list.Data, 2, "two payments for two keys: %s", body)

	mresp, err := http.Get(b + "/metrics")
	require.NoError(t, err)
	metrics, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	for _, line := range []string{"idemkv_pgstore_uncertain_records 0", "idemkv_pgstore_escalated_records 0",
		"idemkv_pgstore_oldest_unsettled_seconds 0", "idemkv_pgstore_claims_total 1"} {
		assert.Contains(t, string(metrics), line+"\n")
	}
}

func TestServeRejectsABadStoreURL(t *testing.T) {
	for _, url := range []string{"mysql://x", "postgres://a b@"} {
		var out, errOut bytes.Buffer
		code := run(context.Background(), []string{"serve", "--store", url}, &out, &errOut)
		assert.Equal(t, exitUsage, code, "%s: %s", url, fmt.Sprint(errOut.String()))
	}
}

// storeCase is a store a serve test runs on.
type storeCase struct {
	name string
	// config returns a serveConfig with the store set.
	config func(t *testing.T) serveConfig
	// check runs idemkv check on the store of cfg.
	check func(t *testing.T, cfg serveConfig)
}

// storeCases are the engine, in a temporary directory, and PostgreSQL, a
// database of the shared test server.
var storeCases = []storeCase{
	{"engine", func(t *testing.T) serveConfig { return serveConfig{dir: t.TempDir()} },
		func(t *testing.T, cfg serveConfig) { requireCheckClean(t, cfg.dir, "at the end") }},
	{"postgres", func(t *testing.T) serveConfig {
		return serveConfig{dir: t.TempDir(), store: pgtest.Shared(t).CreateDatabase(t)}
	}, func(t *testing.T, cfg serveConfig) { requireStoreCheckClean(t, cfg.store, "at the end") }},
}

// TestServeAccountLimitHolds: on either store, ten concurrent payments of
// 300 against a limit of 1,000 make exactly three charges, and the
// account shows 900 spent.
func TestServeAccountLimitHolds(t *testing.T) {
	for _, sc := range storeCases {
		t.Run(sc.name, func(t *testing.T) {
			cfg := sc.config(t)
			cfg.accountLimit = 1000
			url, stop := startServeOn(t, cfg)
			var wg sync.WaitGroup
			statuses := make(chan int, 10)
			for i := range 10 {
				wg.Go(func() {
					req, _ := http.NewRequest("POST", url+"/v1/payments", strings.NewReader(`{"amount":300,"currency":"USD","card":"tok_1"}`))
					req.Header.Set("Authorization", "Bearer acct_lim")
					req.Header.Set("Idempotency-Key", fmt.Sprint("lim-", i))
					resp, err := http.DefaultClient.Do(req)
					if !assert.NoError(t, err) {
						return
					}
					resp.Body.Close()
					statuses <- resp.StatusCode
				})
			}
			wg.Wait()
			close(statuses)
			counts := map[int]int{}
			for s := range statuses {
				counts[s]++
			}
			assert.Equal(t, map[int]int{http.StatusCreated: 3, http.StatusPaymentRequired: 7}, counts)
			req, _ := http.NewRequest("GET", url+"/v1/account", nil)
			req.Header.Set("Authorization", "Bearer acct_lim")
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.Contains(t, string(body), `"spent":900`)
			require.NoError(t, stop())
			sc.check(t, cfg)
		})
	}
}
