package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/httpidem"
)

// The operator's side of reconciliation: list what needs settling, and
// settle a record by hand (an escalated one, typically).

func init() {
	register(&command{
		name:    "pending",
		args:    "(--data DIR | --server URL [--token-file FILE]) [--escalated] [--tenant T] [--limit N] [--json]",
		summary: "list the records awaiting reconciliation (uncertain, or abandoned by a crashed holder), or the escalated ones, oldest first: in a store no process has open (--data), or a running service's (--server)",
		flags:   pendingFlags,
	})
	register(&command{
		name:    "resolve",
		args:    "--data DIR --tenant T --endpoint E --key K (--applied [--status N] [--pointer P] [--body-file F] [--content-type T] [--raw] | --no-effect) --note TEXT [--token N]",
		summary: "settle an uncertain, abandoned or escalated record by hand, in a store no process has open; the note is kept on the record and in DIR/audit.log",
		flags:   resolveFlags,
	})
}

func pendingFlags(fs *flag.FlagSet) func(context.Context, io.Writer) error {
	var (
		dir, server, tokenFile string
		req                    idemkv.ListRequest
		asJSON                 bool
	)
	fs.StringVar(&dir, "data", "", "the store's directory (`DIR`); the store must not be open in another process")
	adminFlags(fs, &server, &tokenFile, "list the records of the running service whose admin API is at `URL` (serve --admin-addr)")
	fs.BoolVar(&req.Escalated, "escalated", false, "list the escalated records, which wait for an operator")
	fs.StringVar(&req.Tenant, "tenant", "", "list only this tenant's records")
	fs.IntVar(&req.Limit, "limit", 100, "list at most `N` records")
	fs.BoolVar(&asJSON, "json", false, "print JSON lines, one record each")
	return func(ctx context.Context, stdout io.Writer) error {
		if (dir == "") == (server == "") {
			return usageError{errors.New("give one of --data and --server")}
		}
		if req.Limit < 1 {
			return usageError{fmt.Errorf("--limit %d: must be at least 1", req.Limit)}
		}
		var recs []idemkv.Record
		if server != "" {
			c, err := newAdminClient(server, tokenFile)
			if err != nil {
				return err
			}
			if recs, err = c.listRecords(ctx, req); err != nil {
				return err
			}
		} else {
			e, err := openExisting(dir, true)
			if err != nil {
				return err
			}
			defer e.Close()
			if recs, err = listRecords(ctx, e, req); err != nil {
				return err
			}
		}
		if asJSON {
			enc := json.NewEncoder(stdout)
			for _, r := range recs {
				if err := enc.Encode(pendingJSON(r)); err != nil {
					return err
				}
			}
			return nil
		}
		now := time.Now()
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "AGE\tSTATE\tTENANT\tENDPOINT\tKEY\tTOKEN\tOPERATION\tNOTE")
		for _, r := range recs {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%q\t%d\t%s\t%s\n", now.Sub(r.Created).Round(time.Second), stateOf(r),
				r.ID.Tenant, r.ID.Endpoint, r.ID.Key, r.Token, r.OperationID, r.Note)
		}
		return tw.Flush()
	}
}

// listRecords pages through req's listing up to req.Limit records.
func listRecords(ctx context.Context, e *engine.Engine, req idemkv.ListRequest) ([]idemkv.Record, error) {
	want := req.Limit
	var out []idemkv.Record
	for len(out) < want {
		req.Limit = want - len(out)
		page, err := e.List(ctx, req)
		if err != nil {
			return nil, err
		}
		out = append(out, page.Records...)
		if page.Next == "" {
			break
		}
		req.After = page.Next
	}
	return out, nil
}

func stateOf(r idemkv.Record) string {
	switch {
	case r.Escalated:
		return "escalated"
	case r.State == idemkv.StateInProgress:
		return "abandoned"
	}
	return r.State.String()
}

func pendingJSON(r idemkv.Record) map[string]any {
	return map[string]any{
		"tenant": r.ID.Tenant, "endpoint": r.ID.Endpoint, "key": r.ID.Key, "state": stateOf(r),
		"token": r.Token, "attempt": r.Attempt, "operation_id": r.OperationID.String(),
		"created": r.Created.UTC().Format(time.RFC3339), "note": r.Note,
	}
}

// openExisting opens the store in dir, which must exist (a typo must not
// create an empty store).
func openExisting(dir string, readOnly bool) (*engine.Engine, error) {
	if _, err := os.Stat(dir); err != nil {
		return nil, err
	}
	return engine.Open(dir, &engine.Options{ReadOnly: readOnly, NoBackgroundSweep: true})
}

// resolveConfig is what the resolve flags set.
type resolveConfig struct {
	dir              string
	id               idemkv.ID
	status           int
	pointer          string
	bodyFile         string
	contentType      string
	applied          bool
	raw              bool
	noEffect         bool
	note             string
	expectTokenValue uint64
}

func resolveFlags(fs *flag.FlagSet) func(context.Context, io.Writer) error {
	var c resolveConfig
	fs.StringVar(&c.dir, "data", "", "the store's directory (`DIR`); the store must not be open in another process")
	fs.StringVar(&c.id.Tenant, "tenant", "", "the record's tenant")
	fs.StringVar(&c.id.Endpoint, "endpoint", "", "the record's endpoint, for example \"POST /v1/payments\"")
	fs.StringVar(&c.id.Key, "key", "", "the record's idempotency key")
	fs.BoolVar(&c.applied, "applied", false, "the operation happened: store --status (default 200) as its outcome, replayed to every retry")
	fs.IntVar(&c.status, "status", 0, "with --applied (which it implies): the HTTP `STATUS` to store")
	fs.StringVar(&c.pointer, "pointer", "", "with --status: the object the operation created, for example /v1/payments/pay_42")
	fs.StringVar(&c.bodyFile, "body-file", "", "with --status: replay the contents of `FILE` as the response body")
	fs.StringVar(&c.contentType, "content-type", "application/json", "with --body-file: the body's Content-Type")
	fs.BoolVar(&c.raw, "raw", false, "store --status, --pointer and the bytes of --body-file as they are, not as an HTTP response: for records no HTTP route wrote (a saga step's, whose output is the body)")
	fs.BoolVar(&c.noEffect, "no-effect", false, "the operation provably did not happen: remove the record, so that a retry runs anew")
	fs.StringVar(&c.note, "note", "", "who settles it and why (required; kept on the record and in DIR/audit.log)")
	fs.Uint64Var(&c.expectTokenValue, "token", 0, "settle only if the record's token is still `N` (as pending printed it)")
	return func(ctx context.Context, stdout io.Writer) error {
		if err := c.validate(); err != nil {
			return usageError{err}
		}
		e, err := openExisting(c.dir, false)
		if err != nil {
			return err
		}
		err = c.resolve(ctx, e, stdout)
		return errors.Join(err, e.Close())
	}
}

func (c *resolveConfig) validate() error {
	if c.status != 0 {
		c.applied = true
	}
	if c.applied && c.status == 0 {
		c.status = http.StatusOK
	}
	switch {
	case c.dir == "":
		return errors.New("--data is required")
	case c.id.Validate() != nil:
		return fmt.Errorf("--tenant, --endpoint and --key: %w", c.id.Validate())
	case c.noEffect == c.applied:
		return errors.New("give exactly one of --applied (it happened; --status N, default 200) and --no-effect (it did not)")
	case c.status != 0 && (c.status < 100 || c.status > 599):
		return fmt.Errorf("--status %d: not an HTTP status", c.status)
	case c.noEffect && (c.pointer != "" || c.bodyFile != "" || c.raw):
		return errors.New("--pointer, --body-file and --raw go with --applied, not --no-effect")
	case strings.TrimSpace(c.note) == "":
		return errors.New("--note is required: say who settles the record and why")
	case len(c.note) > idemkv.MaxNoteLen:
		return fmt.Errorf("--note is %d bytes, limit %d", len(c.note), idemkv.MaxNoteLen)
	}
	return nil
}

// resolve settles the record, audits it, and prints what it did.
func (c *resolveConfig) resolve(ctx context.Context, e *engine.Engine, stdout io.Writer) error {
	rec, err := e.Get(ctx, c.id)
	if err != nil {
		return err
	}
	if c.expectTokenValue != 0 && rec.Token != c.expectTokenValue {
		return fmt.Errorf("%w: the record's token is %d, not %d: it changed since it was listed", idemkv.ErrFenced, rec.Token, c.expectTokenValue)
	}
	req := idemkv.ResolveRequest{ID: c.id, Token: rec.Token, NoEffect: c.noEffect, Note: c.note}
	if !c.noEffect {
		var body []byte
		var h http.Header
		if c.bodyFile != "" {
			if body, err = os.ReadFile(c.bodyFile); err != nil {
				return err
			}
			h = http.Header{"Content-Type": {c.contentType}}
		}
		if c.raw {
			req.Result = idemkv.Result{Status: c.status, Pointer: c.pointer, Body: body}
		} else {
			req.Result = httpidem.Outcome(c.status, c.pointer, h, body)
		}
	}
	if err := e.Resolve(ctx, req); err != nil {
		return err
	}
	what := fmt.Sprintf("completed with status %d", c.status)
	if c.noEffect {
		what = "removed: the operation did not happen, a retry runs anew"
	}
	if err := c.audit(rec, what); err != nil {
		return fmt.Errorf("the record is settled (%s), but the audit log was not written: %w", what, err)
	}
	_, err = fmt.Fprintf(stdout, "%s/%s/%q (%s, token %d): %s\n", c.id.Tenant, c.id.Endpoint, c.id.Key, stateOf(rec), rec.Token, what)
	return err
}

// audit appends one JSON line to DIR/audit.log, synced: a removed record
// keeps no note of its own.
func (c *resolveConfig) audit(rec idemkv.Record, what string) error {
	line, _ := json.Marshal(map[string]any{
		"time": time.Now().UTC().Format(time.RFC3339), "action": "resolve", "tenant": c.id.Tenant,
		"endpoint": c.id.Endpoint, "key": c.id.Key, "was": stateOf(rec), "token": rec.Token,
		"operation_id": rec.OperationID.String(), "outcome": what, "note": c.note,
	})
	f, err := os.OpenFile(filepath.Join(c.dir, "audit.log"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(append(line, '\n'))
	return errors.Join(err, f.Sync(), f.Close())
}
