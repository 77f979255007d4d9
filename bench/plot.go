package bench

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"

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
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("bench: plot: %w", err)
	}
	var files []string
	for _, wl := range r.workloads() {
		targets := r.targets(wl)
		tp, err := r.throughputPlot(wl, targets)
		if err != nil {
			return files, err
		}
		lp, err := r.latencyPlot(wl, targets)
		if err != nil {
			return files, err
		}
		for name, p := range map[string]*plot.Plot{"throughput": tp, "latency": lp} {
			f := filepath.Join(dir, name+"-"+wl+".png")
			if err := p.Save(16*vg.Centimeter, 10*vg.Centimeter, f); err != nil {
				return files, fmt.Errorf("bench: plot: %w", err)
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

func (r *Report) newPlot(wl, title, ylabel string) *plot.Plot {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s: %s", wl, title)
	p.X.Label.Text = "concurrent clients"
	p.Y.Label.Text = ylabel
	// Curves rise to the right: the top left is the emptiest corner.
	p.Legend.Top, p.Legend.Left = true, true
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
	p.Add(plotter.NewGrid())
	return p
}

func (r *Report) throughputPlot(wl string, targets []string) (*plot.Plot, error) {
	p := r.newPlot(wl, "throughput", "requests/s")
	p.Y.Min = 0
	p.Y.Tick.Marker = countTicks{}
	for i, t := range targets {
		xys := r.series(wl, t, func(p Point) float64 { return p.RequestsPerSec })
		l, pts, err := plotter.NewLinePoints(xys)
		if err != nil {
			return nil, fmt.Errorf("bench: plot: %w", err)
		}
		l.Color, pts.Color = plotutil.Color(i), plotutil.Color(i)
		pts.Shape = plotutil.Shape(i)
		p.Add(l, pts)
		p.Legend.Add(t, l, pts)
	}
	return p, nil
}

func (r *Report) latencyPlot(wl string, targets []string) (*plot.Plot, error) {
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
	for i, t := range targets {
		for j, pc := range percentiles {
			xys := r.series(wl, t, pc.f)
			for _, xy := range xys {
				lo, hi = min(lo, xy.Y), max(hi, xy.Y)
			}
			l, err := plotter.NewLine(xys)
			if err != nil {
				return nil, fmt.Errorf("bench: plot: %w", err)
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

// countTicks are plot.DefaultTicks labelled like the table: 25,000.
type countTicks struct{}

func (countTicks) Ticks(lo, hi float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ticks {
		if ticks[i].Label != "" {
			ticks[i].Label = count(ticks[i].Value)
		}
	}
	return ticks
}
