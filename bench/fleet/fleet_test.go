package fleet

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv/internal/pgtest"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestRun runs the harness briefly: every store completes requests, the
// ratio is computed from both PostgreSQL sides, and every store's bytes
// per key are measured.
func TestRun(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	rep, err := Run(context.Background(), &Options{DSN: dsn, EngineDir: t.TempDir(), Concurrency: []int{4},
		Duration: 200 * time.Millisecond, Rounds: 2, Warmup: 50 * time.Millisecond})
	require.NoError(t, err)
	require.Len(t, rep.Points, 1)
	p := rep.Points[0]
	for _, name := range []string{Postgres, Naive, Engine} {
		require.Positive(t, p.Sides[name].Requests, name)
		require.Positive(t, rep.BytesPerKey[name], name)
	}
	require.Positive(t, p.Ratio)
	var b strings.Builder
	require.NoError(t, rep.Print(&b))
	require.Contains(t, b.String(), "bytes per completed key")
}
