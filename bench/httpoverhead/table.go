package httpoverhead

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemkv/idemkv/bench"
)

// WriteTable writes the report for people: each handler's latency, their
// difference, and what the slices, the runtime and the committer show.
func (r *Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	m := &r.Meta
	m.WriteHeader(&b, "bench http")
	if m.CompactionNice > 0 {
		fmt.Fprintf(&b, "compactions at nice %d\n", m.CompactionNice)
	}
	fmt.Fprintf(&b, "%.0f requests/s from %d clients over loopback, %d alternating slices of %v per handler\n\n",
		m.Rate, m.Clients, m.Slices, time.Duration(m.SliceSeconds*float64(time.Second)))
	fmt.Fprintf(&b, "%-11s %9s %9s %9s %9s %9s %9s %9s %11s\n", "handler", "req/s", "p50", "p90", "p99", "p99.9", "max", "mean", "CPU µs/req")
	row := func(name string, rps float64, l bench.Latency, cpu float64, f func(float64) string) {
		rs, cs := "", ""
		if rps > 0 {
			rs = strconv.FormatFloat(rps, 'f', 0, 64)
		}
		if cpu > 0 {
			cs = strconv.FormatFloat(cpu*1e6, 'f', 1, 64)
		}
		fmt.Fprintf(&b, "%-11s %9s %9s %9s %9s %9s %9s %9s %11s\n", name, rs, f(l.P50), f(l.P90), f(l.P99), f(l.P999), f(l.Max), f(l.Mean), cs)
	}
	for _, t := range r.Targets {
		row(t.Name, t.RequestsPerSec, t.Latency, t.CPUSecondsPerRequest, bench.Micros)
	}
	row("overhead", 0, r.Overhead, 0, func(v float64) string {
		if v < 0 {
			return "−" + bench.Micros(-v)
		}
		return "+" + bench.Micros(v)
	})
	fmt.Fprintf(&b, "\np99 of each slice, median (lowest to highest):")
	sep := ""
	for _, t := range r.Targets {
		if len(t.SliceP99US) > 0 {
			fmt.Fprintf(&b, "%s %s %s (%s to %s)", sep, t.Name, bench.Micros(bench.Median(t.SliceP99US)),
				bench.Micros(slices.Min(t.SliceP99US)), bench.Micros(slices.Max(t.SliceP99US)))
			sep = ";"
		}
	}
	fmt.Fprintln(&b)
	for _, t := range r.Targets {
		t.writeSlices(&b)
	}
	for _, t := range r.Targets {
		rt := t.Runtime
		fmt.Fprintf(&b, "%s: goroutines waited for a core p50 %s, p99 %s, p99.9 %s; %d GC cycles, GC CPU %.1f µs/req\n",
			t.Name, bench.Micros(rt.SchedLatencyUS.P50), bench.Micros(rt.SchedLatencyUS.P99), bench.Micros(rt.SchedLatencyUS.P999),
			rt.GCCycles, rt.GCCPUSecondsPerRequest*1e6)
	}
	for _, t := range r.Targets {
		if s := t.CommitFigures.String(); s != "" {
			fmt.Fprintf(&b, "%s: %s\n", t.Name, s)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeSlices writes the flushes in t's slices and how many had a
// compaction running, with the median slice p99 with and without one.
func (t *Target) writeSlices(w io.Writer) {
	if len(t.SliceBackground) != len(t.SliceP99US) || len(t.SliceP99US) == 0 {
		return
	}
	var with, without []float64
	var flushes int64
	for i, bg := range t.SliceBackground {
		flushes += bg.Flushes
		if bg.compacted() {
			with = append(with, t.SliceP99US[i])
		} else {
			without = append(without, t.SliceP99US[i])
		}
	}
	fmt.Fprintf(w, "%s: %d flushes in its slices; %d of %d slices had a compaction running", t.Name, flushes, len(with), len(t.SliceP99US))
	if len(with) > 0 && len(without) > 0 {
		fmt.Fprintf(w, "; slice p99 median %s in those, %s in the others", bench.Micros(bench.Median(with)), bench.Micros(bench.Median(without)))
	}
	fmt.Fprintln(w)
}
