package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestHTTPRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for a second")
	}
	cfg := HTTPConfig{Rate: 300, Clients: 4, Slice: 200 * time.Millisecond, Slices: 2, Tenants: 10, Dir: t.TempDir()}
	rep, err := RunHTTP(context.Background(), cfg)
	require.NoError(t, err)
	require.Len(t, rep.Targets, 2)
	require.Equal(t, "bare", rep.Targets[0].Name)
	require.Equal(t, "middleware", rep.Targets[1].Name)
	for _, tg := range rep.Targets {
		require.Positive(t, tg.Requests, tg.Name)
		require.Positive(t, tg.Latency.P99, tg.Name)
		require.Len(t, tg.SliceP99US, cfg.Slices, tg.Name)
		for _, p99 := range tg.SliceP99US {
			require.Positive(t, p99, tg.Name)
			require.LessOrEqual(t, p99, tg.Latency.Max, tg.Name)
		}
	}
	require.Equal(t, rep.Targets[1].Latency.P99-rep.Targets[0].Latency.P99, rep.Overhead.P99)
	// Every protected request commits through the engine's committer; the
	// bare handler does not use it.
	require.Zero(t, rep.Targets[0].Commits)
	mw := rep.Targets[1]
	require.Positive(t, mw.Commits)
	require.GreaterOrEqual(t, mw.WritesPerCommit, 1.0)
	require.Positive(t, mw.CommitBusy)
	require.Positive(t, mw.CommitSyncWaitShare)

	var out bytes.Buffer
	require.NoError(t, rep.WriteTable(&out))
	require.Contains(t, out.String(), "overhead")
	require.Contains(t, out.String(), "p99 of each slice")
	require.Contains(t, out.String(), "middleware: commit path busy")
	out.Reset()
	require.NoError(t, rep.WriteJSON(&out))
	var back HTTPReport
	require.NoError(t, json.Unmarshal(out.Bytes(), &back))
	require.Equal(t, rep.Targets[1].Requests, back.Targets[1].Requests)
	require.Equal(t, rep.Targets[1].SliceP99US, back.Targets[1].SliceP99US)

	require.Error(t, HTTPConfig{Rate: -1}.Validate())
	_, err = HTTPProfile("slow")
	require.Error(t, err)
}
