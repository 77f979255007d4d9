package main

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/ttl"
	"github.com/stretchr/testify/require"
)

// TestSweepCommand fills a store whose clock ran two days ago, so that the
// command, on the real clock, finds its "short" records expired, its
// default ones live and its uncertain one held.
func TestSweepCommand(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	clock := fakeclock.New(time.Now().Add(-48 * time.Hour))
	e, err := engine.Open(dir, &engine.Options{Clock: clock, NoBackgroundSweep: true,
		Retention: 72 * time.Hour, RetentionClasses: ttl.Classes{"short": time.Hour}})
	require.NoError(t, err)
	for i, class := range []string{"short", "short", "short", "", ""} {
		id := idemkv.ID{Tenant: "t", Endpoint: "POST /x", Key: string(rune('a' + i))}
		c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: []byte{1}, Retention: class})
		require.NoError(t, err)
		require.NoError(t, e.Complete(ctx, c.Lease, idemkv.Result{Status: 200}, nil))
	}
	c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: idemkv.ID{Tenant: "t", Endpoint: "POST /x", Key: "u"},
		Fingerprint: []byte{1}, Mode: idemkv.ModeRemote, Retention: "short"})
	require.NoError(t, err)
	require.NoError(t, e.MarkUncertain(ctx, c.Lease, "timeout"))
	require.NoError(t, e.Close())

	var out, errOut bytes.Buffer
	code := run(ctx, []string{"sweep", "--data", dir, "--json", "--compact"}, &out, &errOut)
	require.Equal(t, exitOK, code, errOut.String())
	var r sweepReport
	require.NoError(t, json.Unmarshal(out.Bytes(), &r))
	require.Equal(t, 4, r.Examined, "the 3 records of the ended bucket and the unsettled one")
	require.Equal(t, 3, r.Deleted)
	require.Equal(t, 1, r.HeldPastExpiry)

	out.Reset()
	code = run(ctx, []string{"sweep", "--data", dir}, &out, &errOut)
	require.Equal(t, exitOK, code, errOut.String())
	require.Contains(t, out.String(), "deleted  0 expired records")

	code = run(ctx, []string{"sweep"}, &out, &errOut)
	require.Equal(t, exitUsage, code)
}
