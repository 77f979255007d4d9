package retention

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv/bench"
	"github.com/idemkv/idemkv/internal/tier"
)

// TestRun runs a tiny retention measurement end to end: both runs, the
// cost measurement, the extrapolation and the outputs.
func TestRun(t *testing.T) {
	tier.Require(t, "runs for seconds")
	o := &Options{Options: bench.Options{Tenants: 10, Dir: t.TempDir()}, Retention: time.Second, Periods: 3,
		Rate: 400, Clients: 4, SampleEvery: 250 * time.Millisecond, CostKeys: 2000}
	rep, err := Run(context.Background(), o)
	require.NoError(t, err)
	require.Len(t, rep.Runs, 2)
	sw, none := rep.Runs[0], rep.Runs[1]
	require.Equal(t, "sweeper", sw.Name)
	require.Positive(t, sw.Requests)
	require.Positive(t, sw.Swept, "records expired during the run must be swept")
	require.Zero(t, none.Swept)
	require.NotEmpty(t, sw.Samples)
	require.Positive(t, sw.TableBytesPerLiveKey)
	require.Equal(t, 2000, rep.Cost.Keys)
	require.Positive(t, rep.Cost.DeletedPerSec)
	require.Positive(t, rep.Cost.CPUPerMillionDeleted)
	require.Less(t, rep.Cost.TableBytesAfter, rep.Cost.TableBytesBefore/10, "space comes back")
	require.InDelta(t, 432e6, rep.Guide.KeysPerDay, 1)
	require.Positive(t, rep.Guide.SweeperCores)

	var out bytes.Buffer
	require.NoError(t, rep.WriteTable(&out))
	require.Contains(t, out.String(), "no-sweeper")
	out.Reset()
	require.NoError(t, rep.WriteJSON(&out))
	var back Report
	require.NoError(t, json.Unmarshal(out.Bytes(), &back))
	require.Equal(t, rep.Runs[0].Requests, back.Runs[0].Requests)
	f, err := rep.Plot(t.TempDir())
	require.NoError(t, err)
	require.FileExists(t, f)
}

func TestOptions(t *testing.T) {
	for _, name := range bench.Profiles() {
		o, err := Profile(name)
		require.NoError(t, err)
		require.NoError(t, o.Validate())
		d := o.EnsureDefaults()
		require.NoError(t, d.Validate())
		require.Equal(t, uint64(2<<20), d.Engine.MemTableSize, "the profile's memtable")
		require.LessOrEqual(t, d.Engine.Lease, d.Retention/2, "a lease fits the window")
	}
	require.Error(t, (&Options{Periods: 1}).Validate())
	require.Error(t, (&Options{Retention: time.Millisecond}).Validate())
	_, err := Profile("slow")
	require.Error(t, err)
}

// TestCostStorePassesCheck: the store the cost measurement seeds is sound
// and holds every record, in the layout the engine writes.
func TestCostStorePassesCheck(t *testing.T) {
	ctx := context.Background()
	o := (&Options{Options: bench.Options{Tenants: 10}, CostKeys: 500}).EnsureDefaults()
	e, clock, err := costStore(ctx, o, t.TempDir())
	require.NoError(t, err)
	defer e.Close()
	rep, err := e.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%v", rep.Problems)
	require.Equal(t, 500, rep.Completed)
	require.Zero(t, rep.Expired)
	clock.Advance(2 * time.Hour)
	rep, err = e.Check(ctx)
	require.NoError(t, err)
	require.Equal(t, 500, rep.Expired, "every record expires within the hour")
}
