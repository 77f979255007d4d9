package fleet

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv/pgstore/pgtest"
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
	for _, name := range []string{postgres, naiveSide, engineSide, naiveTwo} {
		require.Positive(t, p.Sides[name].Requests, name)
		require.Positive(t, rep.BytesPerKey[name], name)
	}
	for _, name := range []string{postgresTwo, postgresBare, postgresBareTwo} {
		require.Positive(t, p.Sides[name].Requests, name)
	}
	require.Positive(t, rep.BytesPerKey[recordOnly(postgres)])
	require.Positive(t, p.Ratio)
	require.Positive(t, p.RatioBare)
	require.Positive(t, p.RatioBareTwo)
	var b strings.Builder
	require.NoError(t, rep.Print(&b))
	require.Contains(t, b.String(), "bytes per completed key")
	require.Contains(t, b.String(), "without an effect")
}
