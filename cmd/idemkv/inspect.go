package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/admin"
)

func init() {
	register(&command{
		name:    "inspect",
		args:    "(--data DIR | --server URL [--token-file FILE]) --tenant T --endpoint E --key K [--json]",
		summary: "show one record, in any state: of a store no process has open (--data), or of a running service through its admin API (--server)",
		flags:   inspectFlags,
	})
}

func inspectFlags(fs *flag.FlagSet) func(context.Context, io.Writer) error {
	var (
		dir, server, tokenFile string
		id                     idemkv.ID
		asJSON                 bool
	)
	fs.StringVar(&dir, "data", "", "the store's directory (`DIR`); the store must not be open in another process")
	adminFlags(fs, &server, &tokenFile, "ask the running service whose admin API is at `URL` (serve --admin-addr)")
	fs.StringVar(&id.Tenant, "tenant", "", "the record's tenant (the payments service's: the account)")
	fs.StringVar(&id.Endpoint, "endpoint", "", "the record's endpoint, for example \"POST /v1/payments\"")
	fs.StringVar(&id.Key, "key", "", "the record's idempotency key")
	fs.BoolVar(&asJSON, "json", false, "print the record as JSON")
	return func(ctx context.Context, stdout io.Writer) error {
		if (dir == "") == (server == "") {
			return usageError{errors.New("give one of --data and --server")}
		}
		if err := id.Validate(); err != nil {
			return usageError{err}
		}
		var v admin.RecordView
		if server != "" {
			c, err := newAdminClient(server, tokenFile)
			if err != nil {
				return err
			}
			q := url.Values{"tenant": {id.Tenant}, "endpoint": {id.Endpoint}, "key": {id.Key}}
			if err := c.call(ctx, http.MethodGet, "/admin/v1/record?"+q.Encode(), nil, &v); err != nil {
				return err
			}
		} else {
			e, err := openExisting(dir, true)
			if err != nil {
				return err
			}
			rec, err := e.Get(ctx, id)
			if cerr := e.Close(); cerr != nil {
				return cerr
			}
			history, herr := admin.ReadHistory(filepath.Join(dir, "audit.log"), id)
			if herr != nil {
				return herr
			}
			if errors.Is(err, idemkv.ErrNotFound) && len(history) > 0 {
				last := history[len(history)-1]
				return fmt.Errorf("%w; the audit log's last entry for its key: %s %s %s (%s): %s", err,
					last.Time.Format(time.RFC3339), last.Action, last.Phase, last.Outcome, last.Note)
			}
			if err != nil {
				return err
			}
			v = admin.ViewOf(&rec)
			v.History = history
		}
		if asJSON {
			return printJSON(stdout, v)
		}
		return printRecord(stdout, &v)
	}
}

// printRecord writes a record's view as a table of fields.
func printRecord(w io.Writer, v *admin.RecordView) error {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	row := func(name, value string) {
		if value != "" {
			fmt.Fprintf(tw, "%s\t%s\n", name, value)
		}
	}
	state := v.State
	if v.Escalated {
		state += " (escalated)"
	}
	row("record", fmt.Sprintf("%s / %s / %s", v.Tenant, v.Endpoint, v.Key))
	row("key hash", v.KeyHash+" (key_hash in the service's log)")
	row("state", state)
	row("mode", v.Mode)
	row("attempt", fmt.Sprintf("%d (token %d)", v.Attempt, v.Token))
	row("operation", v.OperationID)
	row("created", v.Created.UTC().Format(time.RFC3339))
	if v.LeaseExpires != nil {
		row("lease until", v.LeaseExpires.UTC().Format(time.RFC3339))
	}
	row("expires", v.Expires.UTC().Format(time.RFC3339))
	row("class", v.Class)
	if v.Status != 0 {
		row("result", fmt.Sprintf("%d %s (body %d bytes, %d effects)", v.Status, v.Pointer, v.BodyBytes, v.Effects))
	}
	row("note", v.Note)
	for _, h := range v.History {
		row("history", fmt.Sprintf("%s %s %s (was %s, token %d): %s: %s", h.Time.UTC().Format(time.RFC3339), h.Action, h.Phase, h.Was, h.Token, h.Outcome, h.Note))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := io.WriteString(w, b.String())
	return err
}
