package engineprom_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/engine/engineprom"
)

// stableNames are the families dashboards and alerts read: a rename, a
// removal or an addition must be a decision, so the set is spelled out.
var stableNames = []string{
	"idemkv_engine_background_errors_total",
	"idemkv_engine_claim_filter_failures_total",
	"idemkv_engine_claim_filter_keys",
	"idemkv_engine_claim_filter_misses_total",
	"idemkv_engine_claim_filter_skips_total",
	"idemkv_engine_claims_total",
	"idemkv_engine_clock_offset_seconds",
	"idemkv_engine_clock_steps_total",
	"idemkv_engine_commit_seconds_total",
	"idemkv_engine_commit_sync_wait_seconds_total",
	"idemkv_engine_commit_writes_total",
	"idemkv_engine_commits_total",
	"idemkv_engine_compaction_debt_bytes",
	"idemkv_engine_disk_bytes",
	"idemkv_engine_disk_refusals_total",
	"idemkv_engine_escalated_records",
	"idemkv_engine_escalations_total",
	"idemkv_engine_fenced_total",
	"idemkv_engine_held_leases",
	"idemkv_engine_held_past_expiry",
	"idemkv_engine_l0_files",
	"idemkv_engine_oldest_unsettled_seconds",
	"idemkv_engine_read_amp",
	"idemkv_engine_sweep_failing",
	"idemkv_engine_sweep_failures_total",
	"idemkv_engine_swept_total",
	"idemkv_engine_takeovers_total",
	"idemkv_engine_uncertain_records",
	"idemkv_engine_unhealthy",
	"idemkv_engine_write_stall_seconds_total",
	"idemkv_engine_write_stalls_total",
}

func open(t *testing.T) *engine.Engine {
	t.Helper()
	e, err := engine.Open(t.TempDir(), &engine.Options{NoBackgroundSweep: true})
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	return e
}

// gather returns every sample of reg by family name, and the family's type.
func gather(t *testing.T, reg prometheus.Gatherer) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := make(map[string]*dto.MetricFamily, len(mfs))
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

// value is the single sample of family name, counter or gauge.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string) float64 {
	t.Helper()
	mf, ok := fams[name]
	require.True(t, ok, "family %s not exported", name)
	require.Len(t, mf.Metric, 1, name)
	m := mf.Metric[0]
	if mf.GetType() == dto.MetricType_COUNTER {
		return m.GetCounter().GetValue()
	}
	return m.GetGauge().GetValue()
}

func TestRegisterExportsTheEngine(t *testing.T) {
	e := open(t)
	reg := prometheus.NewRegistry()
	require.NoError(t, engineprom.Register(reg, e))

	before := gather(t, reg)
	names := make([]string, 0, len(before))
	for name := range before {
		names = append(names, name)
	}
	slices.Sort(names)
	require.Equal(t, stableNames, names, "the exported families")
	for _, name := range names {
		want := dto.MetricType_GAUGE
		if strings.HasSuffix(name, "_total") {
			want = dto.MetricType_COUNTER
		}
		require.Equal(t, want, before[name].GetType(), name)
	}
	require.Zero(t, value(t, before, "idemkv_engine_claims_total"))

	// A claim holds a lease; its completion, a synced write, releases it.
	ctx := context.Background()
	c, err := e.Claim(ctx, idemkv.ClaimRequest{
		ID:          idemkv.ID{Tenant: "acct_1", Endpoint: "POST /v1/orders", Key: "k1"},
		Fingerprint: []byte("fp"),
	})
	require.NoError(t, err)
	require.Equal(t, idemkv.Acquired, c.Outcome)
	held := gather(t, reg)
	require.Equal(t, 1.0, value(t, held, "idemkv_engine_claims_total"))
	require.Equal(t, 1.0, value(t, held, "idemkv_engine_held_leases"))

	require.NoError(t, e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, nil))
	after := gather(t, reg)
	require.Equal(t, 1.0, value(t, after, "idemkv_engine_claims_total"))
	require.Zero(t, value(t, after, "idemkv_engine_held_leases"))
	require.Greater(t, value(t, after, "idemkv_engine_commits_total"), value(t, held, "idemkv_engine_commits_total"))
	require.Greater(t, value(t, after, "idemkv_engine_commit_writes_total"), value(t, held, "idemkv_engine_commit_writes_total"))
	require.Greater(t, value(t, after, "idemkv_engine_commit_seconds_total"), 0.0)
	require.Greater(t, value(t, after, "idemkv_engine_disk_bytes"), 0.0)
}

func TestRegisterTwiceFails(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := open(t)
	require.NoError(t, engineprom.Register(reg, e))
	for _, again := range []*engine.Engine{e, open(t)} {
		err := engineprom.Register(reg, again)
		var are prometheus.AlreadyRegisteredError
		require.True(t, errors.As(err, &are), "a second Register on one registry: %v", err)
	}
}

// TestTwoEnginesWithLabels: two engines share a registry once each is
// registered through a registerer that labels its samples.
func TestTwoEnginesWithLabels(t *testing.T) {
	reg := prometheus.NewRegistry()
	for _, store := range []string{"a", "b"} {
		wrapped := prometheus.WrapRegistererWith(prometheus.Labels{"store": store}, reg)
		require.NoError(t, engineprom.Register(wrapped, open(t)))
	}
	fams := gather(t, reg)
	require.Len(t, fams["idemkv_engine_claims_total"].Metric, 2)
}

func TestNothingOnTheDefaultRegistry(t *testing.T) {
	e := open(t)
	require.ErrorIs(t, engineprom.Register(nil, e), engineprom.ErrNoRegistry)
	require.NoError(t, engineprom.Register(prometheus.NewRegistry(), e))
	for name := range gather(t, prometheus.DefaultGatherer) {
		require.False(t, strings.HasPrefix(name, "idemkv_"), "%s on the default registry", name)
	}
}

func TestClosedEngineExportsNothing(t *testing.T) {
	e := open(t)
	reg := prometheus.NewRegistry()
	require.NoError(t, engineprom.Register(reg, e))
	require.NoError(t, e.Close())
	require.Empty(t, gather(t, reg))
}
