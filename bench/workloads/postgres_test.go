package workloads

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv/pgstore/pgtest"
	"github.com/stretchr/testify/require"
)

// TestPostgresTarget: the harness runs a write and a read-only workload on
// the PostgreSQL store beside the engine and the baseline, verifies what
// it was acknowledged, sizes its records, and leaves out the counters
// that cannot see the server's work.
func TestPostgresTarget(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the full run has it (a PostgreSQL harness, not racy Go code)")
	}
	srv := pgtest.Start(t)
	for _, wl := range []string{unique, replay} {
		t.Run(wl, func(t *testing.T) {
			cfg := tinyOptions(t, wl)
			cfg.Duration = 50 * time.Millisecond
			cfg.SizingKeys = 200
			cfg.MoreTargets = []Target{PostgresTarget(func(_ context.Context, name string) (string, error) {
				return srv.CreateDatabaseNamed(wl + "_" + name)
			}, nil)}
			rep, err := Run(context.Background(), cfg)
			require.NoError(t, err)
			require.Len(t, rep.Points, 6, "2 concurrencies x 3 targets")
			for _, p := range rep.Points {
				if p.Target != "pgstore" {
					require.False(t, p.External)
					continue
				}
				require.True(t, p.External)
				require.Positive(t, p.Requests)
				require.Positive(t, p.VerifiedKeys)
				require.Positive(t, p.DiskBytesPerKey)
				require.Zero(t, p.CPUSecondsPerRequest)
			}
			require.Len(t, rep.Sizing.Targets, 3)
			require.Positive(t, rep.Sizing.Targets[2].BytesPerKey)
			var b strings.Builder
			require.NoError(t, rep.WriteTable(&b))
			require.Regexp(t, `pgstore +[0-9,]+ .* - +- +- +[0-9.]+ +- `, b.String())
		})
	}
}
