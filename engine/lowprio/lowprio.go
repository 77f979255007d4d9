package lowprio

import (
	"fmt"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
)

// Options configure a Priority. A nil *Options means the defaults.
type Options struct {
	// Nice is the nice value compactions run at: 1 (a little below
	// normal) to 19 (only when a core is otherwise idle). Default: 19.
	Nice int
	// Logger is told once if a compaction's priority cannot be lowered;
	// the compaction then runs at the process's priority. Default: none.
	Logger pebble.Logger
}

// EnsureDefaults returns a copy of o (which may be nil) with every zero
// field set to its default.
func (o *Options) EnsureDefaults() *Options {
	var c Options
	if o != nil {
		c = *o
	}
	if c.Nice == 0 {
		c.Nice = 19
	}
	return &c
}

// Validate reports options Priority cannot run with.
func (o *Options) Validate() error {
	if o.Nice < 1 || o.Nice > 19 {
		return fmt.Errorf("lowprio: Nice %d outside 1..19", o.Nice)
	}
	return nil
}

// Supported reports whether this system keeps a priority per thread, so
// that Configure has an effect.
const Supported = supported

// Priority lowers the compactions of every Pebble store it configures and
// counts them. It is safe for concurrent use.
type Priority struct {
	opts *Options
	// lowered counts compactions lowered; failed those that could not be.
	lowered, failed atomic.Int64
	logged          atomic.Bool
	// testHookLowered, if set, is called on each lowered compaction's
	// goroutine after the attempt, with its error.
	testHookLowered func(error)
}

// New returns a Priority for opts (nil: defaults).
func New(opts *Options) (*Priority, error) {
	o := opts.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	return &Priority{opts: o}, nil
}

// Configure makes the store opened with po run its compactions at the
// lowered priority: it sets po.Experimental.CompactionScheduler to a new
// scheduler (one per store: Pebble registers each store with its own) and
// adds write-stall callbacks to po.EventListener. Pass it as
// engine.Options.ConfigurePebble. On a system where Supported is false it
// changes nothing.
func (p *Priority) Configure(po *pebble.Options) {
	if !Supported {
		return
	}
	s := newScheduler(p)
	po.Experimental.CompactionScheduler = s
	l := pebble.EventListener{
		WriteStallBegin: func(pebble.WriteStallBeginInfo) { s.stalled.Store(true) },
		WriteStallEnd:   func() { s.stalled.Store(false) },
	}
	if po.EventListener != nil {
		l = pebble.TeeEventListener(*po.EventListener, l)
	}
	po.EventListener = &l
}

// Lowered returns how many compactions have run at the lowered priority.
func (p *Priority) Lowered() int64 { return p.lowered.Load() }

// Failed returns how many compactions could not be lowered and ran at the
// process's priority.
func (p *Priority) Failed() int64 { return p.failed.Load() }

// lower runs the calling goroutine, a compaction's, at the lowered
// priority for the rest of its life.
func (p *Priority) lower() {
	err := lowerThread(p.opts.Nice)
	if err == nil {
		p.lowered.Add(1)
	} else {
		p.failed.Add(1)
		if !p.logged.Swap(true) && p.opts.Logger != nil {
			p.opts.Logger.Errorf("lowprio: nice %d: %v; compactions keep the process's priority", p.opts.Nice, err)
		}
	}
	if p.testHookLowered != nil {
		p.testHookLowered(err)
	}
}
