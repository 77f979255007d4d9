package storetest

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/idemkv/idemkv"
	"github.com/stretchr/testify/require"
)

// dataStore: the part of idemkv.DataStore a store adds to the contract.
// Values an operation committed are read back one by one and in pages;
// the limits and validators of the root package hold; a context that is
// done ends every call with its error; Counts counts what the store did;
// Now is the store's clock. A store that is not an idemkv.DataStore
// skips it.
func dataStore(t *testing.T, newHarness NewHarness) {
	h := newHarness(t, nil)
	defer h.Close()
	s, ok := h.Store().(idemkv.DataStore)
	if !ok {
		t.Skipf("%T is not an idemkv.DataStore", h.Store())
	}
	require.True(t, s.Now().Equal(h.Now()), "the store's clock is the harness's")
	require.NoError(t, s.Health(ctx))
	before := s.Counts()

	id := idemkv.ID{Tenant: "t", Endpoint: "POST /rows", Key: "k1"}
	c, err := s.Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: []byte("fp")})
	require.NoError(t, err)
	require.Equal(t, idemkv.Acquired, c.Outcome)
	require.NoError(t, s.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, func(fx idemkv.Effects) error {
		for i := range 5 {
			if err := fx.Set(fmt.Appendf(nil, "row/%d", i), fmt.Appendf(nil, "v%d", i)); err != nil {
				return err
			}
		}
		return fx.Set([]byte("rox"), []byte("outside the prefix"))
	}))
	c, err = s.Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: []byte("fp")})
	require.NoError(t, err)
	require.Equal(t, idemkv.Replay, c.Outcome)
	c, err = s.Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: []byte("another payload")})
	require.NoError(t, err)
	require.Equal(t, idemkv.Mismatch, c.Outcome)
	held := idemkv.ID{Tenant: "t", Endpoint: "POST /rows", Key: "held"}
	for _, want := range []idemkv.Outcome{idemkv.Acquired, idemkv.InProgress} {
		c, err = s.Claim(ctx, idemkv.ClaimRequest{ID: held, Fingerprint: []byte("fp")})
		require.NoError(t, err)
		require.Equal(t, want, c.Outcome)
	}
	now := s.Counts()
	require.Equal(t, before.Claims+5, now.Claims)
	require.Equal(t, before.Acquired+2, now.Acquired)
	require.Equal(t, before.Replays+1, now.Replays)
	require.Equal(t, before.Mismatches+1, now.Mismatches)
	require.Equal(t, before.InProgress+1, now.InProgress)
	require.Equal(t, before.Completed+1, now.Completed)

	v, err := s.GetData(ctx, []byte("row/3"))
	require.NoError(t, err)
	require.Equal(t, "v3", string(v))
	_, err = s.GetData(ctx, []byte("row/9"))
	require.ErrorIs(t, err, idemkv.ErrNotFound)

	// Pages of two, each resuming after the last key of the one before.
	var keys []string
	var after []byte
	for {
		n := 0
		err := s.ScanDataAfter(ctx, []byte("row/"), after, func(k, _ []byte) bool {
			keys = append(keys, string(k))
			after = bytes.Clone(k)
			n++
			return n < 2
		})
		require.NoError(t, err)
		if n == 0 {
			break
		}
	}
	require.Equal(t, []string{"row/0", "row/1", "row/2", "row/3", "row/4"}, keys)

	// An empty prefix scans every key.
	keys = nil
	require.NoError(t, s.ScanData(ctx, nil, func(k, _ []byte) bool { keys = append(keys, string(k)); return true }))
	require.Equal(t, []string{"row/0", "row/1", "row/2", "row/3", "row/4", "rox"}, keys)

	// The root package's limits, the same on every store.
	long := []byte(strings.Repeat("k", idemkv.MaxEffectKeyLen+1))
	for _, err := range []error{
		func() error { _, err := s.GetData(ctx, nil); return err }(),
		func() error { _, err := s.GetData(ctx, long); return err }(),
		s.ScanData(ctx, long, func(_, _ []byte) bool { return true }),
		s.ScanDataAfter(ctx, []byte("row/"), []byte("other"), func(_, _ []byte) bool { return true }),
		s.Update(ctx, func(fx idemkv.Effects) error { return fx.Set(long, nil) }),
		s.Update(ctx, func(fx idemkv.Effects) error { // completes no operation
			if rs, ok := fx.(idemkv.ResultSetter); ok {
				if err := rs.SetResult(idemkv.Result{Status: 200}); err != nil {
					return err
				}
				return fx.Set([]byte("written"), []byte("x"))
			}
			return idemkv.ErrInvalidArgument
		}),
	} {
		require.ErrorIs(t, err, idemkv.ErrInvalidArgument)
	}
	_, err = s.GetData(ctx, []byte("written"))
	require.ErrorIs(t, err, idemkv.ErrNotFound, "a refused Update writes nothing")
	_, err = s.Claim(ctx, idemkv.ClaimRequest{ID: idemkv.ID{Tenant: "t", Endpoint: "POST /rows", Key: "k2"}, Fingerprint: []byte("fp")})
	require.NoError(t, err)

	// A context that is done ends every call with its error, and writes
	// nothing.
	done, cancel := context.WithCancel(ctx)
	cancel()
	_, err = s.GetData(done, []byte("row/3"))
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, s.ScanData(done, []byte("row/"), func(_, _ []byte) bool { return true }), context.Canceled)
	require.ErrorIs(t, s.ScanData(done, []byte("none/"), func(_, _ []byte) bool { return true }), context.Canceled, "nothing to scan")
	require.ErrorIs(t, s.Update(done, func(fx idemkv.Effects) error { return fx.Set([]byte("late"), []byte("x")) }), context.Canceled)
	require.ErrorIs(t, s.Health(done), context.Canceled)
	_, err = s.GetData(ctx, []byte("late"))
	require.ErrorIs(t, err, idemkv.ErrNotFound)
}
