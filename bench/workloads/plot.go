package workloads

import (
	"fmt"
	"math"
	"slices"
	"strconv"

	"github.com/idemkv/idemkv/bench"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Plot writes PNG charts of the report into dir (created if needed), two
// per workload:
//
//   - throughput-WORKLOAD.png: requests/s against concurrency, one line per
//     target.
//   - latency-WORKLOAD.png: p50, p99 and p99.9 latency against concurrency
//     (log scale), one colour per target, one dash pattern per percentile.
//
// It returns the files written.
func (r *Report) Plot(dir string) ([]string, error) {
	var files []string
	for _, wl := range r.workloads() {
		for name, chart := range map[string]func(string) (*plot.Plot, error){"throughput": r.throughputPlot, "latency": r.latencyPlot} {
			p, err := chart(wl)
			if err != nil {
				return files, fmt.Errorf("bench: plot: %w", err)
			}
			f, err := bench.SavePlot(p, dir, name+"-"+wl+".png")
			if err != nil {
				return files, err
			}
			files = append(files, f)
		}
	}
	slices.Sort(files)
	return files, nil
}

// workloads returns the workloads measured, in run order.
func (r *Report) workloads() []string {
	var out []string
	for _, p := range r.Points {
		if !slices.Contains(out, p.Workload) {
			out = append(out, p.Workload)
		}
	}
	return out
}

// targets returns the targets measured on wl, in run order.
func (r *Report) targets(wl string) []string {
	var out []string
	for _, p := range r.Points {
		if p.Workload == wl && !slices.Contains(out, p.Target) {
			out = append(out, p.Target)
		}
	}
	return out
}

// series returns (concurrency, f(point)) for one workload and target.
func (r *Report) series(wl, target string, f func(Point) float64) plotter.XYs {
	var xys plotter.XYs
	for _, p := range r.Points {
		if p.Workload == wl && p.Target == target {
			xys = append(xys, plotter.XY{X: float64(p.Concurrency), Y: f(p)})
		}
	}
	return xys
}

// newPlot returns a chart of wl titled "WORKLOAD: what" against
// concurrency, on a log scale ticked at the concurrencies measured.
func (r *Report) newPlot(wl, what, ylabel string) *plot.Plot {
	p := bench.NewPlot(wl+": "+what, "concurrent clients", ylabel)
	var conc []float64
	for _, pt := range r.Points {
		if pt.Workload == wl && !slices.Contains(conc, float64(pt.Concurrency)) {
			conc = append(conc, float64(pt.Concurrency))
		}
	}
	slices.Sort(conc)
	var ticks plot.ConstantTicks
	for _, c := range conc {
		ticks = append(ticks, plot.Tick{Value: c, Label: strconv.FormatFloat(c, 'f', -1, 64)})
	}
	p.X.Tick.Marker = ticks
	if len(conc) > 0 && conc[0] > 0 && conc[len(conc)-1] > conc[0] {
		p.X.Scale = plot.LogScale{}
		p.X.Min, p.X.Max = conc[0]/1.3, conc[len(conc)-1]*1.3
	} else if len(conc) > 0 {
		p.X.Min, p.X.Max = conc[0]-1, conc[len(conc)-1]+1
	}
	return p
}

func (r *Report) throughputPlot(wl string) (*plot.Plot, error) {
	p := r.newPlot(wl, "throughput", "requests/s")
	p.Y.Min = 0
	p.Y.Tick.Marker = bench.CountTicks{}
	for i, t := range r.targets(wl) {
		l, pts, err := plotter.NewLinePoints(r.series(wl, t, func(p Point) float64 { return p.RequestsPerSec }))
		if err != nil {
			return nil, err
		}
		l.Color, pts.Color = plotutil.Color(i), plotutil.Color(i)
		pts.Shape = plotutil.Shape(i)
		p.Add(l, pts)
		p.Legend.Add(t, l, pts)
	}
	return p, nil
}

func (r *Report) latencyPlot(wl string) (*plot.Plot, error) {
	p := r.newPlot(wl, "latency", "latency (µs)")
	percentiles := []struct {
		name string
		f    func(Point) float64
	}{
		{"p50", func(p Point) float64 { return p.Latency.P50 }},
		{"p99", func(p Point) float64 { return p.Latency.P99 }},
		{"p99.9", func(p Point) float64 { return p.Latency.P999 }},
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for i, t := range r.targets(wl) {
		for j, pc := range percentiles {
			xys := r.series(wl, t, pc.f)
			for _, xy := range xys {
				lo, hi = min(lo, xy.Y), max(hi, xy.Y)
			}
			l, err := plotter.NewLine(xys)
			if err != nil {
				return nil, err
			}
			l.Color = plotutil.Color(i)
			l.Dashes = plotutil.Dashes(j)
			l.Width = vg.Points(1.5)
			p.Add(l)
			p.Legend.Add(t+" "+pc.name, l)
		}
	}
	if lo > 0 && hi >= lo {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
		p.Y.Min, p.Y.Max = lo/1.5, hi*1.5
	}
	return p, nil
}
