package engine

import (
	"fmt"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/tier"
	"github.com/idemkv/idemkv/storetest"
	"github.com/stretchr/testify/require"
)

func TestReplayCacheServesReplays(t *testing.T) {
	v := newEnv(t)
	c := v.claim(id("k"), fpA, idemkv.ModeLocal)
	res := idemkv.Result{Status: 201, Body: []byte("body")}
	require.NoError(t, v.e.Complete(ctx, c.Lease, res, nil))

	r := v.claim(id("k"), fpA, idemkv.ModeLocal)
	require.Equal(t, idemkv.Replay, r.Outcome)
	r.Record.Result.Body[0] = 'X' // the caller's copy, not the cache's
	r = v.claim(id("k"), fpA, idemkv.ModeLocal)
	require.Equal(t, "body", string(r.Record.Result.Body))
	st, err := v.e.Stats()
	require.NoError(t, err)
	require.EqualValues(t, 2, st.ReplayCacheHits)
	require.Equal(t, 1, st.ReplayCached)

	// After a restart the cache is empty; the first replay reads Pebble and
	// fills it.
	v.reopen()
	require.Equal(t, idemkv.Replay, v.claim(id("k"), fpA, idemkv.ModeLocal).Outcome)
	require.Equal(t, idemkv.Replay, v.claim(id("k"), fpA, idemkv.ModeLocal).Outcome)
	st, err = v.e.Stats()
	require.NoError(t, err)
	require.EqualValues(t, 1, st.ReplayCacheHits)

	// Expiry applies to cached records too.
	v.clock.Advance(24 * time.Hour)
	require.Equal(t, idemkv.Acquired, v.claim(id("k"), fpA, idemkv.ModeLocal).Outcome)
}

func TestReplayCacheBounded(t *testing.T) {
	v := newEnv(t)
	require.NoError(t, v.e.Close())
	v.opts.ReplayCacheSize = 512 << 10 // freecache's smallest
	v.open()
	body := func(i int) string { return fmt.Sprintf("%0300d", i) }
	for i := range 2000 { // about 700 KB of entries
		c := v.claim(id(fmt.Sprintf("k%04d", i)), fpA, idemkv.ModeLocal)
		require.NoError(t, v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 200, Body: []byte(body(i))}, nil))
	}
	st, err := v.e.Stats()
	require.NoError(t, err)
	require.Less(t, st.ReplayCached, 2000)
	require.Positive(t, st.ReplayCached)
	for i := range 2000 { // evicted or not, every replay is right
		r := v.claim(id(fmt.Sprintf("k%04d", i)), fpA, idemkv.ModeLocal)
		require.Equal(t, body(i), string(r.Record.Result.Body))
	}
}

// TestConformanceNoReplayCache runs the conformance suite with the replay
// cache off, so that every lookup goes to Pebble.
func TestConformanceNoReplayCache(t *testing.T) {
	tier.Require(t, "the conformance suite already runs with the cache on")
	storetest.Run(t, harness(openForConformance(func(o *Options) { o.ReplayCacheSize = -1 })))
}

// TestReplayCacheNeverShadowsANewerRecord covers the first of the cache's
// two rules: a slot installed for a key drops its entry. The entry here
// is a completed record past its retention but not yet swept; a new remote
// claim of the key then leaves an uncertain record on disk and no slot.
// Had the stale entry survived, the next claim would read it as absent
// and acquire: the operation would run a second time while the first
// one's outcome is unknown.
func TestReplayCacheNeverShadowsANewerRecord(t *testing.T) {
	v := newEnv(t)
	c := v.claim(id("k"), fpA, idemkv.ModeLocal)
	require.NoError(t, v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, nil))
	require.Equal(t, idemkv.Replay, v.claim(id("k"), fpA, idemkv.ModeLocal).Outcome) // cached
	st, err := v.e.Stats()
	require.NoError(t, err)
	require.Equal(t, 1, st.ReplayCached)

	v.clock.Advance(24*time.Hour + time.Second)
	c = v.claim(id("k"), fpA, idemkv.ModeRemote)
	require.Equal(t, idemkv.Acquired, c.Outcome)
	require.NoError(t, v.e.MarkUncertain(ctx, c.Lease, "the downstream call timed out"))

	r := v.claim(id("k"), fpA, idemkv.ModeRemote)
	require.Equal(t, idemkv.Reconciling, r.Outcome)
	require.Equal(t, idemkv.StateUncertain, r.Record.State)
}
