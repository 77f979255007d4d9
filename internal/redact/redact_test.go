package redact

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestKey(t *testing.T) {
	for _, tc := range []struct{ s, key, want string }{
		{`fenced: token 5 for key "order-4242-jane"`, "order-4242-jane", `fenced: token 5 for key [key H]`},
		{`claim of order-4242-jane failed`, "order-4242-jane", `claim of [key H] failed`},
		{`not found: "a\"b"`, `a"b`, `not found: [key H]`},
		// A short key goes only where it is quoted: the message stays readable.
		{`token 5 for key "k"`, "k", `token 5 for key [key H]`},
		{`token 5 for key k`, "k", `token 5 for key k`},
		{`nothing to hide`, "order-4242-jane", `nothing to hide`},
		{`anything`, "", `anything`},
	} {
		require.Equal(t, tc.want, Key(tc.s, tc.key, "H"), "%q without %q", tc.s, tc.key)
	}
}
