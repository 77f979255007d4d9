package admin

import (
	"crypto/sha256"
	"fmt"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv/internal/fakeclock"
)

// guess sends the wrong token tok from address i of 10.0.0.0/8 to g.
func guess(g *throttle, i int, tok string) (right bool, wait time.Duration) {
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = fmt.Sprintf("10.%d.%d.%d:1", i>>16&255, i>>8&255, i&255)
	return g.admit(r, sha256.Sum256([]byte(tok)), func([sha256.Size]byte) bool { return false })
}

// TestThrottleIsBounded: past maxThrottled addresses, new ones share one
// budget, so a client holding many addresses gets no more wrong tokens
// than one; budgets that have filled up again make room.
func TestThrottleIsBounded(t *testing.T) {
	clock := fakeclock.New(time.Date(2031, 5, 6, 10, 0, 0, 0, time.UTC))
	g := newThrottle(clock.Now)
	for i := range maxThrottled {
		guess(g, i, "a")
	}
	require.Len(t, g.by, maxThrottled)
	for i := range failedBurst {
		_, wait := guess(g, maxThrottled+i, fmt.Sprint(i)) // each a new address
		require.Zero(t, wait)
	}
	require.Len(t, g.by, maxThrottled+1, "the new addresses share one budget")
	_, wait := guess(g, maxThrottled+failedBurst, "x")
	require.Positive(t, wait, "which they have spent")
	_, wait = guess(g, 0, "b")
	require.Zero(t, wait, "a tracked address keeps its own")

	clock.Advance(2 * failedEvery) // every tracked budget full again
	_, wait = guess(g, maxThrottled+failedBurst+1, "y")
	require.Zero(t, wait)
	require.Len(t, g.by, 2, "full budgets forgotten: the shared one and the new address's")
}

// TestThrottleHoldsUnderConcurrentGuesses: guesses sent at once from one
// address are compared no more often than its budget allows.
func TestThrottleHoldsUnderConcurrentGuesses(t *testing.T) {
	clock := fakeclock.New(time.Date(2031, 5, 6, 10, 0, 0, 0, time.UTC))
	g := newThrottle(clock.Now)
	var compared atomic.Int64
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := range 50 {
				r := httptest.NewRequest("GET", "/", nil)
				r.RemoteAddr = "192.0.2.7:1"
				g.admit(r, sha256.Sum256(fmt.Appendf(nil, "%d-%d", w, i)), func([sha256.Size]byte) bool {
					compared.Add(1)
					return false
				})
			}
		})
	}
	wg.Wait()
	require.Equal(t, int64(failedBurst), compared.Load())
}
