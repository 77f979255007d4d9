package retention

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/idemkv/idemkv/bench"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
)

// WriteTable writes the report for people: each run's size and latency,
// the sweeper's cost, and the extrapolation to the guide's scale.
func (r *Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	m := &r.Meta
	m.WriteHeader(&b, "bench ttl")
	if m.CompactionNice > 0 {
		fmt.Fprintf(&b, "compactions at nice %d\n", m.CompactionNice)
	}
	fmt.Fprintf(&b, "retention %v, %d periods, %.0f requests/s from %d clients, sweeper every %v at %.0f records/s\n\n",
		seconds(m.RetentionSeconds), m.Periods, m.Rate, m.Clients, seconds(m.SweepIntervalSec), m.SweepRate)
	fmt.Fprintf(&b, "%-11s %9s %11s %7s %10s %10s %11s %10s %10s %9s %9s %7s\n", "run", "req/s", "steady live", "spread",
		"peak disk", "steady sst", "B/live key", "p50", "p99", "writeamp", "swept", "held")
	for _, run := range r.Runs {
		fmt.Fprintf(&b, "%-11s %9.0f %11s %6.1f%% %10s %10s %11.1f %10s %10s %9.2f %9d %7d\n", run.Name, run.RequestsPerSec,
			bench.ByteSize(run.SteadyLiveBytes), 100*run.SteadySpread, bench.ByteSize(float64(run.PeakDiskBytes)),
			bench.ByteSize(run.SteadyTableBytes), run.TableBytesPerLiveKey, bench.Micros(run.Latency.P50),
			bench.Micros(run.Latency.P99), run.WriteAmp, run.Swept, run.HeldPastExpiry)
	}
	if sw := r.Runs[0]; sw.LatencyPaused.P99 > 0 {
		fmt.Fprintf(&b, "\nforeground latency while a pass runs: p50 %s, p99 %s; while none does: p50 %s, p99 %s; p99 ratio %.2f×\n",
			bench.Micros(sw.LatencySweeping.P50), bench.Micros(sw.LatencySweeping.P99), bench.Micros(sw.LatencyPaused.P50),
			bench.Micros(sw.LatencyPaused.P99), sw.LatencySweeping.P99/sw.LatencyPaused.P99)
	}
	c := r.Cost
	fmt.Fprintf(&b, "\nsweeper cost (%d records, no rate limit): %.2f CPU ms for a pass with nothing expired, %.2f CPU s per million deleted (%s/s)\n",
		c.Keys, 1e3*c.IdlePassCPUSeconds, c.CPUPerMillionDeleted, bench.Count(c.DeletedPerSec))
	fmt.Fprintf(&b, "space: %s of sstables before, %s after the deleting pass and a compaction, which wrote %.2f bytes per byte deleted\n",
		bench.ByteSize(float64(c.TableBytesBefore)), bench.ByteSize(float64(c.TableBytesAfter)), c.CompactionBytesPerDeletedByte)
	g := r.Guide
	fmt.Fprintf(&b, "\nat the guide's scale (5,000/s, 24 h, default sweeper): %s keys, %.1f B/key, sweep lag %.1f%%, store %s, sweeper %.3f cores (pass %s)\n",
		bench.Count(g.KeysPerDay), g.BytesPerLiveKey, 100*g.SweepLagFraction, bench.ByteSize(g.StoreBytes), g.SweeperCores,
		bench.Seconds(g.PassSeconds))
	_, err := io.WriteString(w, b.String())
	return err
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// Plot writes ttl-disk.png into dir (created if needed): the live bytes
// (live sstables and WAL) and the whole disk usage over time, two lines
// per run. It returns the file written.
func (r *Report) Plot(dir string) (string, error) {
	p := bench.NewPlot(fmt.Sprintf("store size on disk, %.0f req/s, %v retention", r.Meta.Rate, seconds(r.Meta.RetentionSeconds)),
		"seconds", "MB")
	var lines []any
	for _, run := range r.Runs {
		live := make(plotter.XYs, len(run.Samples))
		disk := make(plotter.XYs, len(run.Samples))
		for i, s := range run.Samples {
			live[i] = plotter.XY{X: s.Seconds, Y: float64(s.LiveBytes) / 1e6}
			disk[i] = plotter.XY{X: s.Seconds, Y: float64(s.DiskBytes) / 1e6}
		}
		lines = append(lines, run.Name+" live", live, run.Name+" all files", disk)
	}
	if err := plotutil.AddLines(p, lines...); err != nil {
		return "", fmt.Errorf("bench: plot: %w", err)
	}
	return bench.SavePlot(p, dir, "ttl-disk.png")
}
