package bench

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
)

func TestRequests(t *testing.T) {
	uuid := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	seen := map[idemkv.ID]bool{}
	for s := range uint64(3) {
		for i := range uint64(1000) {
			id := Key(s<<20, i, 1000)
			require.NoError(t, id.Validate())
			require.Regexp(t, uuid, id.Key)
			require.True(t, strings.HasPrefix(id.Tenant, "acct_"))
			require.False(t, seen[id], "duplicate key")
			seen[id] = true
			require.Equal(t, id, Key(s<<20, i, 1000), "keys are derived, not drawn")
			require.Len(t, Fingerprint(s, i, false), 9)
			require.NotEqual(t, Fingerprint(s, i, false), Fingerprint(s, i, true))
			require.Len(t, Result(s, i, nil).Pointer, pointerLen)
		}
	}
}

// TestSeed: a seeded store holds exactly the records asked for, in the
// layout the engine writes, and they replay through the engine.
func TestSeed(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	opts := &engine.Options{CacheSize: 4 << 20, MemTableSize: 4 << 20}
	require.NoError(t, Seed(ctx, dir, opts, 7, 100, 10, nil))
	e, err := engine.Open(dir, opts)
	require.NoError(t, err)
	defer e.Close()
	rep, err := e.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%v", rep.Problems)
	require.Equal(t, 100, rep.Completed)
	for i := range uint64(100) {
		c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: Key(7, i, 10), Fingerprint: Fingerprint(7, i, false)})
		require.NoError(t, err)
		require.Equal(t, idemkv.Replay, c.Outcome)
		require.Equal(t, Result(7, i, nil), c.Record.Result)
	}
}

func TestOptions(t *testing.T) {
	d := (*Options)(nil).EnsureDefaults()
	require.Equal(t, "custom", d.Profile)
	require.Equal(t, 1000, d.Tenants)
	require.Nil(t, d.Engine, "the engine's own defaults")
	require.NoError(t, d.Validate())

	o := &Options{Engine: &engine.Options{MemTableSize: 1 << 20}, CompactionNice: 19}
	d = o.EnsureDefaults()
	require.NotNil(t, d.Engine.ConfigurePebble, "compactions lowered")
	require.Nil(t, o.Engine.ConfigurePebble, "the caller's options are not changed")
	require.Equal(t, uint64(1<<20), d.Engine.MemTableSize)
	require.Error(t, (&Options{CompactionNice: 20}).Validate())

	_, err := Profile("slow", map[string]Options{"quick": {}})
	require.Error(t, err)
	p, err := Profile("quick", map[string]Options{"quick": {Tenants: 3}})
	require.NoError(t, err)
	require.Equal(t, 3, p.Tenants)
}
