package bench

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// A Run is what every measurement's run has: a temporary directory for its
// stores, its progress, and the metadata of its report.
type Run struct {
	opts        *Options
	dir         string
	start       time.Time
	seq         int // directories handed out
	done, total int
}

// Start starts a run of a measurement named name ("bench http") with
// options o, defaults applied, that will take steps steps: it creates the
// run's temporary directory under o.Dir. Close removes it.
func Start(o *Options, name string, steps int) (*Run, error) {
	dir, err := os.MkdirTemp(o.Dir, "idemkv-"+strings.ReplaceAll(name, " ", "-")+"-")
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	return &Run{opts: o, dir: dir, start: time.Now(), total: steps}, nil
}

// Close removes the run's directory and everything in it.
func (r *Run) Close() error { return os.RemoveAll(r.dir) }

// Dir returns a fresh path in the run's directory, for a store: a name
// that starts with a sequence number, then name.
func (r *Run) Dir(name string) string {
	r.seq++
	return filepath.Join(r.dir, fmt.Sprintf("%03d-%s", r.seq, name))
}

// Step reports that the step named name has finished.
func (r *Run) Step(name string) {
	r.done++
	if r.opts.Progress != nil {
		r.opts.Progress(Progress{Done: r.done, Total: r.total, Step: name})
	}
}

// Meta describes the run and the machine, as of now.
func (r *Run) Meta() Meta {
	return Meta{
		Date: r.start.UTC().Format(time.RFC3339), GoVersion: runtime.Version(), GOOS: runtime.GOOS,
		GOARCH: runtime.GOARCH, CPUModel: cpuModel(), NumCPU: runtime.NumCPU(),
		GOMAXPROCS: runtime.GOMAXPROCS(0), Profile: r.opts.Profile,
		WallSeconds: time.Since(r.start).Seconds(),
	}
}

// Meta describes a run and the machine it ran on. Every report's meta
// object has these fields, and its measurement's own.
type Meta struct {
	Date      string `json:"date"`       // the start of the run, RFC 3339, UTC
	GoVersion string `json:"go_version"` // the Go toolchain the harness was built with
	GOOS      string `json:"goos"`       // the operating system
	GOARCH    string `json:"goarch"`     // the architecture
	// CPUModel is the CPU's model name from /proc/cpuinfo, or the
	// architecture where there is none.
	CPUModel   string `json:"cpu_model"`
	NumCPU     int    `json:"num_cpu"`    // the number of logical CPUs
	GOMAXPROCS int    `json:"gomaxprocs"` // the Go processors the run had (the scheduler's limit)
	// Profile is "quick", "full", or "custom" when run from Go with no
	// profile.
	Profile     string  `json:"profile"`
	WallSeconds float64 `json:"wall_seconds"` // the wall time of the whole run, in seconds
}

// WriteHeader writes the report's first two lines: the measurement named
// name, the profile, the date and the wall time, then the machine.
func (m *Meta) WriteHeader(w io.Writer, name string) {
	fmt.Fprintf(w, "idemkv %s: profile %s, %s, %.0f s\n", name, m.Profile, m.Date, m.WallSeconds)
	fmt.Fprintf(w, "%s %s/%s, %s, %d CPUs (GOMAXPROCS %d)\n", m.GoVersion, m.GOOS, m.GOARCH, m.CPUModel, m.NumCPU, m.GOMAXPROCS)
}

// cpuModel returns the CPU's model name from /proc/cpuinfo, or the
// architecture where there is none.
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// x86: "model name"; some arm64 kernels: "Model" or "Hardware".
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "model name", "Model", "Hardware":
			if v = strings.TrimSpace(v); v != "" {
				return v
			}
		}
	}
	return runtime.GOARCH
}
