package main

import (
	"context"
	"strings"
	"testing"

	"github.com/idemkv/idemkv/pgstore/pgtest"
	"github.com/stretchr/testify/require"
)

// TestBenchPostgres runs "idemkv bench postgres" briefly against the test
// server's database and reads its table.
func TestBenchPostgres(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	var out, errOut strings.Builder
	code := run(context.Background(), []string{"bench", "postgres", "--url", dsn, "--concurrency", "2",
		"--duration", "100ms", "--warmup", "50ms", "--rounds", "1", "--data", t.TempDir()}, &out, &errOut)
	require.Equal(t, exitOK, code, "%s%s", out.String(), errOut.String())
	require.Contains(t, out.String(), "bytes per completed key at rest")
}
