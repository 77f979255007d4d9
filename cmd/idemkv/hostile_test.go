package main

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestFloodsLeaveTheServiceAnswering runs "idemkv serve" at a limit of 200
// file descriptors, floods it with idle keep-alive clients and then with
// clients sending 900 KB of headers, and checks that the floods hold no
// more descriptors than the connection cap leaves them, that memory stays
// bounded, and that payments and /healthz answer throughout.
func TestFloodsLeaveTheServiceAnswering(t *testing.T) {
	if _, err := os.Stat("/proc/self/fd"); err != nil {
		t.Skip("needs /proc")
	}
	const limit = 200
	srv := startServeEnv(t, t.TempDir(), []string{fmt.Sprintf("IDEMKV_TEST_NOFILE=%d", limit)})
	defer func() {
		require.NoError(t, srv.cmd.Process.Signal(syscall.SIGTERM))
		require.NoError(t, srv.cmd.Wait(), "graceful shutdown")
	}()
	m := regexp.MustCompile(`at most (\d+) connections`).FindStringSubmatch(srv.banner)
	require.NotNil(t, m, srv.banner)
	maxConns, _ := strconv.Atoi(m[1])
	require.Less(t, maxConns, limit/2, "the store keeps half the descriptors")
	addr := strings.TrimPrefix(srv.url, "http://")
	pid := srv.cmd.Process.Pid
	client := &http.Client{Timeout: 30 * time.Second}
	// pay retries after a transport error, with backoff, as a client with
	// an idempotency key should: a keep-alive connection closed at the
	// cap fails the request sent on it, and for half a second after
	// answering 431 Go's server keeps the connection (to avoid a reset),
	// so right after a header flood the cap may be full of them.
	pay := func(key string) {
		t.Helper()
		var err error
		for attempt := range 8 {
			time.Sleep(time.Duration(attempt*attempt) * 50 * time.Millisecond) // client backoff, 0 to 2.5 s
			var req *http.Request
			req, err = http.NewRequest("POST", srv.url+"/v1/payments", strings.NewReader(`{"amount":5000,"currency":"USD","card":"tok_123"}`))
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer acct_1")
			req.Header.Set("Idempotency-Key", key)
			var resp *http.Response
			if resp, err = client.Do(req); err == nil {
				resp.Body.Close()
				require.Equal(t, http.StatusCreated, resp.StatusCode, key)
				return
			}
		}
		require.NoError(t, err, key)
	}
	healthy := func() {
		t.Helper()
		resp, err := client.Get(srv.url + "/healthz")
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	pay("before")
	fdsBefore, rssBefore := openFiles(t, pid), residentBytes(t, pid)

	// 180 clients send one request each and keep their connections (until
	// the server closes them at the cap).
	for range 180 {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		defer c.Close()
		require.NoError(t, c.SetDeadline(time.Now().Add(time.Minute))) // a guard against a hang
		_, err = fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		require.NoError(t, err)
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
			resp.Body.Close()
		} // else closed at the cap before an answer: the limiter's call
	}
	require.LessOrEqual(t, openFiles(t, pid), fdsBefore+maxConns, "the idle clients hold more descriptors than the cap")
	for i := range 50 {
		pay(fmt.Sprintf("during-idle-%d", i))
	}
	healthy()

	// 200 clients, 8 at a time, each sending 900 KB of headers.
	big := strings.Repeat("x", 900<<10)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	statuses := make(chan int, 200)
	for range 200 {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				statuses <- 0
				return
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(time.Minute))
			_, _ = fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: %s\r\n\r\n", big)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				statuses <- 0 // reset before an answer could be read
				return
			}
			resp.Body.Close()
			statuses <- resp.StatusCode
		}()
	}
	wg.Wait()
	close(statuses)
	for s := range statuses {
		require.Contains(t, []int{0, http.StatusRequestHeaderFieldsTooLarge}, s, "a 900 KB header was accepted")
	}
	pay("after")
	healthy()
	grown := residentBytes(t, pid) - rssBefore
	t.Logf("descriptors %d before the floods, cap %d; resident memory grew %d KiB", fdsBefore, maxConns, grown>>10)
	if !raceEnabled { // the race detector's shadow memory grows with every buffer
		require.Less(t, grown, int64(64<<20), "the header flood grew resident memory by %d MiB", grown>>20)
	}
}

func openFiles(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	require.NoError(t, err)
	return len(ents)
}

// residentBytes is the process's resident set (VmRSS).
func residentBytes(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}
