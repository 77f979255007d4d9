package events

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/idemkv/idemkv/bench"
)

// Goals the issue set for events.
const (
	// goalRatio is the least throughput of completions with one event,
	// against without, at goalConcurrency clients.
	goalRatio       = 0.85
	goalConcurrency = 64
	// goalLagP99 is the most p99 lag, commit to PubAck, at goalRate.
	goalLagP99 = 50 * time.Millisecond
	goalRate   = 5000
)

// Report is the result of Run. Its JSON field names are stable.
type Report struct {
	Meta     Meta            `json:"meta"`     // the run, the machine and the options
	Overhead []OverheadPoint `json:"overhead"` // completions with one event against without, by concurrency
	Loads    []Load          `json:"loads"`    // the open-loop loads relayed to JetStream, by rate
	// Drains are the relay draining a backlog (into no broker, into
	// JetStream) and JetStream alone.
	Drains []Drain `json:"drains"`
	// Consumers are the stream's first Backlog messages read by a bare
	// ordered consumer and applied by an inbox consumer.
	Consumers []Consume `json:"consumers"`
	Goals     []Goal    `json:"goals"` // the goals measured by this run, met or not
}

// Goal is one of the goals and what the run measured of it.
type Goal struct {
	Name     string  `json:"name"`     // what is measured
	Measured float64 `json:"measured"` // the figure measured (a ratio, or ms)
	Target   float64 `json:"target"`   // the goal's bound
	Met      bool    `json:"met"`      // whether the figure is within the bound
}

// Meta describes the run: the harness's fields and the options.
type Meta struct {
	bench.Meta
	Concurrency     []int   `json:"concurrency"`      // the overhead sweep's clients per point
	DurationSeconds float64 `json:"duration_seconds"` // how long each side of an overhead point ran, in seconds
	Rounds          int     `json:"rounds"`           // how many times each overhead point was measured
	// Relay says a relay into a publisher that acknowledges at once ran
	// during the overhead points (false: Options.NoRelay, the outbox grew).
	Relay bool `json:"relay"`
	// OneEntity says every event had an empty key (Options.OneEntity).
	OneEntity        bool      `json:"one_entity"`
	Rates            []float64 `json:"rates"`              // the loads' offered rates, completions a second
	LoadSeconds      float64   `json:"load_seconds"`       // how long each load was offered, in seconds
	Clients          int       `json:"clients"`            // the client goroutines of a load
	Backlog          int       `json:"backlog"`            // the events of each drain
	Pipeline         int       `json:"pipeline"`           // the messages in flight of the pipelined JetStream-alone drain
	PayloadBytes     int       `json:"payload_bytes"`      // every event's payload size, in bytes
	JetStreamOnOwnFS bool      `json:"jetstream_own_dir"`  // the broker's store was under Options.JetStreamDir
	FsyncP50US       float64   `json:"fsync_p50_us"`       // the run disk's 4 KiB write + fdatasync, median, in µs
	FsyncP99US       float64   `json:"fsync_p99_us"`       // the same, 99th percentile, in µs
	CompactionNice   int       `json:"compaction_nice"`    // the stores' compaction nice value, 0 for none
	DuplicateWindowS float64   `json:"duplicate_window_s"` // the stream's duplicate window, in seconds
}

// runner carries a run's state.
type runner struct {
	o       *Options
	run     *bench.Run
	streams uint64 // key streams handed out
}

// newStream returns a fresh key stream base: worker w's keys are
// base+1+w. Bases are 1<<20 apart, so no two sides share a key.
func (r *runner) newStream() uint64 {
	r.streams++
	return r.streams << 20
}

// Run runs the measurement o describes (nil: defaults) and returns the
// report. It fails if a store or the relay returns an error or breaks
// the contract (an event missing, duplicated or not published, a
// completed key that does not replay).
func Run(ctx context.Context, opts *Options) (*Report, error) {
	o := opts.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	run, err := bench.Start(&o.Options, "bench events", o.steps())
	if err != nil {
		return nil, err
	}
	defer run.Close()
	r := &runner{o: o, run: run}
	rep := &Report{}
	if rep.Overhead, err = r.overhead(ctx); err != nil {
		return nil, err
	}
	var fsync bench.Latency
	if !o.NoLag {
		if fsync, err = probeFsync(run.Dir("fsync-probe"), o.FsyncSamples); err != nil {
			return nil, err
		}
		if rep.Loads, rep.Drains, rep.Consumers, err = r.lag(ctx); err != nil {
			return nil, err
		}
	}
	rep.Goals = goals(rep)
	rep.Meta = Meta{Meta: run.Meta(), Concurrency: o.Concurrency, DurationSeconds: o.Duration.Seconds(),
		Rounds: o.Rounds, Relay: !o.NoRelay, OneEntity: o.OneEntity, Rates: o.Rates, LoadSeconds: o.LoadDuration.Seconds(),
		Clients: o.Clients, Backlog: o.Backlog, Pipeline: o.Pipeline, PayloadBytes: payloadBytes,
		JetStreamOnOwnFS: o.JetStreamDir != "", FsyncP50US: fsync.P50, FsyncP99US: fsync.P99,
		CompactionNice: o.CompactionNice, DuplicateWindowS: duplicateWindow.Seconds()}
	return rep, nil
}

// lag starts the JetStream server and measures the loads, the drains and
// the consumers.
func (r *runner) lag(ctx context.Context) (loads []Load, drains []Drain, cons []Consume, err error) {
	dir := r.run.Dir("jetstream")
	if r.o.JetStreamDir != "" {
		if dir, err = os.MkdirTemp(r.o.JetStreamDir, "idemkv-bench-events-jetstream-"); err != nil {
			return nil, nil, nil, fmt.Errorf("bench: events: %w", err)
		}
	}
	b, err := startBroker(ctx, dir)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("bench: events: %w", err)
	}
	defer func() {
		if cerr := b.close(); err == nil {
			err = cerr
		}
	}()
	for _, rate := range r.o.Rates {
		ld, err := r.load(ctx, b, rate)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("bench: events: load of %.0f a second: %w", rate, err)
		}
		loads = append(loads, ld)
		r.run.Step(fmt.Sprintf("load %.0f/s", rate))
	}
	if drains, err = r.drains(ctx, b); err != nil {
		return nil, nil, nil, err
	}
	cons, err = r.consumers(ctx, b)
	return loads, drains, cons, err
}

// goals evaluates the goals that rep measured.
func goals(rep *Report) []Goal {
	var gs []Goal
	for _, p := range rep.Overhead {
		if p.Concurrency == goalConcurrency {
			gs = append(gs, Goal{Name: fmt.Sprintf("completions with one event / without, %d clients", goalConcurrency),
				Measured: p.Ratio, Target: goalRatio, Met: p.Ratio >= goalRatio})
		}
	}
	for _, l := range rep.Loads {
		if l.Rate == goalRate {
			p99 := l.Lag.P99 / 1e3
			gs = append(gs, Goal{Name: fmt.Sprintf("p99 lag, commit to PubAck, at %d a second (ms)", goalRate),
				Measured: p99, Target: float64(goalLagP99.Milliseconds()),
				Met: l.Unpublished == 0 && p99 < float64(goalLagP99.Milliseconds())})
		}
	}
	return gs
}

// probeFsync times n 4 KiB writes, each followed by fdatasync, in a file
// at path, which it removes.
func probeFsync(path string, n int) (bench.Latency, error) {
	if n <= 0 {
		return bench.Latency{}, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return bench.Latency{}, err
	}
	f, err := vfs.Default.Create(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		return bench.Latency{}, fmt.Errorf("bench: events: fsync probe: %w", err)
	}
	defer os.Remove(path)
	defer f.Close()
	h := bench.NewHistogram()
	buf := make([]byte, 4096)
	for i := range n {
		buf[0] = byte(i)
		t0 := time.Now()
		if _, err := f.Write(buf); err != nil {
			return bench.Latency{}, fmt.Errorf("bench: events: fsync probe: %w", err)
		}
		if err := f.SyncData(); err != nil {
			return bench.Latency{}, fmt.Errorf("bench: events: fsync probe: %w", err)
		}
		h.Record(time.Since(t0))
	}
	return h.Latency(), nil
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error { return bench.WriteJSON(w, r) }
