package fingerprint_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/idemkv/idemkv/fingerprint"
)

var fuzzSeeds = []string{
	``, ` `, `null`, `true`, `false`, `0`, `-0`, `1.0`, `1e21`, `1E-7`, `-1.5e-9`, `5e-324`, `1e400`, `1e-400`,
	`123456789012345678901234567890`, `0.1e1`, `10e-1`, `01`, `1.`, `.5`, `-`, `+1`, `NaN`,
	`""`, `"\u0000\u001f\u007f"`, `"\ud83d\ude00"`, `"\ud800"`, `"\udc00\ud800"`, `"\/\b\f\n\r\t\"\\"`,
	"\"\xff\"", "\"\xed\xa0\x80\"", "\xef\xbb\xbf{}", "\"\t\"",
	`[]`, `{}`, `[1,[2,[3]]]`, `[1,]`, `{"a":1,}`, `{"a" 1}`,
	`{"b":1,"a":2}`, `{"a":1,"a":2}`, `{"a":1,"\u0061":2}`, `{"\uff61":1,"😀":2,"a":3}`,
	`{"numbers":[333333333.33333329,1E30,4.50,2e-3,0.000000000000000000000000001],"string":"\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/","literals":[null,true,false]}`,
	`{"amount":5000,"currency":"USD","card":"tok_123","meta":{"z":[{"y":1,"x":2}],"a":null}}`,
	strings.Repeat("[", 64) + strings.Repeat("]", 64),
	strings.Repeat("[", 65) + strings.Repeat("]", 65),
	strings.Repeat(`{"a":`, 10) + "1" + strings.Repeat("}", 10),
}

// FuzzCanonical checks the canonicalizer on any input: it never panics,
// never accepts what encoding/json rejects, and what it accepts it turns
// into valid JSON that means the same and is its own canonical form.
func FuzzCanonical(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := fingerprint.Canonical(in, nil)
		if err != nil {
			var be *fingerprint.BodyError
			if !errors.As(err, &be) || !errors.Is(err, fingerprint.ErrInvalidBody) {
				t.Fatalf("%q: error %v is not a *BodyError", in, err)
			}
			if be.Offset < 0 || be.Offset > len(in) {
				t.Fatalf("%q: offset %d outside the input", in, be.Offset)
			}
			// Where encoding/json accepts the text, only what JCS adds may
			// reject it.
			if json.Valid(in) && !errors.Is(err, fingerprint.ErrDuplicateName) && !errors.Is(err, fingerprint.ErrInvalidUnicode) &&
				!errors.Is(err, fingerprint.ErrNumberRange) && !errors.Is(err, fingerprint.ErrInexactNumber) &&
				!errors.Is(err, fingerprint.ErrTooDeep) {
				t.Fatalf("%q: valid JSON rejected: %v", in, err)
			}
			return
		}
		if !json.Valid(in) {
			t.Fatalf("%q: accepted, but it is not JSON", in)
		}
		if !json.Valid(out) || !utf8.Valid(out) {
			t.Fatalf("%q: output %q is not valid JSON", in, out)
		}
		again, err := fingerprint.Canonical(out, nil)
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("%q: canonicalizing %q again gave %q, %v", in, out, again, err)
		}
		var a, b any
		if err := json.Unmarshal(in, &a); err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		if err := json.Unmarshal(out, &b); err != nil {
			t.Fatalf("%q: %v", out, err)
		}
		if !equalJSON(a, b) {
			t.Fatalf("%q and its canonical form %q mean different things", in, out)
		}
		sel, err := fingerprint.Select(in, &fingerprint.Options{Mode: fingerprint.ModeFields, Fields: []string{""}})
		if err != nil || !bytes.Equal(sel[0].Value, out) {
			t.Fatalf("%q: the pointer \"\" selected %q, %v; want %q", in, sel[0].Value, err, out)
		}
	})
}

// FuzzSelect evaluates any pointer on any body: no panics, and a selected
// value is canonical JSON.
func FuzzSelect(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s), "/a")
	}
	f.Add([]byte(`{"a/b":[0,{"~":1}],"":2}`), "/a~1b/1/~0")
	f.Add([]byte(`{"":{"":3}}`), "//")
	f.Add([]byte(`[[1],[2,3]]`), "/1/1")
	f.Fuzz(func(t *testing.T, body []byte, ptr string) {
		fields, err := fingerprint.Select(body, &fingerprint.Options{Mode: fingerprint.ModeFields, Fields: []string{ptr}})
		if err != nil {
			if !errors.Is(err, fingerprint.ErrInvalidBody) && !errors.Is(err, fingerprint.ErrInvalidOptions) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		if v := fields[0].Value; v != nil {
			if c, err := fingerprint.Canonical(v, nil); err != nil || !bytes.Equal(c, v) {
				t.Fatalf("%q selected %q from %q, which is not canonical: %q, %v", ptr, v, body, c, err)
			}
		}
	})
}

// FuzzStored feeds arbitrary bytes where a stored fingerprint or
// diagnostics value belongs: no panics, only the documented errors.
func FuzzStored(f *testing.F) {
	req := payment()
	fp, err := fingerprint.Compute(req, &fingerprint.Options{Diagnostics: true})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(fp.Bytes)
	f.Add(fp.Diagnostics)
	f.Add([]byte{})
	f.Add([]byte{1})
	f.Add([]byte{1, 4, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Add([]byte{1, 8, 2, '/', 'a', 1, 2, 3, 4, 7, 9, 9, 9, 9})
	f.Add([]byte{2, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, stored []byte) {
		expected := func(err error) {
			if err != nil && !errors.Is(err, fingerprint.ErrInvalidStored) && !errors.Is(err, fingerprint.ErrUnknownVersion) {
				t.Fatalf("%x: unexpected error %v", stored, err)
			}
		}
		ok, err := fingerprint.Matches(stored, req, nil)
		expected(err)
		if ok != bytes.Equal(stored, fp.Bytes) {
			t.Fatalf("Matches(%x) = %v", stored, ok)
		}
		_, err = fingerprint.Version(stored)
		expected(err)
		diffs, err := fingerprint.Explain(stored, req, nil)
		expected(err)
		if bytes.Equal(stored, fp.Diagnostics) && (err != nil || len(diffs) != 0) {
			t.Fatalf("Explain of the request's own diagnostics: %v, %v", diffs, err)
		}
	})
}
