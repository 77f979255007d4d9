package bench

import (
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Latency summarizes a latency distribution, in microseconds. Each
// measurement says what it timed: a store request, an HTTP request from
// sending it to reading the last byte of its response, an fdatasync.
type Latency struct {
	P50  float64 `json:"p50"`  // the median, in µs
	P90  float64 `json:"p90"`  // the 90th percentile, in µs
	P99  float64 `json:"p99"`  // the 99th percentile, in µs
	P999 float64 `json:"p999"` // the 99.9th percentile, in µs
	Max  float64 `json:"max"`  // the slowest, in µs
	Mean float64 `json:"mean"` // the mean, in µs
}

// Minus returns l - m at each percentile.
func (l Latency) Minus(m Latency) Latency {
	return Latency{P50: l.P50 - m.P50, P90: l.P90 - m.P90, P99: l.P99 - m.P99, P999: l.P999 - m.P999,
		Max: l.Max - m.Max, Mean: l.Mean - m.Mean}
}

// histMax is the largest latency a Histogram tells apart: slower ones are
// recorded as a minute.
const histMax = int64(time.Minute)

// A Histogram records latencies from 1 ns to a minute with three
// significant digits (an HDR histogram). It is not safe for concurrent
// use: give each goroutine its own and Merge them.
type Histogram struct{ h *hdrhistogram.Histogram }

// NewHistogram returns an empty histogram.
func NewHistogram() *Histogram { return &Histogram{hdrhistogram.New(1, histMax, 3)} }

// Record adds one latency.
func (h *Histogram) Record(d time.Duration) { _ = h.h.RecordValue(min(max(int64(d), 1), histMax)) }

// Merge adds every latency of from.
func (h *Histogram) Merge(from *Histogram) { h.h.Merge(from.h) }

// Reset empties the histogram.
func (h *Histogram) Reset() { h.h.Reset() }

// Count returns the number of latencies recorded.
func (h *Histogram) Count() int64 { return h.h.TotalCount() }

// Latency summarizes the latencies recorded.
func (h *Histogram) Latency() Latency {
	us := func(q float64) float64 { return float64(h.h.ValueAtQuantile(q)) / 1e3 }
	return Latency{P50: us(50), P90: us(90), P99: us(99), P999: us(99.9),
		Max: float64(h.h.Max()) / 1e3, Mean: h.h.Mean() / 1e3}
}
