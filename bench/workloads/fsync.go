package workloads

import (
	"fmt"
	"os"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/idemkv/idemkv/bench"
)

// FsyncTiming is the measured cost of one durable write on the data disk:
// appends of WriteBytes bytes to a file in the run's directory, each
// followed by fdatasync, half of them before the sweep and half after it.
type FsyncTiming struct {
	Samples    int `json:"samples"`     // the number of appends timed
	WriteBytes int `json:"write_bytes"` // the size of each append, in bytes (4,096)
	// P50US is the median append and fdatasync, in µs. The latency goal
	// "p50 at concurrency 1 ≤ 1.3 × one fsync" compares unique's p50 with
	// it.
	P50US  float64 `json:"p50_us"`
	P99US  float64 `json:"p99_us"`  // the 99th percentile, in µs
	MaxUS  float64 `json:"max_us"`  // the slowest, in µs
	MeanUS float64 `json:"mean_us"` // the mean, in µs
	// StartP50US is the median of the samples taken before the sweep, in
	// µs; far from EndP50US, the disk changed speed during the run, and
	// latency ratios against it are suspect.
	StartP50US float64 `json:"start_p50_us"`
	EndP50US   float64 `json:"end_p50_us"` // the median of the samples taken after the sweep, in µs
}

// fsyncProbe times appends of 4 KiB, each followed by fdatasync, on a file
// in the data directory: the cost of one durable write on this disk. Half
// the samples are taken before the sweep and half after it, so that a disk
// whose speed changes during the run shows it.
type fsyncProbe struct {
	name string
	n    int
	all  *bench.Histogram
	half [2]*bench.Histogram
}

func newFsyncProbe(name string, n int) *fsyncProbe {
	return &fsyncProbe{name: name, n: n, all: bench.NewHistogram(),
		half: [2]*bench.Histogram{bench.NewHistogram(), bench.NewHistogram()}}
}

// run takes the first (half 0) or second (half 1) half of the samples.
func (p *fsyncProbe) run(half int) error {
	n := p.n / 2
	if half == 1 {
		n = p.n - n
	}
	if n <= 0 {
		return nil
	}
	f, err := vfs.Default.Create(p.name, vfs.WriteCategoryUnspecified)
	if err != nil {
		return fmt.Errorf("bench: fsync probe: %w", err)
	}
	defer os.Remove(p.name)
	defer f.Close()
	buf := make([]byte, 4096)
	for i := range n {
		buf[0] = byte(i)
		t0 := time.Now()
		if _, err := f.Write(buf); err != nil {
			return fmt.Errorf("bench: fsync probe: %w", err)
		}
		if err := f.SyncData(); err != nil {
			return fmt.Errorf("bench: fsync probe: %w", err)
		}
		d := time.Since(t0)
		p.all.Record(d)
		p.half[half].Record(d)
	}
	return nil
}

func (p *fsyncProbe) timing() FsyncTiming {
	ft := FsyncTiming{Samples: int(p.all.Count()), WriteBytes: 4096}
	if ft.Samples == 0 {
		return ft
	}
	l := p.all.Latency()
	ft.P50US, ft.P99US, ft.MaxUS, ft.MeanUS = l.P50, l.P99, l.Max, l.Mean
	ft.StartP50US, ft.EndP50US = p.half[0].Latency().P50, p.half[1].Latency().P50
	return ft
}
