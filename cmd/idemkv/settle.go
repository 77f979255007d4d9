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
	"github.com/idemkv/idemkv/admin"
	"github.com/idemkv/idemkv/engine"
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
		args:    "(--data DIR [--processor URL] [--processor-timeout D] [--events] [--account-limit N] | --server URL [--token-file FILE]) --tenant T --endpoint E --key K (--applied [--status N] [--pointer P] [--body-file F] [--content-type T] [--raw] | --no-effect) [--verify] --note TEXT [--token N] [--json]",
		summary: "settle an uncertain, abandoned or escalated record by hand, through the payments service (an applied payment gets its row, a no-effect one gives its hold back), after asking the processor with --verify: in a store no process has open (--data; audited in DIR/audit.log), or a running service's (--server; audited in its admin audit log)",
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
// create an empty store), and, to be written, must be in this release's
// layout (writableStore).
func openExisting(dir string, readOnly bool) (*engine.Engine, error) {
	if err := unfinishedRestore(dir); err != nil {
		return nil, err
	}
	if _, err := os.Stat(dir); err != nil {
		return nil, err
	}
	if !readOnly {
		if err := writableStore(dir); err != nil {
			return nil, err
		}
	}
	return engine.Open(dir, &engine.Options{ReadOnly: readOnly, NoBackgroundSweep: true})
}

// writableStore checks that dir holds a store that an operator's command
// may open read-write: one that exists (not an empty directory that the
// Open would make a store of), in this release's layout. A read-write
// Open migrates an older one in place; that is idemkv migrate's to do,
// with a backup to return to.
func writableStore(dir string) error {
	// Looked for before any Open, which would leave its lock file in a
	// directory that holds no store.
	manifests, err := filepath.Glob(filepath.Join(dir, "marker.manifest.*"))
	if err != nil {
		return err
	}
	if len(manifests) == 0 {
		if _, err := os.Stat(filepath.Join(dir, "CURRENT")); err != nil {
			return fmt.Errorf("%s holds no store", dir)
		}
	}
	layout, err := engine.StoredLayout(dir, nil)
	switch {
	case err != nil:
		return err
	case layout != 0 && layout != engine.Layout:
		return fmt.Errorf("%s holds a store in layout %d, which a read-write open migrates to %d: run idemkv migrate --data %s --backup-to DIR first",
			dir, layout, engine.Layout, dir)
	}
	return nil
}

// resolveConfig is what the resolve flags set.
type resolveConfig struct {
	dir, server, tokenFile string
	req                    admin.ResolveRequest
	bodyFile               string
	applied                bool
	asJSON                 bool
	// svc builds the payments service for --data (settleservice.go).
	svc serviceFlags
}

func resolveFlags(fs *flag.FlagSet) func(context.Context, io.Writer) error {
	var c resolveConfig
	fs.StringVar(&c.dir, "data", "", "the store's directory (`DIR`); the store must not be open in another process")
	adminFlags(fs, &c.server, &c.tokenFile, "settle the record in the running service whose admin API is at `URL` (serve --admin-addr)")
	fs.StringVar(&c.req.Tenant, "tenant", "", "the record's tenant")
	fs.StringVar(&c.req.Endpoint, "endpoint", "", "the record's endpoint, for example \"POST /v1/payments\"")
	fs.StringVar(&c.req.Key, "key", "", "the record's idempotency key")
	fs.BoolVar(&c.applied, "applied", false, "the operation happened: store --status (default 200) as its outcome, replayed to every retry")
	fs.IntVar(&c.req.Status, "status", 0, "with --applied (which it implies): the HTTP `STATUS` to store")
	fs.StringVar(&c.req.Pointer, "pointer", "", "with --status: the object the operation created, for example /v1/payments/pay_42")
	fs.StringVar(&c.bodyFile, "body-file", "", "with --status: replay the contents of `FILE` as the response body")
	fs.StringVar(&c.req.ContentType, "content-type", "application/json", "with --body-file: the body's Content-Type")
	fs.BoolVar(&c.req.Raw, "raw", false, "store --status, --pointer and the bytes of --body-file as they are, not as an HTTP response: for records no HTTP route wrote (a saga step's, whose output is the body)")
	fs.BoolVar(&c.req.NoEffect, "no-effect", false, "the operation provably did not happen: remove the record, so that a retry runs anew")
	fs.StringVar(&c.req.Note, "note", "", "who settles it and why (required; kept on the record and in the audit log)")
	fs.Uint64Var(&c.req.Token, "token", 0, "settle only if the record's token is still `N` (as pending or inspect printed it)")
	fs.BoolVar(&c.req.Verify, "verify", false, "ask the processor first (the reconciler's question): settle only if it agrees, and with --applied store the charge it found instead of --status and --pointer; never releases a payment the processor says it charged (with --data, needs --processor)")
	c.svc.register(fs)
	fs.BoolVar(&c.asJSON, "json", false, "print the audit entry as JSON")
	return func(ctx context.Context, stdout io.Writer) error {
		if err := c.validate(); err != nil {
			return usageError{err}
		}
		if c.bodyFile != "" {
			b, err := os.ReadFile(c.bodyFile)
			if err != nil {
				return err
			}
			c.req.Body = b
		}
		var entry admin.AuditEntry
		err := onStore(ctx, c.dir, c.server, c.tokenFile, func(ac *adminClient) error {
			return ac.call(ctx, http.MethodPost, "/admin/v1/resolve", c.req, &entry)
		}, func(e *engine.Engine, audit *admin.AuditLog) error {
			svc, err := c.svc.service(e)
			if err != nil {
				return err
			}
			entry, err = admin.Resolve(ctx, e, audit, c.req, settleThrough(svc))
			return err
		})
		if err != nil {
			return err
		}
		return printAuditEntry(stdout, &entry, c.asJSON)
	}
}

func (c *resolveConfig) validate() error {
	if c.req.Status != 0 {
		c.applied = true
	}
	switch {
	case (c.dir == "") == (c.server == ""):
		return errors.New("give one of --data and --server")
	case c.req.NoEffect == c.applied:
		return errors.New("give exactly one of --applied (it happened; --status N, default 200) and --no-effect (it did not)")
	case c.req.NoEffect && (c.bodyFile != "" || c.req.Pointer != "" || c.req.Raw):
		return errors.New("--pointer, --body-file and --raw go with --applied, not --no-effect")
	case c.server != "" && c.svc.set():
		return errors.New("--processor, --events and --account-limit go with --data: with --server the service settles with its own")
	case c.dir != "" && c.req.Verify && c.svc.processorURL == "":
		return errors.New("--verify with --data needs --processor URL: the processor to ask (the service's; resolve without --verify on your own word otherwise)")
	}
	if err := c.svc.validate(); err != nil {
		return err
	}
	if c.req.NoEffect || c.bodyFile == "" {
		c.req.ContentType = ""
	}
	if err := c.req.Validate(); err != nil {
		return errors.New(strings.TrimPrefix(err.Error(), idemkv.ErrInvalidArgument.Error()+": "))
	}
	return nil
}

// onStore runs an operator's write on the running service at server
// through its admin API (remote), or on the store in dir, which no
// process may hold, with its audit log at DIR/audit.log (local).
func onStore(ctx context.Context, dir, server, tokenFile string, remote func(*adminClient) error, local func(*engine.Engine, *admin.AuditLog) error) error {
	if server != "" {
		c, err := newAdminClient(server, tokenFile)
		if err != nil {
			return err
		}
		return remote(c)
	}
	e, err := openExisting(dir, false)
	if err != nil {
		return err
	}
	audit, err := admin.OpenAuditLog(filepath.Join(dir, "audit.log"))
	if err != nil {
		return errors.Join(err, e.Close())
	}
	err = local(e, audit)
	return errors.Join(err, audit.Close(), e.Close())
}

// printAuditEntry prints what an operator's write did.
func printAuditEntry(w io.Writer, e *admin.AuditEntry, asJSON bool) error {
	if asJSON {
		return printJSON(w, e)
	}
	verified := ""
	if e.Verified {
		verified = "; verified, the downstream answered " + e.Downstream
	}
	_, err := fmt.Fprintf(w, "%s/%s/%q (%s, token %d): %s%s\n", e.Tenant, e.Endpoint, e.Key, e.Was, e.Token, e.Outcome, verified)
	return err
}
