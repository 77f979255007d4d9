package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
)

// WriteJSON writes v, a report, as indented JSON.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// Micros formats a duration given in microseconds for a table; "-" if it
// is not positive.
func Micros(v float64) string {
	switch {
	case v <= 0:
		return "-"
	case v < 10:
		return fmt.Sprintf("%.2fµs", v)
	case v < 1000:
		return fmt.Sprintf("%.0fµs", v)
	case v < 1e6:
		return fmt.Sprintf("%.2fms", v/1e3)
	}
	return fmt.Sprintf("%.2fs", v/1e6)
}

// Count formats a number with thousands separators (25,000), or with M or
// G past ten million.
func Count(v float64) string {
	switch {
	case v >= 1e10:
		return fmt.Sprintf("%.1f G", v/1e9)
	case v >= 1e7:
		return fmt.Sprintf("%.1f M", v/1e6)
	}
	s := fmt.Sprintf("%.0f", v)
	for i := len(s) - 3; i > 0 && s[i-1] != '-'; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// ByteSize formats a byte count in decimal units, as the guide does.
func ByteSize(v float64) string {
	for _, u := range []struct {
		f    float64
		name string
	}{{1e12, "TB"}, {1e9, "GB"}, {1e6, "MB"}, {1e3, "kB"}} {
		if v >= u.f {
			return fmt.Sprintf("%.1f %s", v/u.f, u.name)
		}
	}
	return fmt.Sprintf("%.0f B", v)
}

// Seconds formats a length of time given in seconds: whole hours as
// "24 h", anything else as whole seconds.
func Seconds(v float64) string {
	if v >= 3600 && int(v)%3600 == 0 {
		return fmt.Sprintf("%d h", int(v)/3600)
	}
	return fmt.Sprintf("%.0f s", v)
}

// Median returns the median of v, or 0 if it is empty.
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Sorted(slices.Values(v))
	if len(v)%2 == 0 {
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return v[len(v)/2]
}
