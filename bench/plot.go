package bench

import (
	"fmt"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// NewPlot returns a chart with the harness's look: a title, axis labels, a
// grid, and the legend in the top left corner (curves rise to the right,
// so that is the emptiest).
func NewPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = x
	p.Y.Label.Text = y
	p.Legend.Top, p.Legend.Left = true, true
	p.Add(plotter.NewGrid())
	return p
}

// SavePlot writes p as a PNG file named name into dir, creating dir if
// needed, and returns the file's path.
func SavePlot(p *plot.Plot, dir, name string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("bench: plot: %w", err)
	}
	f := filepath.Join(dir, name)
	if err := p.Save(16*vg.Centimeter, 10*vg.Centimeter, f); err != nil {
		return "", fmt.Errorf("bench: plot: %w", err)
	}
	return f, nil
}

// CountTicks are plot.DefaultTicks labelled as Count labels numbers in
// tables: 25,000.
type CountTicks struct{}

// Ticks implements plot.Ticker.
func (CountTicks) Ticks(lo, hi float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ticks {
		if ticks[i].Label != "" {
			ticks[i].Label = Count(ticks[i].Value)
		}
	}
	return ticks
}
