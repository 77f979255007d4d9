package inbox

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
)

// FuzzIdentify: every message has a mark whose key the store accepts and
// whose fingerprint it accepts, in the form its id calls for, and the
// same message always has the same mark.
func FuzzIdentify(f *testing.F) {
	f.Add("ev-1", "payments.created", []byte(`{"a":1}`))
	f.Add("", "payments.created", []byte(`{ "b": [1, 2.0], "a": "x" }`))
	f.Add("", "", []byte{})
	f.Add(strings.Repeat("z", 300), "s", []byte("\xff"))
	f.Add("caf\u00e9", "s", []byte(`9007199254740993`))
	f.Fuzz(func(t *testing.T, id, subject string, data []byte) {
		m := Message{ID: id, Subject: subject, Data: data}
		ev, err := identify(&m)
		require.NoError(t, err)
		require.NoError(t, idemkv.ValidateKey(ev.key))
		require.NoError(t, idemkv.ValidateFingerprint(ev.fp))
		switch {
		case id == "":
			require.True(t, strings.HasPrefix(ev.key, "sha256/"))
		case strings.HasPrefix(ev.key, "id/"):
			require.Equal(t, "id/"+id, ev.key)
		default:
			require.True(t, strings.HasPrefix(ev.key, "id-sha256/"))
			require.Error(t, idemkv.ValidateKey("id/"+id))
		}
		again, err := identify(&Message{ID: id, Subject: subject, Data: append([]byte(nil), data...)})
		require.NoError(t, err)
		require.Equal(t, ev, again)
	})
}

// TestContentKey: JSON payloads are compared in canonical form, others
// byte for byte, and the subject counts.
func TestContentKey(t *testing.T) {
	key := func(subject, data string) string {
		ev, err := identify(&Message{Subject: subject, Data: []byte(data)})
		require.NoError(t, err)
		return ev.key
	}
	require.Equal(t, key("s", `{"a":1,"b":[true,null]}`), key("s", "{ \"b\": [true, null],\n \"a\": 1.0 }"))
	require.NotEqual(t, key("s", `{"a":1}`), key("s", `{"a":2}`))
	require.NotEqual(t, key("s", `{"a":1}`), key("t", `{"a":1}`))
	// The subject's length is hashed before it, so the boundary between
	// subject and payload cannot move.
	require.NotEqual(t, key("ab", `c`), key("a", `bc`))
	// Beyond 2^53 JSON canonical form refuses a number: byte for byte.
	require.NotEqual(t, key("s", `{"id":9007199254740993}`), key("s", `{"id":9007199254740992}`))
	require.NotEqual(t, key("s", `{"id":9007199254740993}`), key("s", `{"id": 9007199254740993}`))
	require.Equal(t, key("s", "not json"), key("s", "not json"))
	require.NotEqual(t, key("s", ""), key("s", `""`))
}

func FuzzParsePosition(f *testing.F) {
	for _, s := range []string{"0", "1", "18446744073709551615", "18446744073709551616", "07", "-1", "+1", "", " 1", "1e3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := parsePosition("c", []byte(s))
		if err != nil {
			return
		}
		require.Equal(t, s, strconv.FormatUint(p, 10), "only the canonical spelling is accepted")
	})
}
