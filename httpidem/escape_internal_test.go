package httpidem

import "testing"

func TestNormalizeEscapes(t *testing.T) {
	for in, want := range map[string]string{
		"pay_A/refunds":  "pay_A/refunds",
		"pay_%41":        "pay_A",
		"%7e%2d%2E%5F":   "~-._",
		"a%2fb":          "a%2Fb", // an escaped "/" stays one
		"a%2Fb":          "a%2Fb",
		"%c3%a9":         "%C3%A9",
		"%":              "%",
		"%4":             "%4",
		"%zz%4":          "%zz%4",
		"100%25":         "100%25",
		"x%41%":          "xA%",
		"%%41":           "%A",
		"caf%C3%A9/%41b": "caf%C3%A9/Ab",
	} {
		if got := normalizeEscapes(in); got != want {
			t.Errorf("normalizeEscapes(%q) = %q, want %q", in, got, want)
		}
	}
}
