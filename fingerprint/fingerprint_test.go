package fingerprint_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fingerprint"
	"github.com/stretchr/testify/require"
)

func payment() fingerprint.Request {
	return fingerprint.Request{
		Tenant: "acct_42", Method: "POST", Route: "/v1/payments",
		Body: []byte(`{"amount":5000,"currency":"USD","card":"tok_123"}`),
	}
}

// TestEncodingV1 rebuilds version 1's encoding by hand from its
// documentation and checks the fingerprint is its hash.
func TestEncodingV1(t *testing.T) {
	req := fingerprint.Request{
		Tenant: "t", Method: "POST", Route: "/r/{id}",
		Params: map[string]string{"id": "7"},
		Header: map[string][]string{"X-A": {"1", "2"}},
		Query:  map[string][]string{"q": {"v"}},
		Body:   []byte(`{"b":1, "a":2}`),
	}
	opts := &fingerprint.Options{Headers: []string{"x-a", "X-B"}, Query: []string{"q"}}
	part := func(kind byte, payload string) string {
		return string(append(binary.AppendUvarint([]byte{kind}, uint64(len(payload))), payload...))
	}
	enc := part(0x01, "t") + part(0x02, "POST") + part(0x03, "/r/{id}") +
		part(0x04, "\x02id\x017") +
		part(0x05, "\x01q\x01\x01v") +
		part(0x06, "\x03x-a\x02\x011\x012") + part(0x06, "\x03x-b\x00") +
		part(0x12, `{"a":2,"b":1}`)
	want := binary.BigEndian.AppendUint64([]byte{1}, xxhash.Sum64String(enc))

	fp, err := fingerprint.Compute(req, opts)
	require.NoError(t, err)
	require.Equal(t, want, fp.Bytes)
	require.Len(t, fp.Bytes, 9)
	require.Equal(t, fmt.Sprintf("%x", want), fp.String())
	require.NoError(t, idemkv.ValidateFingerprint(fp.Bytes))

	// The other body forms.
	for _, tc := range []struct {
		opts fingerprint.Options
		body string
		enc  string
	}{
		{fingerprint.Options{}, "", part(0x10, "")},
		{fingerprint.Options{Mode: fingerprint.ModeRaw}, "", part(0x10, "")},
		{fingerprint.Options{Mode: fingerprint.ModeRaw}, "{ }", part(0x11, "{ }")},
		{fingerprint.Options{Mode: fingerprint.ModeFields, Fields: []string{"/b", "/a", "/c", "/a"}}, `{"a":[1.0],"b":null}`,
			part(0x13, "\x02/a\x01[1]") + part(0x13, "\x02/b\x01null") + part(0x13, "\x02/c\x00")},
	} {
		req := fingerprint.Request{Body: []byte(tc.body)}
		want := binary.BigEndian.AppendUint64([]byte{1}, xxhash.Sum64String(part(1, "")+part(2, "")+part(3, "")+tc.enc))
		fp, err := fingerprint.Compute(req, &tc.opts)
		require.NoError(t, err)
		require.Equal(t, want, fp.Bytes, "%s %q", tc.opts.Mode, tc.body)
	}
}

func TestComputeEquivalence(t *testing.T) {
	fp := func(req fingerprint.Request, opts *fingerprint.Options) string {
		t.Helper()
		f, err := fingerprint.Compute(req, opts)
		require.NoError(t, err)
		return f.String()
	}
	base := payment()
	same := base
	same.Body = []byte(" {\"card\":\"tok_\\u0031\\u00323\" ,\"currency\":\"USD\",\n\"amount\":5e3}")
	require.Equal(t, fp(base, nil), fp(same, nil), "JSON spelling does not matter")
	require.NotEqual(t, fp(base, &fingerprint.Options{Mode: fingerprint.ModeRaw}), fp(same, &fingerprint.Options{Mode: fingerprint.ModeRaw}),
		"in raw mode it does")
	require.NotEqual(t, fp(base, nil), fp(base, &fingerprint.Options{Mode: fingerprint.ModeRaw}), "the mode is covered")

	// Header names match case-insensitively, in the options and in the
	// request; values keep their order.
	h1, h2 := base, base
	h1.Header = map[string][]string{"Api-Version": {"1", "2"}}
	h2.Header = map[string][]string{"API-VERSION": {"1", "2"}}
	o1 := &fingerprint.Options{Headers: []string{"api-version"}}
	o2 := &fingerprint.Options{Headers: []string{"Api-Version", "API-version"}}
	require.Equal(t, fp(h1, o1), fp(h2, o2))
	h2.Header = map[string][]string{"Api-Version": {"2", "1"}}
	require.NotEqual(t, fp(h1, o1), fp(h2, o1))
	h2.Header = map[string][]string{"Api-Version": {"1"}, "api-version": {"2"}} // built by hand
	require.Equal(t, fp(h1, o1), fp(h2, o1))
	h2.Header = map[string][]string{"Api-Version": {"1", "2"}, "Date": {"now"}}
	require.Equal(t, fp(h1, o1), fp(h2, o1), "headers that are not named are not covered")
	require.NotEqual(t, fp(base, nil), fp(base, o1), "a named header is covered even when absent")
	h2.Header = map[string][]string{"\u212apI-Version": {"1", "2"}} // KELVIN SIGN is not 'k'
	require.NotEqual(t, fp(h1, o1), fp(h2, o1))

	// The query: named parameters only, in any order; values in order.
	q1, q2 := base, base
	q1.Query = map[string][]string{"a": {"1"}, "b": {"2"}, "utm": {"x"}}
	q2.Query = map[string][]string{"b": {"2"}, "a": {"1"}}
	oq := &fingerprint.Options{Query: []string{"b", "a"}}
	require.Equal(t, fp(q1, oq), fp(q2, oq))
	require.Equal(t, fp(q1, nil), fp(base, nil), "the query is not covered by default")
	q2.Query = map[string][]string{"b": {"2"}, "a": {"1", "1"}}
	require.NotEqual(t, fp(q1, oq), fp(q2, oq))

	// Fields: only the selected members count.
	of := &fingerprint.Options{Mode: fingerprint.ModeFields, Fields: []string{"/amount", "/currency"}}
	f1, f2 := base, base
	f2.Body = []byte(`{"currency":"USD","amount":5000.0,"card":"tok_999","client_ts":12}`)
	require.Equal(t, fp(f1, of), fp(f2, of))
	f2.Body = []byte(`{"currency":"USD","amount":5001}`)
	require.NotEqual(t, fp(f1, of), fp(f2, of))
	f2.Body = []byte(`{"currency":"USD","amount":5000,"note":null}`)
	f1.Body = []byte(`{"currency":"USD","amount":5000}`)
	on := &fingerprint.Options{Mode: fingerprint.ModeFields, Fields: []string{"/amount", "/currency", "/note"}}
	require.NotEqual(t, fp(f1, on), fp(f2, on), "null is not absent")
}

func TestComputeErrors(t *testing.T) {
	req := payment()
	req.Body = []byte(`{"amount":5000,"amount":6000}`)
	for _, mode := range []fingerprint.Mode{fingerprint.ModeJSON, fingerprint.ModeFields} {
		opts := &fingerprint.Options{Mode: mode}
		if mode == fingerprint.ModeFields {
			opts.Fields = []string{"/currency"}
		}
		_, err := fingerprint.Compute(req, opts)
		require.ErrorIs(t, err, fingerprint.ErrInvalidBody, mode)
		require.ErrorIs(t, err, fingerprint.ErrDuplicateName, mode)
		require.EqualError(t, err, `fingerprint: duplicate member name at offset 15: "amount"`)
		ok, err := fingerprint.Matches([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9}, req, opts)
		require.ErrorIs(t, err, fingerprint.ErrDuplicateName)
		require.False(t, ok)
	}
	_, err := fingerprint.Compute(req, &fingerprint.Options{Mode: fingerprint.ModeRaw})
	require.NoError(t, err, "raw mode does not parse")

	req.Body = make([]byte, fingerprint.DefaultMaxBodySize+1)
	for _, mode := range []fingerprint.Mode{fingerprint.ModeJSON, fingerprint.ModeRaw} {
		_, err = fingerprint.Compute(req, &fingerprint.Options{Mode: mode})
		require.ErrorIs(t, err, fingerprint.ErrTooLarge, mode)
		require.ErrorIs(t, err, fingerprint.ErrInvalidBody, mode)
	}
	req.Body = req.Body[:10]
	_, err = fingerprint.Compute(req, &fingerprint.Options{Mode: fingerprint.ModeRaw, MaxBodySize: 9})
	require.ErrorIs(t, err, fingerprint.ErrTooLarge)
}

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		opts fingerprint.Options
		err  string // "" if valid
	}{
		{fingerprint.Options{}, ""},
		{fingerprint.Options{Mode: fingerprint.ModeFields, Fields: []string{"", "/a", "/a~0~1/0/-"}}, ""},
		{fingerprint.Options{Headers: []string{"Idempotency-Key", "x-api_version"}, Query: []string{"", "a b"}}, ""},
		{fingerprint.Options{Mode: 9}, "unknown Mode 9"},
		{fingerprint.Options{Fields: []string{"/a"}}, "Fields are set but Mode is json"},
		{fingerprint.Options{Mode: fingerprint.ModeRaw, Fields: []string{"/a"}}, "Mode is raw"},
		{fingerprint.Options{Mode: fingerprint.ModeFields}, "no Fields"},
		{fingerprint.Options{Mode: fingerprint.ModeFields, Fields: []string{"a"}}, `"a" is not a JSON Pointer`},
		{fingerprint.Options{Mode: fingerprint.ModeFields, Fields: []string{"/a~2"}}, "'~' must be followed by 0 or 1"},
		{fingerprint.Options{Mode: fingerprint.ModeFields, Fields: []string{"/a~"}}, "'~' must be followed by 0 or 1"},
		{fingerprint.Options{Mode: fingerprint.ModeFields, Fields: []string{"/\xff"}}, "not valid UTF-8"},
		{fingerprint.Options{Headers: []string{"X Y"}}, `"X Y" is not a header name`},
		{fingerprint.Options{Headers: []string{""}}, "not a header name"},
		{fingerprint.Options{Headers: []string{"Name:"}}, "not a header name"},
		{fingerprint.Options{Query: []string{"\xff"}}, "not valid UTF-8"},
		{fingerprint.Options{MaxBodySize: -1}, "MaxBodySize -1 is negative"},
		{fingerprint.Options{MaxDepth: fingerprint.MaxMaxDepth + 1}, "MaxDepth 10001 outside"},
	} {
		err := tc.opts.EnsureDefaults().Validate()
		if tc.err == "" {
			require.NoError(t, err)
			_, err = fingerprint.Compute(fingerprint.Request{}, &tc.opts)
			require.NoError(t, err)
			continue
		}
		require.ErrorIs(t, err, fingerprint.ErrInvalidOptions)
		require.ErrorContains(t, err, tc.err)
		_, err = fingerprint.Compute(payment(), &tc.opts)
		require.ErrorIs(t, err, fingerprint.ErrInvalidOptions)
		require.NotErrorIs(t, err, fingerprint.ErrInvalidBody, "a configuration bug is not the client's")
	}
	o := (*fingerprint.Options)(nil).EnsureDefaults()
	require.Equal(t, fingerprint.DefaultMaxBodySize, o.MaxBodySize)
	require.Equal(t, fingerprint.DefaultMaxDepth, o.MaxDepth)
	require.Equal(t, fingerprint.ModeJSON, o.Mode)

	for _, m := range []fingerprint.Mode{fingerprint.ModeJSON, fingerprint.ModeRaw, fingerprint.ModeFields} {
		got, err := fingerprint.ParseMode(m.String())
		require.NoError(t, err)
		require.Equal(t, m, got)
	}
	_, err := fingerprint.ParseMode("JSON")
	require.ErrorIs(t, err, fingerprint.ErrInvalidOptions)
}

func TestMatches(t *testing.T) {
	req := payment()
	fp, err := fingerprint.Compute(req, nil)
	require.NoError(t, err)
	ok, err := fingerprint.Matches(fp.Bytes, req, nil)
	require.NoError(t, err)
	require.True(t, ok)
	v, err := fingerprint.Version(fp.Bytes)
	require.NoError(t, err)
	require.Equal(t, fingerprint.CurrentVersion, v)

	other := req
	other.Body = []byte(`{"amount":5001,"currency":"USD","card":"tok_123"}`)
	ok, err = fingerprint.Matches(fp.Bytes, other, nil)
	require.NoError(t, err)
	require.False(t, ok)
	ok, err = fingerprint.Matches(fp.Bytes, req, &fingerprint.Options{Mode: fingerprint.ModeRaw})
	require.NoError(t, err)
	require.False(t, ok, "different options, different fingerprint")

	for _, tc := range []struct {
		stored []byte
		err    error
	}{
		{nil, fingerprint.ErrInvalidStored},
		{fp.Bytes[:8], fingerprint.ErrInvalidStored},
		{append(fp.Bytes[:9:9], 0), fingerprint.ErrInvalidStored},
		{[]byte{0, 1, 2, 3, 4, 5, 6, 7, 8}, fingerprint.ErrUnknownVersion},
		{[]byte{2, 1, 2, 3, 4, 5, 6, 7, 8}, fingerprint.ErrUnknownVersion},
		{[]byte("\x01\x0dj\xea\x0b\x92\x9a\xb0\x9f\x00 demo's 17-byte fingerprint"), fingerprint.ErrInvalidStored},
	} {
		ok, err := fingerprint.Matches(tc.stored, req, nil)
		require.ErrorIs(t, err, tc.err, "%x", tc.stored)
		require.False(t, ok)
		_, err = fingerprint.Version(tc.stored)
		require.ErrorIs(t, err, tc.err)
	}
}

func TestSelect(t *testing.T) {
	opts := &fingerprint.Options{Mode: fingerprint.ModeFields, Fields: []string{"/items/1/sku", "/a~1b", "/none", "", "/items/1/sku"}}
	fields, err := fingerprint.Select([]byte(`{"items":[{"sku":"x"},{"sku":"y", "n":1e2}],"a/b":[ 1.0 ]}`), opts)
	require.NoError(t, err)
	require.Equal(t, []fingerprint.Field{
		{Pointer: "", Value: []byte(`{"a/b":[1],"items":[{"sku":"x"},{"n":100,"sku":"y"}]}`)},
		{Pointer: "/a~1b", Value: []byte(`[1]`)},
		{Pointer: "/items/1/sku", Value: []byte(`"y"`)},
		{Pointer: "/none"},
	}, fields)

	fields, err = fingerprint.Select(nil, opts)
	require.NoError(t, err)
	require.Len(t, fields, 4)
	for _, f := range fields {
		require.Nil(t, f.Value)
	}
	_, err = fingerprint.Select([]byte(`{`), opts)
	require.ErrorIs(t, err, fingerprint.ErrMalformed)
	_, err = fingerprint.Select([]byte(`{}`), nil)
	require.ErrorIs(t, err, fingerprint.ErrInvalidOptions)
}

// TestPointers evaluates JSON Pointers against RFC 6901's own example
// document (section 5).
func TestPointers(t *testing.T) {
	doc := `{"foo": ["bar", "baz"], "": 0, "a/b": 1, "c%d": 2, "e^f": 3, "g|h": 4,
		"i\\j": 5, "k\"l": 6, " ": 7, "m~n": 8}`
	for ptr, want := range map[string]string{
		"":       `{"":0," ":7,"a/b":1,"c%d":2,"e^f":3,"foo":["bar","baz"],"g|h":4,"i\\j":5,"k\"l":6,"m~n":8}`,
		"/foo":   `["bar","baz"]`,
		"/foo/0": `"bar"`,
		"/":      `0`,
		"/a~1b":  `1`,
		"/c%d":   `2`,
		"/e^f":   `3`,
		"/g|h":   `4`,
		"/i\\j":  `5`,
		"/k\"l":  `6`,
		"/ ":     `7`,
		"/m~0n":  `8`,
		// Nothing selected:
		"/foo/2": "", "/foo/-": "", "/foo/00": "", "/foo/+1": "", "/foo/0/x": "",
		"/a/b": "", "/nope": "", "/foo/": "", "/m~1n": "",
	} {
		fields, err := fingerprint.Select([]byte(doc), &fingerprint.Options{Mode: fingerprint.ModeFields, Fields: []string{ptr}})
		require.NoError(t, err, ptr)
		require.Equal(t, want, string(fields[0].Value), "pointer %q", ptr)
		require.Equal(t, want == "", fields[0].Value == nil, "pointer %q", ptr)
	}
}

// TestConcurrent computes fingerprints from many goroutines (the pooled
// buffers must not leak between them); run it with -race.
func TestConcurrent(t *testing.T) {
	reqs := []fingerprint.Request{payment(), {Tenant: "x", Body: []byte(`[1,{"b":2,"a":[3]}]`)}, {Body: []byte(`"s"`)}}
	opts := &fingerprint.Options{Diagnostics: true}
	want := make([]fingerprint.FP, len(reqs))
	for i, r := range reqs {
		var err error
		want[i], err = fingerprint.Compute(r, opts)
		require.NoError(t, err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				k := (g + i) % len(reqs)
				got, err := fingerprint.Compute(reqs[k], opts)
				if err == nil && (string(got.Bytes) != string(want[k].Bytes) || string(got.Diagnostics) != string(want[k].Diagnostics)) {
					err = fmt.Errorf("request %d: got %x, want %x", k, got.Bytes, want[k].Bytes)
				}
				if err == nil {
					_, err = fingerprint.Canonical([]byte(`{"z":1,"y":[2,3]}`), nil)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	require.NoError(t, errors.Join(func() (es []error) {
		for e := range errs {
			es = append(es, e)
		}
		return
	}()...))
}

func TestBodyErrorMessage(t *testing.T) {
	_, err := fingerprint.Compute(fingerprint.Request{Body: []byte(`{"amount": 50x}`)}, nil)
	var be *fingerprint.BodyError
	require.ErrorAs(t, err, &be)
	require.Equal(t, 13, be.Offset)
	require.EqualError(t, err, "fingerprint: malformed JSON at offset 13: invalid character 'x' after an object member (want ',' or '}')")
	require.True(t, strings.HasPrefix(be.Error(), fingerprint.ErrMalformed.Error()))
}
