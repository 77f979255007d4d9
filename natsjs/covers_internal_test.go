package natsjs

import "testing"

func TestCovers(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"a.b", "a.b", true},
		{"a.b", "a.c", false},
		{"a.*", "a.b", true},
		{"a.*", "a.b.c", false},
		{"a.*", "a.*", true},
		{"a.*", "a.>", false},
		{"a.>", "a.b", true},
		{"a.>", "a.b.c", true},
		{"a.>", "a.*", true},
		{"a.>", "a.>", true},
		{"a.>", "a", false},
		{"*.b", "a.b", true},
		{"a.b", "a.*", false},
		{">", "a", true},
		{"a.b.c", "a.b", false},
	} {
		if got := covers(tc.a, tc.b); got != tc.want {
			t.Errorf("covers(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}
