package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/ttl"
)

func init() {
	register(&command{
		name:    "sweep",
		args:    "--data DIR [--rate N] [--compact] [--json]",
		summary: "delete the expired records of a store that no process has open, and report what was held",
		flags:   sweepFlags,
	})
}

// sweepReport is what the sweep command prints with --json.
type sweepReport struct {
	Examined       int     `json:"examined"`
	Deleted        int     `json:"deleted"`
	DeletedBytes   int64   `json:"deleted_bytes"`
	HeldPastExpiry int     `json:"held_past_expiry"`
	Resumed        bool    `json:"resumed"`
	Seconds        float64 `json:"seconds"`
	DiskBytes      uint64  `json:"disk_bytes_after"`
}

func sweepFlags(fs *flag.FlagSet) func(context.Context, io.Writer) error {
	var (
		dir     string
		rate    float64
		compact bool
		asJSON  bool
	)
	fs.StringVar(&dir, "data", "", "the store's directory (`DIR`); the store must not be open in another process")
	fs.Float64Var(&rate, "rate", -1, "records examined per second at most (`N`); negative: as fast as the disk allows")
	fs.BoolVar(&compact, "compact", false, "compact the store afterwards, so that the space of deleted records returns to the filesystem now")
	fs.BoolVar(&asJSON, "json", false, "print the report as JSON")
	return func(ctx context.Context, stdout io.Writer) error {
		if dir == "" {
			return usageError{fmt.Errorf("--data is required")}
		}
		if rate == 0 {
			return usageError{fmt.Errorf("--rate 0 would never finish; give a positive rate or a negative one for no limit")}
		}
		e, err := engine.Open(dir, &engine.Options{NoBackgroundSweep: true, Sweep: ttl.Options{Rate: rate}})
		if err != nil {
			return err
		}
		start := time.Now()
		p, err := e.Sweep(ctx)
		if err == nil && compact {
			err = e.Compact(ctx)
		}
		var st engine.Stats
		if err == nil {
			st, err = e.Stats()
		}
		if cerr := e.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		r := sweepReport{Examined: p.Examined, Deleted: p.Deleted, DeletedBytes: p.DeletedBytes,
			HeldPastExpiry: p.Held, Resumed: p.Resumed, Seconds: time.Since(start).Seconds(), DiskBytes: st.DiskBytes}
		if asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(r)
		}
		resumed := ""
		if r.Resumed {
			resumed = " (resumed an interrupted pass)"
		}
		_, err = fmt.Fprintf(stdout, "examined %d records in %.2fs%s\ndeleted  %d expired records (%d bytes of keys and values)\nheld     %d records past their expiry whose outcome is not settled\ndisk     %d bytes after the sweep\n",
			r.Examined, r.Seconds, resumed, r.Deleted, r.DeletedBytes, r.HeldPastExpiry, r.DiskBytes)
		return err
	}
}
