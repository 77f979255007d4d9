package bench

import (
	"cmp"
	"errors"
	"fmt"
	"os"

	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/engine/lowprio"
)

// Options are what every measurement's options share; each measurement's
// Options embed them. The zero value of every field means the default
// stated on it.
type Options struct {
	// Profile names the configuration in the report's metadata. Default:
	// "custom".
	Profile string
	// Dir is where the run's temporary directory is created; it is removed
	// at the end. Default: os.TempDir(). Fsyncs are timed on this disk.
	Dir string
	// Engine configures the engine and, through its Pebble settings, every
	// store measured beside it. Default: nil, the engine's defaults.
	Engine *engine.Options
	// CompactionNice, if positive, runs the stores' compactions at this
	// nice value (package engine/lowprio), unless Engine sets
	// ConfigurePebble. Default: 0, the process's priority.
	CompactionNice int
	// Tenants is the number of tenants requests are spread over (see Key).
	// Default: 1,000.
	Tenants int
	// Progress, if set, is called after each step of the run.
	Progress func(Progress)
}

// Progress reports how far a run has come.
type Progress struct {
	Done, Total int
	// Step names the step just finished: "unique c=64 engine".
	Step string
}

// EnsureDefaults returns a copy of o (which may be nil) with every zero
// field set to its default. Engine's fields are left to engine.Open to
// default, but if CompactionNice is set, Engine becomes a copy whose
// compactions run at that nice value.
func (o *Options) EnsureDefaults() *Options {
	var c Options
	if o != nil {
		c = *o
	}
	c.Profile = cmp.Or(c.Profile, "custom")
	c.Dir = cmp.Or(c.Dir, os.TempDir())
	c.Tenants = cmp.Or(c.Tenants, 1000)
	if c.CompactionNice > 0 && c.CompactionNice <= 19 && (c.Engine == nil || c.Engine.ConfigurePebble == nil) {
		var e engine.Options
		if c.Engine != nil {
			e = *c.Engine
		}
		// lowprio.New fails only for a nice value outside 1..19.
		p, _ := lowprio.New(&lowprio.Options{Nice: c.CompactionNice, Logger: e.EnsureDefaults().Logger})
		e.ConfigurePebble = p.Configure
		c.Engine = &e
	}
	return &c
}

// Validate reports options no measurement can run with.
func (o *Options) Validate() error {
	var errs []error
	if o.CompactionNice < 0 || o.CompactionNice > 19 {
		errs = append(errs, fmt.Errorf("compaction nice %d outside 0..19", o.CompactionNice))
	}
	if o.Tenants < 0 {
		errs = append(errs, fmt.Errorf("negative tenants %d", o.Tenants))
	}
	return errors.Join(errs...)
}

// Profiles lists the standard configurations every measurement has:
// "quick", a minute or so, and "full", the one the docs report.
func Profiles() []string { return []string{"quick", "full"} }

// Profile returns a copy of the configuration of profiles named name, which
// must be one of Profiles.
func Profile[O any](name string, profiles map[string]O) (*O, error) {
	if o, ok := profiles[name]; ok {
		return &o, nil
	}
	return nil, fmt.Errorf("bench: unknown profile %q (want quick or full)", name)
}
