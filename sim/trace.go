package sim

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// A Trace is the lines a run logged, each stamped with the virtual time:
// what a failing seed prints, so that its run can be read step by step
// (and replayed: the seed alone makes the same run).
type Trace struct {
	mu    sync.Mutex
	start time.Time
	lines []string
}

func (t *Trace) add(now time.Time, line string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.start.IsZero() {
		t.start = now
	}
	t.lines = append(t.lines, fmt.Sprintf("%10.3fs  %s", now.Sub(t.start).Seconds(), line))
}

// Len is the number of lines.
func (t *Trace) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.lines)
}

// WriteTo writes the last n lines (n <= 0: all of them) to out.
func (t *Trace) WriteTo(out io.Writer, n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	lines := t.lines
	if n > 0 && len(lines) > n {
		fmt.Fprintf(out, "... %d earlier lines ...\n", len(lines)-n)
		lines = lines[len(lines)-n:]
	}
	for _, l := range lines {
		fmt.Fprintln(out, l)
	}
}
