package engine

import (
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/ttl"
	"github.com/stretchr/testify/require"
)

func TestScanData(t *testing.T) {
	v := newEnv(t)
	c := v.claim(id("k"), fpA, idemkv.ModeLocal)
	require.NoError(t, v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, func(fx idemkv.Effects) error {
		for _, k := range []string{"a/2", "a/1", "a/3", "a", "b/1", "a\xff", "a\xff\xff"} {
			if err := fx.Set([]byte(k), []byte("v"+k)); err != nil {
				return err
			}
		}
		return nil
	}))
	scan := func(prefix string, limit int) (keys []string) {
		require.NoError(t, v.e.ScanData(ctx, []byte(prefix), func(k, val []byte) bool {
			require.Equal(t, "v"+string(k), string(val))
			keys = append(keys, string(k))
			return len(keys) < limit
		}))
		return keys
	}
	require.Equal(t, []string{"a/1", "a/2", "a/3"}, scan("a/", 10))
	require.Equal(t, []string{"a/1", "a/2"}, scan("a/", 2), "stops when fn says so")
	require.Equal(t, []string{"a", "a/1", "a/2", "a/3", "a\xff", "a\xff\xff"}, scan("a", 10))
	require.Equal(t, []string{"a\xff", "a\xff\xff"}, scan("a\xff", 10))
	require.Empty(t, scan("c", 10))
	require.Len(t, scan("", 100), 7, "the empty prefix scans every effect and no record")

	// Pages: resume after the last key seen.
	var pages [][]string
	var after []byte
	for {
		var page []string
		require.NoError(t, v.e.ScanDataAfter(ctx, []byte("a"), after, func(k, _ []byte) bool {
			page = append(page, string(k))
			return len(page) < 2
		}))
		if len(page) == 0 {
			break
		}
		pages = append(pages, page)
		after = []byte(page[len(page)-1])
	}
	require.Equal(t, [][]string{{"a", "a/1"}, {"a/2", "a/3"}, {"a\xff", "a\xff\xff"}}, pages)
	require.ErrorIs(t, v.e.ScanDataAfter(ctx, []byte("a/"), []byte("b/1"), func(_, _ []byte) bool { return true }), idemkv.ErrInvalidArgument,
		"the resume key must lie under the prefix")

	v.reopen()
	require.Equal(t, []string{"a/1", "a/2", "a/3"}, scan("a/", 10), "effects are durable")
	require.NoError(t, v.e.Close())
	require.ErrorIs(t, v.e.ScanData(ctx, nil, func(_, _ []byte) bool { return true }), idemkv.ErrClosed)
	v.e = nil
}

func TestRetentionOfClass(t *testing.T) {
	v := newEnv(t)
	v.opts.Retention = 2 * time.Hour
	v.opts.RetentionClasses = ttl.Classes{"money": 30 * 24 * time.Hour}
	v.reopen()
	for class, want := range map[string]time.Duration{"": 2 * time.Hour, ttl.DefaultClass: 2 * time.Hour, "money": 30 * 24 * time.Hour} {
		got, err := v.e.Retention(class)
		require.NoError(t, err)
		require.Equal(t, want, got, class)
	}
	_, err := v.e.Retention("nope")
	require.ErrorIs(t, err, idemkv.ErrInvalidArgument)
}

// TestEffectsSizeBound: writes past Options.MaxEffectsSize fail in the
// apply function, before anything is held or written, and leave the key
// as it was: the holder can still complete, an uncertain record can still
// be resolved.
func TestEffectsSizeBound(t *testing.T) {
	v := newEnv(t)
	v.opts.MaxEffectsSize = 1024
	v.reopen()
	big := make([]byte, 1025)

	c := v.claim(id("k"), fpA, idemkv.ModeLocal)
	err := v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, func(fx idemkv.Effects) error {
		return fx.Set([]byte("big"), big)
	})
	require.ErrorIs(t, err, idemkv.ErrInvalidArgument)
	require.ErrorContains(t, err, "limit 1024")
	err = v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, func(fx idemkv.Effects) error {
		for i := range 3 { // keys and values add up: the third write is past the bound
			if err := fx.Set([]byte{'a', byte(i)}, big[:400]); err != nil {
				return err
			}
		}
		return nil
	})
	require.ErrorIs(t, err, idemkv.ErrInvalidArgument)
	require.NoError(t, v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, func(fx idemkv.Effects) error {
		return fx.Set([]byte("small"), big[:1000])
	}), "the failed attempts held nothing")
	_, err = v.e.GetData(ctx, []byte("big"))
	require.ErrorIs(t, err, idemkv.ErrNotFound)
	require.Equal(t, idemkv.Replay, v.claim(id("k"), fpA, idemkv.ModeLocal).Outcome)

	u := v.claim(id("u"), fpA, idemkv.ModeRemote)
	require.NoError(t, v.e.MarkUncertain(ctx, u.Lease, "timeout"))
	rec, err := v.e.Get(ctx, id("u"))
	require.NoError(t, err)
	req := idemkv.ResolveRequest{ID: id("u"), Token: rec.Token, Result: idemkv.Result{Status: 201},
		Apply: func(fx idemkv.Effects) error { return fx.Delete(big) }}
	require.ErrorIs(t, v.e.Resolve(ctx, req), idemkv.ErrInvalidArgument, "a key past MaxEffectKeyLen")
	req.Apply = func(fx idemkv.Effects) error { return fx.Set([]byte("ledger"), big) }
	require.ErrorIs(t, v.e.Resolve(ctx, req), idemkv.ErrInvalidArgument)
	req.Apply = func(fx idemkv.Effects) error { return fx.Set([]byte("ledger"), big[:10]) }
	require.NoError(t, v.e.Resolve(ctx, req), "the record was left uncertain, and resolvable")
	require.Equal(t, idemkv.Replay, v.claim(id("u"), fpA, idemkv.ModeRemote).Outcome)

	v.opts.MaxEffectsSize = -1
	_, err = Open(t.TempDir(), &v.opts)
	require.ErrorContains(t, err, "MaxEffectsSize")
}
