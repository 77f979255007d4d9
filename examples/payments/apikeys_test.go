package payments

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseAPIKeys(t *testing.T) {
	k, err := ParseAPIKeys(strings.NewReader("# comment\n\nsk_0123456789abcdef acct_1\n\tsk_fedcba9876543210\tacct-2 \n"))
	require.NoError(t, err)
	for secret, want := range map[string]string{"sk_0123456789abcdef": "acct_1", "sk_fedcba9876543210": "acct-2"} {
		got, ok := k.Account(secret)
		require.True(t, ok)
		require.Equal(t, want, got)
	}
	for _, token := range []string{"", "acct_1", "sk_0123456789abcde", "sk_0123456789abcdef "} {
		_, ok := k.Account(token)
		require.False(t, ok, "%q", token)
	}

	for in, want := range map[string]string{
		"":                             "no keys",
		"sk_0123456789abcdef":          "want SECRET ACCOUNT",
		"short acct":                   "at least 16",
		"sk_0123456789abcdef acct\xe9": "only letters",
		"sk_0123456789abcdef a b":      "want SECRET ACCOUNT",
		"sk_0123456789abcdef a\nsk_0123456789abcdef b": "given twice",
	} {
		_, err := ParseAPIKeys(strings.NewReader(in))
		require.ErrorContains(t, err, want, "%q", in)
	}
}
