package idemkv

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

func TestValidateKey(t *testing.T) {
	for _, tc := range []struct {
		key string
		ok  bool
	}{
		{"a", true},
		{"9f1c2e7a-5b4d-4c1e-8a0f-2d6b3c9e1a77", true},
		{" ~!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}", true}, // every printable ASCII byte is allowed
		{strings.Repeat("k", MaxKeyLen), true},
		{"", false},
		{strings.Repeat("k", MaxKeyLen+1), false},
		{"tab\t", false},
		{"nul\x00", false},
		{"del\x7f", false},
		{"café", false},
		{"\xff", false},
	} {
		err := ValidateKey(tc.key)
		if tc.ok {
			require.NoError(t, err, "%q", tc.key)
		} else {
			require.ErrorIs(t, err, ErrInvalidKey, "%q", tc.key)
		}
	}
}

func TestIDValidate(t *testing.T) {
	good := ID{Tenant: "acct_1", Endpoint: "POST /v1/payments", Key: "k"}
	require.NoError(t, good.Validate())
	for name, id := range map[string]ID{
		"empty tenant":    {Endpoint: "e", Key: "k"},
		"empty endpoint":  {Tenant: "t", Key: "k"},
		"long tenant":     {Tenant: strings.Repeat("t", MaxScopeLen+1), Endpoint: "e", Key: "k"},
		"long endpoint":   {Tenant: "t", Endpoint: strings.Repeat("e", MaxScopeLen+1), Key: "k"},
		"invalid utf8":    {Tenant: "t\xc3", Endpoint: "e", Key: "k"},
		"invalid utf8 ep": {Tenant: "t", Endpoint: "\xff", Key: "k"},
	} {
		require.ErrorIs(t, id.Validate(), ErrInvalidScope, name)
	}
	require.ErrorIs(t, ID{Tenant: "t", Endpoint: "e"}.Validate(), ErrInvalidKey)
	// Non-ASCII tenants and endpoints are fine as long as they are UTF-8.
	require.NoError(t, ID{Tenant: "société", Endpoint: "POST /paiements", Key: "k"}.Validate())
}

func TestValidateFingerprint(t *testing.T) {
	require.NoError(t, ValidateFingerprint([]byte{1}))
	require.NoError(t, ValidateFingerprint(make([]byte, MaxFingerprintLen)))
	require.ErrorIs(t, ValidateFingerprint(nil), ErrInvalidFingerprint)
	require.ErrorIs(t, ValidateFingerprint([]byte{}), ErrInvalidFingerprint)
	require.ErrorIs(t, ValidateFingerprint(make([]byte, MaxFingerprintLen+1)), ErrInvalidFingerprint)
}

func TestNames(t *testing.T) {
	require.Equal(t, "remote", ModeRemote.String())
	require.Equal(t, "uncertain", StateUncertain.String())
	require.Equal(t, "reconciling", Reconciling.String())
	require.Equal(t, "Outcome(99)", Outcome(99).String())
	require.True(t, OperationID{}.IsZero())
	require.Equal(t, "0100000000000000000000000000000f", OperationID{0: 1, 15: 15}.String())
	require.False(t, Lease{Attempt: 1}.Takeover())
	require.True(t, Lease{Attempt: 2}.Takeover())
}

// Tenant keys never collide across tenants, even when one tenant's name
// and key spell another's, and a tenant's prefix covers only its keys.
func TestAppendTenantKey(t *testing.T) {
	ab, err := AppendTenantKey(nil, "a", []byte("bc"))
	require.NoError(t, err)
	abc, err := AppendTenantKey(nil, "ab", []byte("c"))
	require.NoError(t, err)
	require.NotEqual(t, ab, abc)
	prefix, err := AppendTenantKey(nil, "a", nil)
	require.NoError(t, err)
	require.True(t, bytes.HasPrefix(ab, prefix))
	require.False(t, bytes.HasPrefix(abc, prefix))
	for _, bad := range []string{"", strings.Repeat("x", MaxScopeLen+1), "\xff"} {
		_, err := AppendTenantKey(nil, bad, []byte("k"))
		require.ErrorIs(t, err, ErrInvalidScope)
	}
}

// A step's downstream key is a pure function of the operation and the
// step: stable across attempts, distinct across steps and operations.
func TestStepKey(t *testing.T) {
	a := OperationID{1, 2, 3}
	b := OperationID{1, 2, 4}
	require.Equal(t, a.StepKey("charge"), a.StepKey("charge"))
	require.Len(t, a.StepKey("charge"), 32)
	require.NotEqual(t, a.StepKey("charge"), a.StepKey("refund"))
	require.NotEqual(t, a.StepKey("charge"), b.StepKey("charge"))
	require.NotEqual(t, a.String(), a.StepKey(""), "never the operation id itself")
	require.Equal(t, "0c77e70d5774072f", a.StepKey("charge")[:16], "the derivation is part of the contract: keys outlive upgrades")
}

func TestIDHash(t *testing.T) {
	id := ID{Tenant: "acct_1", Endpoint: "POST /v1/payments", Key: "order-1"}
	// The value the documented shell pipeline prints: operators compute
	// it by hand, so the derivation is part of the contract.
	require.Equal(t, "5ae9936887c0116b", id.Hash())
	for _, other := range []ID{
		{Tenant: "acct_2", Endpoint: id.Endpoint, Key: id.Key},
		{Tenant: id.Tenant, Endpoint: "PATCH /v1/payments", Key: id.Key},
		{Tenant: id.Tenant, Endpoint: id.Endpoint, Key: "order-2"},
		{Tenant: "acct_1POST /v1/payments", Endpoint: "", Key: id.Key}, // the separators keep the parts apart
	} {
		require.NotEqual(t, id.Hash(), other.Hash(), "%+v", other)
	}
	long := ID{Tenant: strings.Repeat("t", 300), Endpoint: "e", Key: "k"} // past the limits: still hashed, not a panic
	require.Len(t, long.Hash(), 16)
}

// OperationIDs derives what DeriveOperationID does, from any number of
// goroutines, and a reused MAC carries nothing from one id to the next.
func TestOperationIDsMatchDeriveOperationID(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	ids := NewOperationIDs(secret)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				id := ID{Tenant: fmt.Sprint("t", g), Endpoint: "POST /x", Key: fmt.Sprint("k", i)}
				fp := []byte{1, byte(i)}
				want := DeriveOperationID(secret, id, fp, uint32(i%3))
				if got := ids.Derive(id, fp, uint32(i%3)); got != want {
					t.Errorf("%v: got %s, want %s", id, got, want)
					return
				}
			}
		}()
	}
	wg.Wait()
	other := NewOperationIDs([]byte("another secret"))
	id := ID{Tenant: "t", Endpoint: "e", Key: "k"}
	require.NotEqual(t, ids.Derive(id, nil, 0), other.Derive(id, nil, 0))
}

// The limits every store applies, from the root package.
func TestDataLimits(t *testing.T) {
	require.NoError(t, ValidateEffectKey(make([]byte, MaxEffectKeyLen)))
	require.ErrorIs(t, ValidateEffectKey(make([]byte, MaxEffectKeyLen+1)), ErrInvalidArgument)
	require.ErrorIs(t, ValidateEffectKey(nil), ErrInvalidArgument)
	require.NoError(t, ValidateDataScan(nil, nil))
	require.NoError(t, ValidateDataScan([]byte("a/"), []byte("a/b")))
	require.ErrorIs(t, ValidateDataScan([]byte("a/"), []byte("b")), ErrInvalidArgument)

	ok := Result{Status: 65535, Pointer: string(make([]byte, MaxPointerLen)), Body: make([]byte, 10)}
	require.NoError(t, ok.Validate(10))
	for _, r := range []Result{{Status: -1}, {Status: 65536}, {Pointer: string(make([]byte, MaxPointerLen+1))}, {Body: make([]byte, 11)}} {
		require.ErrorIs(t, r.Validate(10), ErrInvalidResult)
	}
}

func TestNote(t *testing.T) {
	long := strings.Repeat("a", MaxNoteLen-1) + "é" // the é straddles the limit
	for in, want := range map[string]string{
		"timed out":                     "timed out",
		"psp: 502 body \xff\x00":        "psp: 502 body \uFFFD",
		long:                            strings.Repeat("a", MaxNoteLen-1),
		strings.Repeat("é", MaxNoteLen): strings.Repeat("é", MaxNoteLen/2),
	} {
		got := Note(in)
		require.Equal(t, want, got)
		require.True(t, utf8.ValidString(got))
		require.LessOrEqual(t, len(got), MaxNoteLen)
		require.NotContains(t, got, "\x00")
	}
}
