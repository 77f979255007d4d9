package httpidem

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"
)

// FuzzParseKey: any header value parses to a valid key or to a typed
// error, never a panic; a parsed key survives quoting as an sf-string.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{`"8e03978e-40d5"`, `abc`, `"a\"b\\c"`, `""`, `"a";p=1`, `a, b`, `"abc`, "\t\"x\" ", "cl\xc3\xa9"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		key, err := ParseKey([]string{v})
		if err != nil {
			if !errors.Is(err, ErrInvalidKey) {
				t.Fatalf("ParseKey(%q): error %v does not wrap ErrInvalidKey", v, err)
			}
			return
		}
		if key == "" || len(key) > 255 {
			t.Fatalf("ParseKey(%q) = %q: length out of range", v, key)
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x20 || key[i] > 0x7e {
				t.Fatalf("ParseKey(%q) = %q: byte 0x%02x", v, key, key[i])
			}
		}
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
		again, err := ParseKey([]string{quoted})
		if err != nil || again != key {
			t.Fatalf("quoted %q parses to %q, %v; want %q", quoted, again, err, key)
		}
	})
}

// FuzzDecodeEnvelope: any stored bytes decode or fail cleanly, and what
// decodes re-encodes to an envelope that decodes the same, whatever the
// record's pointer.
func FuzzDecodeEnvelope(f *testing.F) {
	f.Add((&envelope{header: [][2]string{{"Content-Type", "application/json"}}, haveBody: true, body: []byte(`{"id":1}`)}).encode(""), "")
	f.Add((&envelope{header: [][2]string{{"Location", "/p/1"}, {"X-Y", "z"}}}).encode("/p/1"), "/p/1")
	f.Add((&envelope{diag: []byte{1, 2, 3}}).encode(""), "")
	f.Add([]byte{1, 0, 0}, "")
	f.Add([]byte{1, 3, 200, 1}, "")
	f.Add([]byte{2, 0, 1, 3, 1}, "")
	f.Fuzz(func(t *testing.T, b []byte, pointer string) {
		e, err := decodeEnvelope(b, pointer)
		if err != nil {
			if !errors.Is(err, errEnvelope) {
				t.Fatalf("error %v does not wrap errEnvelope", err)
			}
			return
		}
		e2, err := decodeEnvelope(e.encode(pointer), pointer)
		if err != nil {
			t.Fatalf("re-encoded envelope does not decode: %v", err)
		}
		if !slices.Equal(e2.header, e.header) || !bytes.Equal(e2.diag, e.diag) || !bytes.Equal(e2.body, e.body) || e2.haveBody != e.haveBody {
			t.Fatalf("round trip changed the envelope: %+v vs %+v", e, e2)
		}
	})
}
