package admin

import (
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv/internal/fakeclock"
)

// TestThrottleIsBounded: past maxThrottled addresses, new ones share one
// budget, so a client holding many addresses gets no more wrong tokens
// than one; budgets that have filled up again make room.
func TestThrottleIsBounded(t *testing.T) {
	clock := fakeclock.New(time.Date(2031, 5, 6, 10, 0, 0, 0, time.UTC))
	g := newThrottle(clock.Now)
	from := func(i int) string { return fmt.Sprintf("10.%d.%d.%d:1", i>>16&255, i>>8&255, i&255) }
	fail := func(i int) {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = from(i)
		g.failed(r)
	}
	wait := func(i int) time.Duration {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = from(i)
		return g.wait(r)
	}
	for i := range maxThrottled {
		fail(i)
	}
	require.Len(t, g.by, maxThrottled)
	for i := range failedBurst {
		require.Zero(t, wait(maxThrottled+i))
		fail(maxThrottled + i) // each a new address
	}
	require.Len(t, g.by, maxThrottled+1, "the new addresses share one budget")
	require.Positive(t, wait(maxThrottled+failedBurst), "which they have spent")
	require.Zero(t, wait(0), "a tracked address keeps its own")

	clock.Advance(failedEvery) // every tracked budget full again
	require.Zero(t, wait(maxThrottled+failedBurst+1))
	fail(maxThrottled + failedBurst + 1)
	require.Len(t, g.by, 2, "full budgets forgotten: the shared one and the new address's")
}
