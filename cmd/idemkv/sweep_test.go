package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/internal/upgradetest"
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

// TestOperatorCommandsNeverCreateOrMigrate: sweep, resolve and evict
// with --data open the store read-write; on a directory that holds no
// store they fail rather than make one, and on a store of an earlier
// layout they fail, pointing to migrate, rather than migrate it in place
// without a backup.
func TestOperatorCommandsNeverCreateOrMigrate(t *testing.T) {
	ctx := context.Background()
	old := upgradetest.Load(t, layout3Fixture).CopyStore(t)
	empty := t.TempDir()
	for _, args := range [][]string{
		{"sweep"},
		{"resolve", "--tenant", "t", "--endpoint", "POST /x", "--key", "k", "--no-effect", "--note", "ops"},
		{"evict", "--tenant", "t", "--endpoint", "POST /x", "--key", "k", "--reason", "ops"},
	} {
		var out, errOut bytes.Buffer
		require.Equal(t, exitFail, run(ctx, append(args, "--data", filepath.Join(empty, "nothing")), &out, &errOut), "%v", args)
		require.NoDirExists(t, filepath.Join(empty, "nothing"))
		require.Equal(t, exitFail, run(ctx, append(args, "--data", empty), &out, &errOut), "%v", args)
		entries, err := os.ReadDir(empty)
		require.NoError(t, err)
		require.Empty(t, entries, "%v left files in a directory that holds no store", args)
		errOut.Reset()
		require.Equal(t, exitFail, run(ctx, append(args, "--data", old), &out, &errOut), "%v", args)
		require.Contains(t, errOut.String(), "run idemkv migrate", "%v", args)
		l, err := engine.StoredLayout(old, nil)
		require.NoError(t, err)
		require.Equal(t, uint64(3), l, "%v left the store as it was", args)
	}
}
