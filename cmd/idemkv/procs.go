package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"

	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/engine/lowprio"
)

// goProcs is Go's GOMAXPROCS when the program started, before a command
// changed it.
var goProcs = runtime.GOMAXPROCS(0)

// backgroundFlags are the flags of the commands that serve requests
// (serve, bench http): how many Go processors the process runs, and the
// nice value of Pebble's compactions (package engine/lowprio). With one
// processor more than Go's default and compactions at nice 19, the kernel
// runs compactions in the CPU time the requests leave, instead of giving
// them a processor's share (docs/operations.md, "Background work and
// GOMAXPROCS").
type backgroundFlags struct {
	procs int // GOMAXPROCS to set; 0 leaves Go's
	nice  int // compactions' nice value; 0 leaves them at the process's
}

// register adds the flags to fs. With on, their defaults are the
// service's: one processor more than Go's own (unless the GOMAXPROCS
// environment variable is set) and nice 19; without, both default to 0,
// which changes nothing.
func (b *backgroundFlags) register(fs *flag.FlagSet, on bool) {
	procs, nice := 0, 0
	if on {
		nice = 19
		if os.Getenv("GOMAXPROCS") == "" {
			procs = goProcs + 1
		}
	}
	fs.IntVar(&b.procs, "gomaxprocs", procs, "Go processors (GOMAXPROCS) to run with; 0 keeps Go's own (the service's default is one more than Go's own, for Pebble's compactions, unless the GOMAXPROCS environment variable is set)")
	fs.IntVar(&b.nice, "background-nice", nice, "nice value, 1 to 19, of Pebble's compactions on Linux (package engine/lowprio); 0 leaves them at the process's")
}

func (b backgroundFlags) validate() error {
	if b.procs < 0 {
		return errors.New("--gomaxprocs may not be negative")
	}
	if b.nice < 0 || b.nice > 19 {
		return fmt.Errorf("--background-nice %d outside 0..19", b.nice)
	}
	return nil
}

// setProcs sets GOMAXPROCS, if the flags say to.
func (b backgroundFlags) setProcs() {
	if b.procs > 0 {
		runtime.GOMAXPROCS(b.procs)
	}
}

// apply sets GOMAXPROCS and returns o (allocated if nil) configured to
// run its compactions at the flags' nice value, with the Priority that
// counts them (nil if the nice value is 0).
func (b backgroundFlags) apply(o *engine.Options) (*engine.Options, *lowprio.Priority, error) {
	b.setProcs()
	if o == nil {
		o = &engine.Options{}
	}
	if b.nice == 0 {
		return o, nil, nil
	}
	p, err := lowprio.New(&lowprio.Options{Nice: b.nice, Logger: o.EnsureDefaults().Logger})
	if err != nil {
		return nil, nil, err
	}
	o.ConfigurePebble = p.Configure
	return o, p, nil
}
