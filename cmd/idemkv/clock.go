package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/idemkv/idemkv/engine"
)

func init() {
	register(&command{
		name:    "clock",
		args:    "--data DIR [--follow-wall] [--json]",
		summary: "show how far a Pebble store's time runs from this host's clock (a store no process has open), and with --follow-wall set it to the clock",
		flags:   clockFlags,
	})
}

// clockReport is what the clock command prints with --json.
type clockReport struct {
	StoreTime time.Time `json:"store_time"`
	WallClock time.Time `json:"wall_clock"`
	// AheadSeconds is how far the store's time runs ahead of the wall
	// clock, before --follow-wall (0: it follows the clock).
	AheadSeconds float64 `json:"ahead_seconds"`
	// FollowsWall: --follow-wall set the store's time to the wall clock.
	FollowsWall bool `json:"follows_wall"`
}

func clockFlags(fs *flag.FlagSet) func(context.Context, io.Writer) error {
	var (
		dir            string
		follow, asJSON bool
	)
	fs.StringVar(&dir, "data", "", "the store's directory (`DIR`); the store must not be open in another process")
	fs.BoolVar(&follow, "follow-wall", false, "set the store's time to this host's clock, if the store runs ahead of it (make sure the clock is right)")
	fs.BoolVar(&asJSON, "json", false, "print the report as JSON")
	return func(ctx context.Context, stdout io.Writer) error {
		if dir == "" {
			return usageError{errors.New("--data is required")}
		}
		rep, err := readStoreClock(dir)
		if err != nil {
			return err
		}
		// A store that follows the clock is left alone: opened on it as
		// it is, a clock stepped forward by mistake would become the
		// store's time, where an ordinary open holds such a step back
		// for an hour and lets a correction undo it.
		if follow && rep.AheadSeconds > 0 {
			if err := followWall(dir); err != nil {
				return err
			}
			rep.FollowsWall = true
		}
		if asJSON {
			return printJSON(stdout, rep)
		}
		return printClock(stdout, rep)
	}
}

// readStoreClock opens the store in dir read-only and reads its time
// against the wall clock.
func readStoreClock(dir string) (clockReport, error) {
	if err := writableStore(dir); err != nil {
		return clockReport{}, err // not a store (an Open would leave its lock file), or an older layout
	}
	e, err := openExisting(dir, true)
	if err != nil {
		return clockReport{}, err
	}
	rep := clockReport{StoreTime: e.Now().UTC(), WallClock: time.Now().UTC()}
	rep.AheadSeconds = (-e.WallOffset()).Seconds()
	return rep, e.Close()
}

// followWall opens the store in dir once following the wall clock as it
// is (engine.TrustClock), and closes it: Close writes the clock's reading
// as the store's time, which the next Open starts from.
func followWall(dir string) error {
	e, err := engine.Open(dir, &engine.Options{NoBackgroundSweep: true, ClockTolerance: engine.TrustClock})
	if err != nil {
		return err
	}
	return e.Close()
}

func printClock(w io.Writer, rep clockReport) error {
	ahead := time.Duration(rep.AheadSeconds * float64(time.Second)).Round(time.Millisecond)
	_, err := fmt.Fprintf(w, "store time  %s\nwall clock  %s\n", rep.StoreTime.Format(time.RFC3339Nano), rep.WallClock.Format(time.RFC3339Nano))
	if err != nil {
		return err
	}
	switch {
	case rep.FollowsWall:
		_, err = fmt.Fprintf(w, "the store's time now follows the wall clock (it was %v ahead); records written before keep their times\n", ahead)
	case ahead > 0:
		_, err = fmt.Fprintf(w, "the store's time runs %v ahead of the wall clock: the reconciler waits that out before it asks about a record (--follow-wall ends it, if the clock is right)\n", ahead)
	default:
		_, err = fmt.Fprintln(w, "the store's time follows the wall clock")
	}
	return err
}
