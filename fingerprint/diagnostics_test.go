package fingerprint_test

import (
	"encoding/binary"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/idemkv/idemkv/fingerprint"
	"github.com/stretchr/testify/require"
)

func TestExplain(t *testing.T) {
	base := fingerprint.Request{
		Tenant: "acct_42", Method: "POST", Route: "/v1/accounts/{acct}/payments",
		Params: map[string]string{"acct": "a_1"},
		Header: map[string][]string{"Currency": {"USD"}},
		Query:  map[string][]string{"dry_run": {"false"}},
		Body:   []byte(`{"amount":5000,"card":"tok_123","a/b":{"x":1}}`),
	}
	opts := &fingerprint.Options{Headers: []string{"Currency"}, Query: []string{"dry_run"}, Diagnostics: true}
	fp, err := fingerprint.Compute(base, opts)
	require.NoError(t, err)

	for _, tc := range []struct {
		name   string
		change func(r *fingerprint.Request)
		want   []string
	}{
		{"same request, respelled", func(r *fingerprint.Request) {
			r.Body = []byte(` { "a/b" : {"x":1.0}, "card":"tok_123", "amount":5e3 } `)
			r.Header = map[string][]string{"currency": {"USD"}}
		}, nil},
		{"amount", func(r *fingerprint.Request) {
			r.Body = []byte(`{"amount":6000,"card":"tok_123","a/b":{"x":1}}`)
		}, []string{"body /amount: changed"}},
		{"nested member", func(r *fingerprint.Request) {
			r.Body = []byte(`{"amount":5000,"card":"tok_123","a/b":{"x":2}}`)
		}, []string{"body /a~1b: changed"}},
		{"member removed and added", func(r *fingerprint.Request) {
			r.Body = []byte(`{"amount":5000,"a/b":{"x":1},"note":"hi"}`)
		}, []string{"body /card: removed", "body /note: added"}},
		{"not an object any more", func(r *fingerprint.Request) {
			r.Body = []byte(`[5000]`)
		}, []string{"body /a~1b: removed", "body /amount: removed", "body /card: removed", "body: added"}},
		{"no body", func(r *fingerprint.Request) { r.Body = nil },
			[]string{"body /a~1b: removed", "body /amount: removed", "body /card: removed", "body: added"}},
		{"tenant and method", func(r *fingerprint.Request) { r.Tenant, r.Method = "acct_43", "PUT" },
			[]string{"tenant: changed", "method: changed"}},
		{"route", func(r *fingerprint.Request) { r.Route = "/v2/payments" }, []string{"route: changed"}},
		{"param", func(r *fingerprint.Request) { r.Params = map[string]string{"acct": "a_2", "x": ""} },
			[]string{"param acct: changed", "param x: added"}},
		{"header", func(r *fingerprint.Request) { r.Header = map[string][]string{"Currency": {"USD", "EUR"}} },
			[]string{"header currency: changed"}},
		{"header absent", func(r *fingerprint.Request) { r.Header = nil }, []string{"header currency: changed"}},
		{"query", func(r *fingerprint.Request) { r.Query = map[string][]string{"dry_run": {"true"}} },
			[]string{"query dry_run: changed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := base
			tc.change(&req)
			diffs, err := fingerprint.Explain(fp.Diagnostics, req, opts)
			require.NoError(t, err)
			var got []string
			for _, d := range diffs {
				got = append(got, d.String())
			}
			require.Equal(t, tc.want, got)
			ok, err := fingerprint.Matches(fp.Bytes, req, opts)
			require.NoError(t, err)
			require.Equal(t, tc.want == nil, ok)
		})
	}

	// ModeFields names the selected fields.
	fo := &fingerprint.Options{Mode: fingerprint.ModeFields, Fields: []string{"/amount", "/meta/ref"}, Diagnostics: true}
	ffp, err := fingerprint.Compute(fingerprint.Request{Body: []byte(`{"amount":1,"meta":{"ref":"r1"},"ts":1}`)}, fo)
	require.NoError(t, err)
	diffs, err := fingerprint.Explain(ffp.Diagnostics, fingerprint.Request{Body: []byte(`{"amount":1,"meta":{},"ts":2}`)}, fo)
	require.NoError(t, err)
	require.Equal(t, []fingerprint.Difference{{Part: "body /meta/ref", Change: fingerprint.Changed}}, diffs)
}

// TestDiagnosticsLayout rebuilds a diagnostics value by hand from its
// documentation.
func TestDiagnosticsLayout(t *testing.T) {
	req := fingerprint.Request{Tenant: "t", Params: map[string]string{"id": "7"}, Body: []byte(`{"b":[1],"a":2}`)}
	fp, err := fingerprint.Compute(req, &fingerprint.Options{Diagnostics: true})
	require.NoError(t, err)

	part := func(kind byte, payload string) []byte {
		return append(binary.AppendUvarint([]byte{kind}, uint64(len(payload))), payload...)
	}
	digest := func(b []byte) []byte {
		return binary.BigEndian.AppendUint32(nil, uint32(xxhash.Sum64(b)>>32))
	}
	var want []byte
	want = append(want, 1) // version
	want = append(append(want, 1), digest(part(0x01, "t"))...)
	want = append(append(want, 2), digest(part(0x02, ""))...)
	want = append(append(want, 3), digest(part(0x03, ""))...)
	want = append(append(want, 4, 2, 'i', 'd'), digest(part(0x04, "\x02id\x017"))...)
	want = append(append(want, 8, 2, '/', 'a'), digest([]byte("\x14\x02/a2"))...)
	want = append(append(want, 8, 2, '/', 'b'), digest([]byte("\x14\x02/b[1]"))...)
	require.Equal(t, want, fp.Diagnostics)
	require.Len(t, fp.Diagnostics, 1+3*5+8+2*8)
}

func TestExplainErrors(t *testing.T) {
	req := payment()
	for _, tc := range []struct {
		diag []byte
		err  error
	}{
		{nil, fingerprint.ErrInvalidStored},
		{[]byte{0}, fingerprint.ErrUnknownVersion},
		{[]byte{7, 1, 0, 0, 0, 0}, fingerprint.ErrUnknownVersion},
		{[]byte{1, 9, 0, 0, 0, 0}, fingerprint.ErrInvalidStored},         // unknown part
		{[]byte{1, 1, 0, 0, 0}, fingerprint.ErrInvalidStored},            // short digest
		{[]byte{1, 4, 5, 'a', 0, 0, 0, 0}, fingerprint.ErrInvalidStored}, // name past the end
		{[]byte{1, 4, 0x80}, fingerprint.ErrInvalidStored},               // bad uvarint
	} {
		_, err := fingerprint.Explain(tc.diag, req, nil)
		require.ErrorIs(t, err, tc.err, "%x", tc.diag)
	}
	diffs, err := fingerprint.Explain([]byte{1}, req, nil)
	require.NoError(t, err, "no entries is a valid, if useless, value")
	require.Len(t, diffs, 6)
	require.Equal(t, fingerprint.Added, diffs[0].Change)

	fp, err := fingerprint.Compute(req, &fingerprint.Options{Diagnostics: true})
	require.NoError(t, err)
	req.Body = []byte(`{`)
	_, err = fingerprint.Explain(fp.Diagnostics, req, nil)
	require.ErrorIs(t, err, fingerprint.ErrInvalidBody)
}
