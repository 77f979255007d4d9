package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/internal/logtest"
)

// TestClockCommand: a store last closed on a host whose clock ran an hour
// ahead keeps its time an hour ahead of this host's clock; idemkv clock
// says so, and with --follow-wall sets the store's time to the clock, so
// that the next open follows it. A record written before keeps its time.
func TestClockCommand(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	ahead := fakeclock.New(time.Now().Add(time.Hour))
	e, err := engine.Open(dir, &engine.Options{Clock: ahead, NoBackgroundSweep: true})
	require.NoError(t, err)
	id := idemkv.ID{Tenant: "t", Endpoint: "POST /x", Key: "k"}
	c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: []byte{1}})
	require.NoError(t, err)
	require.NoError(t, e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, nil))
	require.NoError(t, e.Close())

	report := func(args ...string) clockReport {
		t.Helper()
		var out, errOut bytes.Buffer
		require.Equal(t, exitOK, run(ctx, append([]string{"clock", "--data", dir, "--json"}, args...), &out, &errOut), errOut.String())
		var rep clockReport
		require.NoError(t, json.Unmarshal(out.Bytes(), &rep), out.String())
		return rep
	}
	rep := report()
	require.InDelta(t, time.Hour.Seconds(), rep.AheadSeconds, 60)
	require.False(t, rep.FollowsWall)
	var out, errOut bytes.Buffer
	require.Equal(t, exitOK, run(ctx, []string{"clock", "--data", dir}, &out, &errOut), errOut.String())
	require.Contains(t, out.String(), "ahead of the wall clock")

	rep = report("--follow-wall")
	require.True(t, rep.FollowsWall)
	require.InDelta(t, time.Hour.Seconds(), rep.AheadSeconds, 60, "the lead before")
	rep = report()
	require.Zero(t, rep.AheadSeconds, "the store follows the clock")
	require.WithinDuration(t, time.Now(), rep.StoreTime, time.Minute)
	rep = report("--follow-wall")
	require.False(t, rep.FollowsWall, "nothing to do: the store is left alone")

	r, err := engine.Open(dir, &engine.Options{ReadOnly: true, NoBackgroundSweep: true})
	require.NoError(t, err)
	defer r.Close()
	rec, err := r.Get(ctx, id)
	require.NoError(t, err)
	require.True(t, rec.Created.After(time.Now().Add(50*time.Minute)), "the record keeps its time: %v", rec.Created)

	errOut.Reset()
	require.Equal(t, exitUsage, run(ctx, []string{"clock"}, &out, &errOut))
	require.Contains(t, errOut.String(), "--data")
	notStore := t.TempDir()
	errOut.Reset()
	require.Equal(t, exitFail, run(ctx, []string{"clock", "--data", notStore}, &out, &errOut))
	require.Contains(t, errOut.String(), "holds no store")
	left, err := os.ReadDir(notStore)
	require.NoError(t, err)
	require.Empty(t, left, "nothing is left in a directory that holds no store")
}

// TestServeWarnsOfAStoreAhead: serve on a store whose time runs an hour
// ahead of the host's clock says so at start, naming the lead.
func TestServeWarnsOfAStoreAhead(t *testing.T) {
	dir := t.TempDir()
	e, err := engine.Open(dir, &engine.Options{Clock: fakeclock.New(time.Now().Add(time.Hour)), NoBackgroundSweep: true})
	require.NoError(t, err)
	require.NoError(t, e.Close())

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var out, log logtest.Log
	cfg := serveConfig{dir: dir}
	cfg.log.out = &log
	done := make(chan error, 1)
	go func() { done <- serve(ctx, ln, cfg, &out) }()
	status, _, body := payOnce(t, "http://"+ln.Addr().String(), "k1") // serving: its start is logged
	require.Equal(t, http.StatusCreated, status, body)
	cancel()
	require.NoError(t, <-done)
	require.Contains(t, log.String(), "the store's time runs ahead of this host's clock")
	require.Regexp(t, `"lead":"(1h0m0s|59m5\ds)"`, log.String())
}
