package day

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"

	"github.com/idemkv/idemkv/bench"
)

// A measured phase (a restart with its Check and Backup, an open-loop
// phase, a closed-loop point) runs in the harness's process, or, with
// Options.Child, in a process of its own. The harness's resident memory
// holds what the loads, the Check and the other store's phases left in
// C's allocator; a process that only opens the store and serves it holds
// what a service would, and its figures are the ones to size a node by.

// Phase kinds.
const (
	phaseRestart = "restart"
	phaseOpen    = "open"
	phaseClosed  = "closed"
)

// phaseRequest is one phase, as the harness asks for it.
type phaseRequest struct {
	Kind    string    `json:"kind"`             // phaseRestart, phaseOpen or phaseClosed
	Store   string    `json:"store"`            // its name: "large" or "small"
	Dir     string    `json:"dir"`              // the store's directory
	Records int64     `json:"records"`          // the records it was loaded with
	Clock   time.Time `json:"clock"`            // the store's time when the phase begins
	Stream  uint64    `json:"stream"`           // the phase's traffic stream
	Clients int       `json:"clients"`          // closed loop
	Backup  string    `json:"backup,omitempty"` // restart: where the Backup goes
}

// phaseResult is what the phase measured.
type phaseResult struct {
	Clock     time.Time       `json:"clock"`               // the store's time when the phase ended
	Restart   *RestartFigures `json:"restart,omitempty"`   // a restart's figures
	Phase     *Phase          `json:"phase,omitempty"`     // an open-loop phase's
	Rate      float64         `json:"rate,omitempty"`      // a closed-loop point's
	Error     string          `json:"error,omitempty"`     // why the phase failed
	Violation bool            `json:"violation,omitempty"` // Error is a bench.ErrViolation
}

// phase runs req on s, in this process or in a child, and moves s's clock
// to where the phase left it.
func (s *store) phase(ctx context.Context, o *Options, req phaseRequest, logf func(string, ...any)) (phaseResult, error) {
	req.Store, req.Dir, req.Records, req.Clock = s.name, s.dir, s.records, s.clock.Now()
	var res phaseResult
	var err error
	if len(o.Child) == 0 {
		res, err = runPhase(ctx, o, req, logf)
	} else {
		res, err = runChild(ctx, o, req, logf)
	}
	if err != nil {
		return res, err
	}
	s.clock.base = res.Clock
	switch {
	case req.Kind == phaseRestart && res.Restart == nil, req.Kind == phaseOpen && res.Phase == nil:
		return res, fmt.Errorf("bench day: the %s phase gave no figures", req.Kind)
	}
	// A kept store's time is saved after every phase, so that a run that
	// stops later still leaves the next one its time.
	return res, s.endRun()
}

// runPhase runs one phase on a store of its own, with the clock req gives.
func runPhase(ctx context.Context, o *Options, req phaseRequest, logf func(string, ...any)) (phaseResult, error) {
	s := &store{name: req.Store, records: req.Records, dir: req.Dir}
	s.clock.base = req.Clock
	var res phaseResult
	var err error
	switch req.Kind {
	case phaseRestart:
		var f RestartFigures
		f, err = s.restart(ctx, o, req.Backup, logf)
		res.Restart = &f
	case phaseOpen:
		res.Phase, err = s.openLoop(ctx, o, req.Stream)
	case phaseClosed:
		res.Rate, err = s.closedLoop(ctx, o, req.Clients, req.Stream)
	default:
		err = fmt.Errorf("bench day: unknown phase %q", req.Kind)
	}
	res.Clock = s.clock.Now()
	return res, err
}

// runChild runs req in a child process started with o.Child, which calls
// ServePhase. The child's output goes to o.Log line by line.
func runChild(ctx context.Context, o *Options, req phaseRequest, logf func(string, ...any)) (phaseResult, error) {
	var res phaseResult
	in, err := json.Marshal(req)
	if err != nil {
		return res, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return res, err
	}
	defer r.Close()
	cmd := exec.CommandContext(ctx, o.Child[0], o.Child[1:]...)
	cmd.Stdin = bytes.NewReader(in)
	out := &lineWriter{logf: logf}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.ExtraFiles = []*os.File{w} // the result: file descriptor 3
	if err := cmd.Start(); err != nil {
		w.Close()
		return res, fmt.Errorf("bench day: starting the %s phase's process: %w", req.Kind, err)
	}
	w.Close()
	b, readErr := io.ReadAll(r)
	waitErr := cmd.Wait()
	out.flush()
	if err := json.Unmarshal(b, &res); err != nil {
		return res, fmt.Errorf("bench day: the %s phase's process (%v) gave no result: %w", req.Kind, errors.Join(waitErr, readErr), err)
	}
	if res.Error != "" {
		if res.Violation {
			return res, fmt.Errorf("%w: %s", bench.ErrViolation, res.Error)
		}
		return res, errors.New(res.Error)
	}
	return res, errors.Join(waitErr, readErr)
}

// ServePhase is the child's side of Options.Child: it reads a phase from
// r, runs it with o (the options the harness runs with), and writes what
// it measured to w. A failed phase is written to w too; ServePhase returns
// an error only when it cannot read or write.
func ServePhase(ctx context.Context, opts *Options, r io.Reader, w io.Writer) error {
	o := opts.EnsureDefaults()
	var req phaseRequest
	if err := json.NewDecoder(r).Decode(&req); err != nil {
		return fmt.Errorf("bench day: reading the phase: %w", err)
	}
	defer applyMemoryLimit(o.MemoryLimit)()
	logf := func(format string, args ...any) {
		if o.Log != nil {
			o.Log(fmt.Sprintf(format, args...))
		}
	}
	res, err := runPhase(ctx, o, req, logf)
	if err != nil {
		res.Error, res.Violation = err.Error(), errors.Is(err, bench.ErrViolation)
	}
	// The kernel brings the peak up to date lazily: no reading taken
	// during the phase may exceed it.
	if res.Restart != nil {
		res.Restart.Memory.OwnProcess, res.Restart.Memory.RSSPeak = true, max(peakRSS(), res.Restart.Memory.RSS)
	}
	if p := res.Phase; p != nil {
		p.Memory.OwnProcess, p.Memory.RSSPeak = true, max(peakRSS(), p.Memory.RSS)
		for _, w := range p.Windows {
			p.Memory.RSSPeak = max(p.Memory.RSSPeak, w.RSS)
		}
	}
	return json.NewEncoder(w).Encode(res)
}

// lineWriter passes a child's output on a line at a time.
type lineWriter struct {
	logf func(string, ...any)
	buf  []byte
}

func (l *lineWriter) Write(p []byte) (int, error) {
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		l.logf("  | %s", l.buf[:i])
		l.buf = l.buf[i+1:]
	}
}

func (l *lineWriter) flush() {
	if len(l.buf) > 0 {
		l.logf("  | %s", l.buf)
		l.buf = nil
	}
}
