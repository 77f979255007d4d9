package fingerprint

import (
	"context"
	"encoding/binary"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/stretchr/testify/require"
)

// withVersion2 plays a release that adds a version 2 (version 1's encoding
// under another hash) and makes it current, until the test ends.
func withVersion2(t *testing.T) {
	algorithms[2] = &algorithm{version: 2, size: 9, compute: func(st *state, req *Request, c *config) error {
		if err := computeV1(st, req, c); err != nil {
			return err
		}
		h := xxhash.New()
		h.WriteString("v2")
		h.Write(st.enc)
		st.fp = binary.BigEndian.AppendUint64(append(st.fp[:0], 2), h.Sum64())
		return nil
	}}
	current = 2
	t.Cleanup(func() {
		delete(algorithms, 2)
		current = CurrentVersion
	})
}

// TestUpgrade stores a record under version 1, upgrades to version 2, and
// retries: the retry is recognized with version 1's algorithm and replays,
// while a request that really differs is still a mismatch.
func TestUpgrade(t *testing.T) {
	ctx := context.Background()
	e, err := engine.Open(t.TempDir(), nil)
	require.NoError(t, err)
	defer e.Close()

	req := Request{Tenant: "acct_42", Method: "POST", Route: "/v1/payments", Body: []byte(`{"amount":5000,"currency":"USD"}`)}
	id := idemkv.ID{Tenant: req.Tenant, Endpoint: "POST /v1/payments", Key: "k1"}
	opts := &Options{Diagnostics: true}

	old, err := Compute(req, opts)
	require.NoError(t, err)
	require.EqualValues(t, 1, old.Bytes[0])
	c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: old.Bytes})
	require.NoError(t, err)
	require.Equal(t, idemkv.Acquired, c.Outcome)
	require.NoError(t, e.Complete(ctx, c.Lease, idemkv.Result{Status: 201, Pointer: "/v1/payments/p1"}, nil))

	withVersion2(t)

	// claim is how a handler claims after the upgrade (see Matches).
	claim := func(req Request) idemkv.Claim {
		t.Helper()
		fp, err := Compute(req, opts)
		require.NoError(t, err)
		require.EqualValues(t, 2, fp.Bytes[0])
		c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: fp.Bytes})
		require.NoError(t, err)
		if c.Outcome == idemkv.Mismatch {
			ok, err := Matches(c.Record.Fingerprint, req, opts)
			require.NoError(t, err)
			if ok {
				c, err = e.Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: c.Record.Fingerprint})
				require.NoError(t, err)
			}
		}
		return c
	}

	// The same request, spelled differently: a legitimate retry.
	retry := req
	retry.Body = []byte(`{ "currency": "USD", "amount": 5e3 }`)
	c = claim(retry)
	require.Equal(t, idemkv.Replay, c.Outcome)
	require.Equal(t, "/v1/payments/p1", c.Record.Result.Pointer)
	v, err := Version(c.Record.Fingerprint)
	require.NoError(t, err)
	require.Equal(t, 1, v)

	// A different request under the same key is still a mismatch, and the
	// version 1 diagnostics still explain it.
	other := req
	other.Body = []byte(`{"amount":50000,"currency":"USD"}`)
	c = claim(other)
	require.Equal(t, idemkv.Mismatch, c.Outcome)
	diffs, err := Explain(old.Diagnostics, other, opts)
	require.NoError(t, err)
	require.Equal(t, []Difference{{Part: "body /amount", Change: Changed}}, diffs)

	// Version 2 values are checked with version 2.
	now, err := Compute(req, opts)
	require.NoError(t, err)
	require.NotEqual(t, old.Bytes, now.Bytes)
	require.EqualValues(t, 2, now.Diagnostics[0])
	for _, stored := range [][]byte{old.Bytes, now.Bytes} {
		ok, err := Matches(stored, retry, opts)
		require.NoError(t, err)
		require.True(t, ok, "%x", stored)
		ok, err = Matches(stored, other, opts)
		require.NoError(t, err)
		require.False(t, ok, "%x", stored)
	}
}

// TestRegistry pins the registry: version 1, current, 9 bytes.
func TestRegistry(t *testing.T) {
	require.EqualValues(t, CurrentVersion, current)
	require.Len(t, algorithms, 1)
	a := algorithms[1]
	require.EqualValues(t, 1, a.version)
	require.Equal(t, 9, a.size)
	require.LessOrEqual(t, a.size, idemkv.MaxFingerprintLen)
}
