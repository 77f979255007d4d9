package engine

import (
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/record"
	"github.com/stretchr/testify/require"
)

// TestCheckSoundStore checks a store holding every kind of record, and
// that Check counts them.
func TestCheckSoundStore(t *testing.T) {
	v := newEnv(t)
	c := v.claim(id("done"), fpA, idemkv.ModeLocal)
	require.NoError(t, v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 201, Pointer: "/p/1", Body: []byte("{}")},
		func(fx idemkv.Effects) error { return fx.Set([]byte("pay/1"), []byte("row")) }))
	r := v.claim(id("remote"), fpA, idemkv.ModeRemote)
	u := v.claim(id("unsure"), fpA, idemkv.ModeRemote)
	require.NoError(t, v.e.MarkUncertain(ctx, u.Lease, "timeout"))
	v.claim(id("local"), fpA, idemkv.ModeLocal) // in memory only
	old := v.claim(id("old"), fpA, idemkv.ModeLocal)
	require.NoError(t, v.e.Complete(ctx, old.Lease, idemkv.Result{Status: 200}, nil))
	v.clock.Advance(25 * time.Hour)
	_ = r

	rep, err := v.e.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%v", rep.Problems)
	require.Equal(t, 4, rep.Records)
	require.Equal(t, 1, rep.InProgress)
	require.Equal(t, 1, rep.Uncertain)
	require.Equal(t, 2, rep.Completed)
	require.Equal(t, 2, rep.Expired)
	require.Equal(t, 1, rep.Effects)
	require.Equal(t, uint64(1), rep.Epoch)
}

// TestCheckFindsBrokenInvariants writes, with raw Pebble, one entry per
// invariant Check verifies, and expects each to be reported.
func TestCheckFindsBrokenInvariants(t *testing.T) {
	v := newEnv(t)
	c := v.claim(id("good"), fpA, idemkv.ModeLocal)
	require.NoError(t, v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, nil))
	require.NoError(t, v.e.Close())
	v.e = nil

	db, err := pebble.Open(v.dir, v.opts.EnsureDefaults().PebbleOptions())
	require.NoError(t, err)
	now := v.clock.Now()
	rec := func(mut func(*idemkv.Record)) []byte {
		r := idemkv.Record{State: idemkv.StateCompleted, Fingerprint: fpA, Token: 1<<tokenSeqBits | 7, Attempt: 1,
			Created: now, Expires: now.Add(time.Hour), Result: idemkv.Result{Status: 200}}
		mut(&r)
		return record.Encode(nil, &r)
	}
	want := map[string][]byte{
		"does not decode":         []byte{1, 0xff},
		"never written":           rec(func(r *idemkv.Record) { r.State, r.Result = idemkv.StateInProgress, idemkv.Result{} }),
		"after the stored epoch":  rec(func(r *idemkv.Record) { r.Token = 9<<tokenSeqBits | 1 }),
		"without an operation id": rec(func(r *idemkv.Record) { r.Mode = idemkv.ModeRemote }),
		"token is zero":           rec(func(r *idemkv.Record) { r.Token = 0 }),
	}
	i := 0
	for _, val := range want {
		i++
		require.NoError(t, db.Set(appendRecordKey(nil, id(strings.Repeat("b", i))), val, nil))
	}
	require.NoError(t, db.Set([]byte{nsRecord, 0xff, 0xff}, rec(func(*idemkv.Record) {}), nil))
	require.NoError(t, db.Set([]byte{0x09, 'x'}, []byte("?"), nil))
	require.NoError(t, db.Set([]byte{nsMeta, 'z'}, []byte("?"), nil))
	require.NoError(t, db.Set(sweepKey, []byte("not a key"), nil))
	require.NoError(t, db.Close())

	v.opts.ReadOnly = true
	v.open()
	rep, err := v.e.Check(ctx)
	require.NoError(t, err)
	found := strings.Join(func() []string {
		var s []string
		for _, p := range rep.Problems {
			s = append(s, p.String())
		}
		return s
	}(), "\n")
	for what := range want {
		require.Contains(t, found, what)
	}
	for _, what := range []string{"record key does not decode", "unknown namespace", "unknown metadata key", "sweeper position"} {
		require.Contains(t, found, what)
	}
	require.Equal(t, len(want)+4, rep.ProblemCount, found)
	require.Equal(t, len(rep.Problems), rep.ProblemCount)
}
