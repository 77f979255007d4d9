package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/ttl"
)

func init() {
	register(&command{
		name:    "sweep",
		args:    "(--data DIR [--rate N] [--compact] | --server URL [--token-file FILE]) [--json]",
		summary: "delete the expired records of a store that no process has open (--data), or run a running service's sweeper now (--server), and report what was held",
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
		dir, server, tokenFile string
		rate                   float64
		compact                bool
		asJSON                 bool
	)
	fs.StringVar(&dir, "data", "", "the store's directory (`DIR`); the store must not be open in another process")
	adminFlags(fs, &server, &tokenFile, "run the sweeper of the running service whose admin API is at `URL` (serve --admin-addr)")
	fs.Float64Var(&rate, "rate", -1, "records examined per second at most (`N`); negative: as fast as the disk allows")
	fs.BoolVar(&compact, "compact", false, "compact the store afterwards, so that the space of deleted records returns to the filesystem now")
	fs.BoolVar(&asJSON, "json", false, "print the report as JSON")
	return func(ctx context.Context, stdout io.Writer) error {
		if server != "" {
			if dir != "" || compact || rate != -1 {
				return usageError{fmt.Errorf("--server takes neither --data, --rate nor --compact: the service sweeps at its own rate")}
			}
			return sweepServer(ctx, server, tokenFile, asJSON, stdout)
		}
		if dir == "" {
			return usageError{fmt.Errorf("--data or --server is required")}
		}
		if rate == 0 {
			return usageError{fmt.Errorf("--rate 0 would never finish; give a positive rate or a negative one for no limit")}
		}
		if err := unfinishedRestore(dir); err != nil {
			return err
		}
		if _, err := os.Stat(dir); err != nil {
			return err // do not create a store where none is
		}
		if err := writableStore(dir); err != nil {
			return err
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

// sweepServer runs one pass of a running service's sweeper through its
// admin API.
func sweepServer(ctx context.Context, server, tokenFile string, asJSON bool, stdout io.Writer) error {
	c, err := newAdminClient(server, tokenFile)
	if err != nil {
		return err
	}
	var p ttl.Pass
	if err := c.call(ctx, http.MethodPost, "/admin/v1/sweep", nil, &p); err != nil {
		return err
	}
	r := sweepReport{Examined: p.Examined, Deleted: p.Deleted, DeletedBytes: p.DeletedBytes,
		HeldPastExpiry: p.Held, Resumed: p.Resumed, Seconds: p.Ended.Sub(p.Started).Seconds()}
	if asJSON {
		return printJSON(stdout, r)
	}
	_, err = fmt.Fprintf(stdout, "examined %d records in %.2fs\ndeleted  %d expired records (%d bytes of keys and values)\nheld     %d records past their expiry whose outcome is not settled\n",
		r.Examined, r.Seconds, r.Deleted, r.DeletedBytes, r.HeldPastExpiry)
	return err
}
