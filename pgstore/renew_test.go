package pgstore_test

import (
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/pgstore"
	"github.com/stretchr/testify/require"
)

// TestRenewSeenByAnotherProcess: Renew is a committed UPDATE of the
// record's lease, so another process sharing the database sees the
// renewed lease at once: its Get reports it, a retry through it waits for
// it, and its reconciler does not list the record as abandoned.
func TestRenewSeenByAnotherProcess(t *testing.T) {
	clock := fakeclock.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	a, dsn := reviewStore(t, func(o *pgstore.Options) { o.Clock = clock })
	b := reviewOpenOn(t, dsn, func(o *pgstore.Options) { o.Clock = clock })
	req := idemkv.ClaimRequest{ID: reviewID("slow"), Fingerprint: []byte{1}, Mode: idemkv.ModeRemote, Lease: 10 * time.Second}
	c, err := a.Claim(ctx, req)
	require.NoError(t, err)
	clock.Advance(8 * time.Second)
	l, err := a.Renew(ctx, c.Lease, time.Minute)
	require.NoError(t, err)
	require.True(t, l.Expires.Equal(clock.Now().Add(time.Minute)))

	rec, err := b.Get(ctx, req.ID)
	require.NoError(t, err)
	require.True(t, rec.LeaseExpires.Equal(l.Expires), "the other process reads lease %v, renewed to %v", rec.LeaseExpires, l.Expires)
	clock.Advance(10 * time.Second) // past the lease it was claimed with
	c, err = b.Claim(ctx, req)
	require.NoError(t, err)
	require.Equal(t, idemkv.InProgress, c.Outcome)
	require.Equal(t, l.Expires.Sub(clock.Now()), c.RetryAfter)
	page, err := b.List(ctx, idemkv.ListRequest{})
	require.NoError(t, err)
	require.Empty(t, page.Records)
	require.NoError(t, a.Complete(ctx, l, idemkv.Result{Status: 201}, nil))
}
