package reconcile

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/stretchr/testify/require"
)

// TestBackoffOfSettledRecordsIsForgotten: a worker keeps in memory the
// backoff of each record that got Unknown. Records an operator settled
// meanwhile are forgotten once the passes have read the whole listing,
// even when no single pass reads all of it (PerPass below its length).
func TestBackoffOfSettledRecordsIsForgotten(t *testing.T) {
	ctx := context.Background()
	clock := fakeclock.New(time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC))
	e, err := engine.Open(t.TempDir(), &engine.Options{Clock: clock, NoBackgroundSweep: true})
	require.NoError(t, err)
	defer e.Close()
	var ids []idemkv.ID
	for i := range 6 {
		id := idemkv.ID{Tenant: "t", Endpoint: "POST /pay", Key: fmt.Sprint("k", i)}
		c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: []byte{1}, Mode: idemkv.ModeRemote})
		require.NoError(t, err)
		require.NoError(t, e.MarkUncertain(ctx, c.Lease, "timeout"))
		ids = append(ids, id)
	}
	unknown := ReconcilerFunc(func(context.Context, idemkv.Record) (Answer, error) {
		return Answer{Verdict: Unknown, Reason: "no answer"}, nil
	})
	w, err := New(e, unknown, &Options{Clock: clock, Grace: time.Second, PerPass: 2, MaxAttempts: 100})
	require.NoError(t, err)
	tracked := func() int {
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(w.backoff)
	}
	clock.Advance(time.Second)
	for range 3 {
		require.NoError(t, w.Pass(ctx))
	}
	require.Equal(t, 6, tracked(), "every record got Unknown")

	for _, id := range ids[:3] {
		rec, err := e.Get(ctx, id)
		require.NoError(t, err)
		require.NoError(t, e.Resolve(ctx, idemkv.ResolveRequest{ID: id, Token: rec.Token, NoEffect: true, Note: "operator"}))
	}
	for range 2 { // the three left take two passes of two
		require.NoError(t, w.Pass(ctx))
	}
	require.Equal(t, 3, tracked(), "the settled records' backoff is forgotten")
}
