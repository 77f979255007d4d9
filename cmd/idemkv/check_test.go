package main

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
)

func TestCheckCommand(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	e, err := engine.Open(dir, &engine.Options{NoBackgroundSweep: true})
	require.NoError(t, err)
	c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: idemkv.ID{Tenant: "t", Endpoint: "POST /x", Key: "k"}, Fingerprint: []byte{1}})
	require.NoError(t, err)
	require.NoError(t, e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, nil))
	require.NoError(t, e.Close())

	var out, errOut bytes.Buffer
	require.Equal(t, exitOK, run(ctx, []string{"check", "--data", dir}, &out, &errOut), errOut.String())
	require.Contains(t, out.String(), "ok: every invariant holds")
	require.Contains(t, out.String(), "1 completed")

	// A stray key in an unknown namespace is a broken invariant.
	db, err := pebble.Open(dir, (&engine.Options{}).EnsureDefaults().PebbleOptions())
	require.NoError(t, err)
	require.NoError(t, db.Set([]byte{0x09, 'x'}, []byte("?"), pebble.Sync))
	require.NoError(t, db.Close())
	out.Reset()
	errOut.Reset()
	require.Equal(t, exitFail, run(ctx, []string{"check", "--data", dir, "--json"}, &out, &errOut))
	var rep engine.CheckReport
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep))
	require.Equal(t, 1, rep.ProblemCount)
	require.Contains(t, errOut.String(), "1 broken invariants")

	require.Equal(t, 1, rep.Passes)

	require.Equal(t, exitUsage, run(ctx, []string{"check"}, &out, &errOut))
	require.Equal(t, exitUsage, run(ctx, []string{"check", "--data", dir, "--memory-mib", "0"}, &out, &errOut))
	require.Equal(t, exitFail, run(ctx, []string{"check", "--data", dir + "/nope"}, &out, &errOut))
}
