package fingerprint_test

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/idemkv/idemkv/fingerprint"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// payloadEncoding builds the encoding payload.go documents, independently
// of the package's code: the tagged kind, then the body form.
func payloadEncoding(t *testing.T, p fingerprint.Payload, opts *fingerprint.Options) []byte {
	part := func(enc []byte, kind byte, payload []byte) []byte {
		enc = append(enc, kind)
		enc = binary.AppendUvarint(enc, uint64(len(payload)))
		return append(enc, payload...)
	}
	str := func(dst []byte, s string) []byte {
		return append(binary.AppendUvarint(dst, uint64(len(s))), s...)
	}
	enc := part(nil, 0x20, []byte(p.Kind))
	o := opts.EnsureDefaults()
	switch {
	case len(p.Body) == 0:
		return part(enc, 0x10, nil)
	case o.Mode == fingerprint.ModeRaw:
		return part(enc, 0x11, p.Body)
	case o.Mode == fingerprint.ModeJSON:
		canon, err := fingerprint.Canonical(p.Body, opts)
		require.NoError(t, err)
		return part(enc, 0x12, canon)
	}
	fields, err := fingerprint.Select(p.Body, opts)
	require.NoError(t, err)
	for _, f := range fields {
		pl := str(nil, f.Pointer)
		if f.Value == nil {
			pl = append(pl, 0)
		} else {
			pl = append(append(pl, 1), f.Value...)
		}
		enc = part(enc, 0x13, pl)
	}
	return enc
}

var payloadCases = []struct {
	name string
	p    fingerprint.Payload
	opts *fingerprint.Options
	// want is version 1's output, frozen: a payload fingerprint must keep
	// matching its retries for as long as its record lives.
	want string
}{
	{"empty", fingerprint.Payload{Kind: "jobs.noop"}, nil, "01319000677c5533e0"},
	{"json", fingerprint.Payload{Kind: "ledger.credit", Body: []byte(`{"amount": 5000, "account": "acct_42"}`)}, nil, "010f8fbf15224b1020"},
	{"raw", fingerprint.Payload{Kind: "mail.send", Body: []byte("To: a@example.com\r\n\r\nhi")},
		&fingerprint.Options{Mode: fingerprint.ModeRaw}, "01057b2e397d9e73b7"},
	{"fields", fingerprint.Payload{Kind: "psp.charge", Body: []byte(`{"amount":5000,"sent_at":"12:00","currency":"EUR"}`)},
		&fingerprint.Options{Mode: fingerprint.ModeFields, Fields: []string{"/currency", "/amount", "/missing"}}, "0125176641b38c45d1"},
	{"no kind", fingerprint.Payload{Body: []byte(`[1,2,3]`)}, nil, "011b5cbbef7c87b502"},
}

func TestPayloadEncoding(t *testing.T) {
	for _, tc := range payloadCases {
		t.Run(tc.name, func(t *testing.T) {
			fp, err := fingerprint.ComputePayload(tc.p, tc.opts)
			require.NoError(t, err)
			want := binary.BigEndian.AppendUint64([]byte{1}, xxhash.Sum64(payloadEncoding(t, tc.p, tc.opts)))
			require.Equal(t, hex.EncodeToString(want), fp.String(), "the documented encoding")
			assert.Nil(t, fp.Diagnostics)
			v, err := fingerprint.Version(fp.Bytes)
			require.NoError(t, err)
			assert.Equal(t, 1, v, "Version reads a payload fingerprint as it reads a request's")
		})
	}
}

func TestPayloadVectors(t *testing.T) {
	for _, tc := range payloadCases {
		fp, err := fingerprint.ComputePayload(tc.p, tc.opts)
		require.NoError(t, err)
		assert.Equal(t, tc.want, fp.String(), "%s: version 1 of the payload encoding is frozen", tc.name)
	}
}

func TestPayloadKindSeparates(t *testing.T) {
	body := []byte(`{"amount":5000}`)
	a, err := fingerprint.ComputePayload(fingerprint.Payload{Kind: "refund", Body: body}, nil)
	require.NoError(t, err)
	b, err := fingerprint.ComputePayload(fingerprint.Payload{Kind: "charge", Body: body}, nil)
	require.NoError(t, err)
	assert.NotEqual(t, a.String(), b.String(), "equal payloads of two operations differ")

	// Neither is the fingerprint of a request with the kind as its tenant
	// or route: their encodings begin with different tags.
	for _, req := range []fingerprint.Request{{Tenant: "refund", Body: body}, {Route: "refund", Body: body}} {
		r, err := fingerprint.Compute(req, nil)
		require.NoError(t, err)
		assert.NotEqual(t, a.String(), r.String())
	}
	// An empty body is no body; a kind's bytes cannot spill into the body.
	x, err := fingerprint.ComputePayload(fingerprint.Payload{Kind: "ab", Body: []byte("c")}, &fingerprint.Options{Mode: fingerprint.ModeRaw})
	require.NoError(t, err)
	y, err := fingerprint.ComputePayload(fingerprint.Payload{Kind: "a", Body: []byte("bc")}, &fingerprint.Options{Mode: fingerprint.ModeRaw})
	require.NoError(t, err)
	assert.NotEqual(t, x.String(), y.String())
}

func TestComputeValue(t *testing.T) {
	type credit struct {
		Amount  int    `json:"amount"`
		Account string `json:"account"`
		ID      int64  `json:"id,string"`
	}
	s, err := fingerprint.ComputeValue("ledger.credit", credit{Amount: 5000, Account: "acct_42", ID: 1 << 60}, nil)
	require.NoError(t, err)
	m, err := fingerprint.ComputeValue("ledger.credit", map[string]any{"account": "acct_42", "id": "1152921504606846976", "amount": 5000.0}, nil)
	require.NoError(t, err)
	assert.Equal(t, s.String(), m.String(), "a struct and a map encoding the same JSON agree")
	text, err := fingerprint.ComputePayload(fingerprint.Payload{Kind: "ledger.credit",
		Body: []byte(` { "id": "1152921504606846976", "amount": 5e3, "account": "acct_42" } `)}, nil)
	require.NoError(t, err)
	assert.Equal(t, s.String(), text.String(), "and the JSON text, however spelled")

	_, err = fingerprint.ComputeValue("k", map[string]int64{"id": 1<<53 + 1}, nil)
	require.ErrorIs(t, err, fingerprint.ErrInexactNumber, "an int64 beyond 2^53 is not exact in JSON")
	_, err = fingerprint.ComputeValue("k", make(chan int), nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "encoding the value")
}

func TestPayloadErrors(t *testing.T) {
	p := fingerprint.Payload{Kind: "k", Body: []byte(`{"a":1}`)}
	for _, opts := range []*fingerprint.Options{
		{Headers: []string{"Api-Version"}},
		{Query: []string{"page"}},
		{Diagnostics: true},
		{Mode: fingerprint.ModeFields}, // no fields
	} {
		_, err := fingerprint.ComputePayload(p, opts)
		require.ErrorIs(t, err, fingerprint.ErrInvalidOptions, "%+v", opts)
		_, err = fingerprint.MatchesPayload([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9}, p, opts)
		require.ErrorIs(t, err, fingerprint.ErrInvalidOptions, "%+v", opts)
	}
	_, err := fingerprint.ComputePayload(fingerprint.Payload{Body: []byte(`{"a":1,"a":2}`)}, nil)
	require.ErrorIs(t, err, fingerprint.ErrInvalidBody)
	require.ErrorIs(t, err, fingerprint.ErrDuplicateName)
	_, err = fingerprint.ComputePayload(fingerprint.Payload{Body: []byte(strings.Repeat("x", 11))},
		&fingerprint.Options{Mode: fingerprint.ModeRaw, MaxBodySize: 10})
	require.ErrorIs(t, err, fingerprint.ErrTooLarge)
}

func TestMatchesPayload(t *testing.T) {
	p := fingerprint.Payload{Kind: "ledger.credit", Body: []byte(`{"amount":5000}`)}
	fp, err := fingerprint.ComputePayload(p, nil)
	require.NoError(t, err)

	ok, err := fingerprint.MatchesPayload(fp.Bytes, fingerprint.Payload{Kind: p.Kind, Body: []byte(`{ "amount" : 5000.0 }`)}, nil)
	require.NoError(t, err)
	assert.True(t, ok)
	ok, err = fingerprint.MatchesPayload(fp.Bytes, fingerprint.Payload{Kind: p.Kind, Body: []byte(`{"amount":5001}`)}, nil)
	require.NoError(t, err)
	assert.False(t, ok)
	ok, err = fingerprint.MatchesPayload(fp.Bytes, fingerprint.Payload{Kind: "ledger.debit", Body: p.Body}, nil)
	require.NoError(t, err)
	assert.False(t, ok)

	_, err = fingerprint.MatchesPayload(nil, p, nil)
	require.ErrorIs(t, err, fingerprint.ErrInvalidStored)
	_, err = fingerprint.MatchesPayload(fp.Bytes[:5], p, nil)
	require.ErrorIs(t, err, fingerprint.ErrInvalidStored)
	_, err = fingerprint.MatchesPayload(append([]byte{99}, fp.Bytes[1:]...), p, nil)
	require.ErrorIs(t, err, fingerprint.ErrUnknownVersion)
}

func ExampleComputePayload() {
	// A charge message carries a volatile timestamp: only the amount and
	// the currency define the operation.
	opts := &fingerprint.Options{Mode: fingerprint.ModeFields, Fields: []string{"/amount", "/currency"}}
	first := fingerprint.Payload{Kind: "psp.charge", Body: []byte(`{"amount":5000,"currency":"EUR","sent_at":"12:00:00"}`)}
	redelivered := fingerprint.Payload{Kind: "psp.charge", Body: []byte(`{"sent_at":"12:00:05","currency":"EUR","amount":5e3}`)}
	refund := fingerprint.Payload{Kind: "psp.refund", Body: first.Body}

	a, _ := fingerprint.ComputePayload(first, opts)
	b, _ := fingerprint.ComputePayload(redelivered, opts)
	c, _ := fingerprint.ComputePayload(refund, opts)
	fmt.Println(len(a.Bytes), a.String() == b.String(), a.String() == c.String())
	// Output: 9 true false
}
