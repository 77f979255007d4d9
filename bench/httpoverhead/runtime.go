package httpoverhead

import (
	"math"
	"runtime/metrics"
)

// RuntimeFigures are what Go's runtime measured over a target's slices:
// how long goroutines waited, runnable, for a core, and the garbage
// collector's work. On a machine whose cores the load generator shares
// with the servers, a latency tail that the scheduler's wait also shows is
// CPU contention, not the disk.
type RuntimeFigures struct {
	// SchedLatencyUS is the time goroutines spent runnable before running
	// (runtime/metrics /sched/latencies:seconds), p50, p99 and p99.9, in
	// µs: each the upper bound of the runtime's histogram bucket holding
	// that quantile.
	SchedLatencyUS struct {
		P50  float64 `json:"p50"`  // the median wait, in µs
		P99  float64 `json:"p99"`  // the 99th percentile, in µs
		P999 float64 `json:"p999"` // the 99.9th percentile, in µs
	} `json:"sched_latency_us"`
	GCCycles uint64 `json:"gc_cycles"` // the number of completed collections
	// GCCPUSecondsPerRequest is the collector's CPU time (mark assists,
	// background marking and pauses) per request, in seconds.
	GCCPUSecondsPerRequest float64 `json:"gc_cpu_seconds_per_request"`
}

const (
	metricSchedLatency = "/sched/latencies:seconds"
	metricGCCycles     = "/gc/cycles/total:gc-cycles"
	metricGCCPU        = "/cpu/classes/gc/total:cpu-seconds"
)

// runtimeSample is one reading of the metrics RuntimeFigures uses.
type runtimeSample [3]metrics.Sample

func readRuntime() *runtimeSample {
	s := &runtimeSample{{Name: metricSchedLatency}, {Name: metricGCCycles}, {Name: metricGCCPU}}
	metrics.Read(s[:])
	return s
}

// runtimeDelta accumulates the growth of the runtime's metrics over the
// measured slices of one target.
type runtimeDelta struct {
	buckets  []float64 // of the scheduler latency histogram, seconds
	counts   []uint64
	gcCycles uint64
	gcCPU    float64
}

// add adds the growth from s0 to s1. A metric this Go does not have is
// left out.
func (d *runtimeDelta) add(s0, s1 *runtimeSample) {
	if s0[0].Value.Kind() == metrics.KindFloat64Histogram && s1[0].Value.Kind() == metrics.KindFloat64Histogram {
		h0, h1 := s0[0].Value.Float64Histogram(), s1[0].Value.Float64Histogram()
		if d.counts == nil {
			d.buckets = h1.Buckets
			d.counts = make([]uint64, len(h1.Counts))
		}
		if len(h0.Counts) == len(d.counts) && len(h1.Counts) == len(d.counts) {
			for i := range d.counts {
				d.counts[i] += h1.Counts[i] - h0.Counts[i]
			}
		}
	}
	if s0[1].Value.Kind() == metrics.KindUint64 && s1[1].Value.Kind() == metrics.KindUint64 {
		d.gcCycles += s1[1].Value.Uint64() - s0[1].Value.Uint64()
	}
	if s0[2].Value.Kind() == metrics.KindFloat64 && s1[2].Value.Kind() == metrics.KindFloat64 {
		d.gcCPU += s1[2].Value.Float64() - s0[2].Value.Float64()
	}
}

// quantileUS returns the upper bound, in µs, of the bucket holding
// quantile q of the accumulated scheduler latencies; a quantile in the
// last, unbounded bucket reports that bucket's lower bound.
func (d *runtimeDelta) quantileUS(q float64) float64 {
	var total uint64
	for _, c := range d.counts {
		total += c
	}
	if total == 0 {
		return 0
	}
	want := uint64(math.Ceil(q * float64(total)))
	var sum uint64
	for i, c := range d.counts {
		sum += c
		if sum >= want {
			hi := d.buckets[i+1]
			if math.IsInf(hi, 1) {
				hi = d.buckets[i]
			}
			return hi * 1e6
		}
	}
	return 0
}

func (d *runtimeDelta) figures(requests int64) RuntimeFigures {
	var f RuntimeFigures
	f.SchedLatencyUS.P50 = d.quantileUS(0.5)
	f.SchedLatencyUS.P99 = d.quantileUS(0.99)
	f.SchedLatencyUS.P999 = d.quantileUS(0.999)
	f.GCCycles = d.gcCycles
	if requests > 0 {
		f.GCCPUSecondsPerRequest = d.gcCPU / float64(requests)
	}
	return f
}
