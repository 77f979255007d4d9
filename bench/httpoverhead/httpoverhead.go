// Package httpoverhead measures the latency the HTTP middleware (package
// httpidem) adds to a handler, over loopback HTTP: one payment-creating
// handler served twice in the same process, bare and behind the
// middleware, driven in alternating slices at the same request rate. The
// bare handler commits its payment row with its own synced Pebble write;
// the protected one hands the row to the middleware, which commits it
// with the stored response in one synced batch. So both make one durable
// write per request, and the difference is what protection costs: the key
// check, the fingerprint, the claim, the response capture and the record.
// The command `idemkv bench http` runs it.
//
// # Basics
//
//	o, _ := httpoverhead.Profile("quick")
//	rep, err := httpoverhead.Run(ctx, o)
//	rep.WriteTable(os.Stdout)
//
// Each slice drives one handler at Options.Rate from Options.Clients
// keep-alive connections; the first slice of each is a warm-up and not
// measured. Every response must be 201 Created, or the run fails. Per
// slice, the report keeps the p99 and the flushes and compactions both
// stores did, since background work lands in some slices and not others.
//
// # Caveats
//
//   - The load generator shares the machine with both servers: on few
//     cores, part of any latency tail is CPU contention, which the
//     runtime's scheduler latency (Target.Runtime) shows.
package httpoverhead

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/idemkv/idemkv/bench"
)

// Options configure Run. The zero value of every field means the default
// stated on it; Profile returns the standard configurations.
type Options struct {
	// Options are the harness's: directory, engine options (the engine's,
	// and through its Pebble settings the bare handler's store's),
	// compaction priority (both stores), tenants and progress.
	bench.Options
	// Rate is the request rate, requests per second. Default: 5,000, the
	// guide's.
	Rate float64
	// Clients is the number of concurrent clients (keep-alive connections)
	// sharing the rate. Default: 64.
	Clients int
	// Slice is how long each handler is driven at a time. Default: 5 s.
	Slice time.Duration
	// Slices is the number of slices per handler, after one warm-up slice
	// each that is not measured. Default: 4.
	Slices int
}

// profiles are the standard configurations: "quick" (3 slices of 3 s per
// handler, about 25 s) and "full" (6 slices of 10 s, about 2.5 min).
var profiles = map[string]Options{
	"quick": {Options: bench.Options{Profile: "quick"}, Slice: 3 * time.Second, Slices: 3},
	"full":  {Options: bench.Options{Profile: "full"}, Slice: 10 * time.Second, Slices: 6},
}

// Profile returns the standard configuration named name, one of
// bench.Profiles.
func Profile(name string) (*Options, error) { return bench.Profile(name, profiles) }

// EnsureDefaults returns a copy of o (which may be nil) with every zero
// field set to its default.
func (o *Options) EnsureDefaults() *Options {
	var c Options
	if o != nil {
		c = *o
	}
	c.Options = *c.Options.EnsureDefaults()
	c.Engine = c.Engine.EnsureDefaults()
	c.Rate = cmp.Or(c.Rate, 5000)
	c.Clients = cmp.Or(c.Clients, 64)
	c.Slice = cmp.Or(c.Slice, 5*time.Second)
	c.Slices = cmp.Or(c.Slices, 4)
	return &c
}

// Validate reports options Run cannot run.
func (o *Options) Validate() error {
	err := o.Options.Validate()
	if o.Rate < 0 || o.Clients < 0 || o.Slice < 0 || o.Slices < 0 {
		err = errors.Join(err, errors.New("rate, clients, slice and slices must be positive"))
	}
	if err != nil {
		return fmt.Errorf("bench: http: %w", err)
	}
	return nil
}

// Report is the result of Run. Its JSON field names are stable.
type Report struct {
	Meta    Meta     `json:"meta"`    // the run, the machine and the options
	Targets []Target `json:"targets"` // the two handlers: "bare", then "middleware"
	// Overhead is the middleware's latency minus the bare handler's, at
	// each percentile, in µs.
	Overhead bench.Latency `json:"overhead_us"`
}

// Meta describes the run: the harness's fields and the options.
type Meta struct {
	bench.Meta
	Rate         float64 `json:"rate"`          // the request rate, requests/s
	Clients      int     `json:"clients"`       // the number of concurrent clients
	SliceSeconds float64 `json:"slice_seconds"` // the length of one slice, in seconds
	Slices       int     `json:"slices"`        // the number of measured slices per handler
	// L0CompactionThreshold is engine.Options.L0CompactionThreshold, for
	// both stores.
	L0CompactionThreshold int `json:"l0_compaction_threshold"`
	// Compression is the name of engine.Options.Compression, for both
	// stores.
	Compression string `json:"compression"`
	// CompactionNice is the nice value of both stores' compactions
	// (Options.CompactionNice; --background-nice), 0 for none.
	CompactionNice int `json:"compaction_nice"`
}

// Target is one served handler's figures over its measured slices.
type Target struct {
	Name           string  `json:"name"`             // "bare" or "middleware"
	Requests       int64   `json:"requests"`         // the number of requests answered in the measured slices
	RequestsPerSec float64 `json:"requests_per_sec"` // Requests over the measured slices' time
	// Latency is measured by the client, from sending a request to reading
	// the last byte of its response, in µs.
	Latency bench.Latency `json:"latency_us"`
	// CPUSecondsPerRequest is the process's CPU time over the measured
	// slices per request, in seconds.
	CPUSecondsPerRequest float64 `json:"cpu_seconds_per_request"`
	// SliceP99US is the p99 latency of each measured slice, in µs, in the
	// order they ran. Background work (the engine's flushes and
	// compactions) lands in some slices and not others; these show how
	// much of Latency.P99 comes from a few slices.
	SliceP99US []float64 `json:"slice_p99_us"`
	// SliceBackground is the flush and compaction work the two stores
	// completed during each measured slice, in the order of SliceP99US.
	SliceBackground []BackgroundWork `json:"slice_background"`
	// The engine's committer over the measured slices (middleware only).
	bench.CommitFigures
	// Runtime is the Go runtime's scheduler wait and collector work over
	// the measured slices: the whole process's, clients included.
	Runtime RuntimeFigures `json:"runtime"`
}

// Run runs the HTTP overhead measurement o describes (nil: defaults).
func Run(ctx context.Context, opts *Options) (*Report, error) {
	o := opts.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	run, err := bench.Start(&o.Options, "bench http", 2*(o.Slices+1))
	if err != nil {
		return nil, err
	}
	defer run.Close()
	rg, err := newRig(o, run.Dir("bare"), run.Dir("engine"))
	if err != nil {
		return nil, err
	}
	defer rg.close()

	stream := uint64(time.Now().UnixNano())
	var next atomic.Uint64
	for s := 0; s <= o.Slices; s++ {
		for _, t := range rg.servers {
			measured := s > 0 // the first slice of each handler warms it up
			if err := rg.slice(ctx, t, stream, &next, measured); err != nil {
				return nil, fmt.Errorf("bench: http: %s: %w", t.name, err)
			}
			run.Step(fmt.Sprintf("http %s slice %d", t.name, s))
		}
	}

	rep := &Report{Meta: Meta{Meta: run.Meta(), Rate: o.Rate, Clients: o.Clients, SliceSeconds: o.Slice.Seconds(),
		Slices: o.Slices, L0CompactionThreshold: o.Engine.L0CompactionThreshold, Compression: o.Engine.Compression.Name,
		CompactionNice: o.CompactionNice}}
	for _, t := range rg.servers {
		rep.Targets = append(rep.Targets, t.figures())
	}
	rep.Overhead = rep.Targets[1].Latency.Minus(rep.Targets[0].Latency)
	return rep, nil
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error { return bench.WriteJSON(w, r) }
