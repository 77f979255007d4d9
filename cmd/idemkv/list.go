package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/admin"
	"github.com/idemkv/idemkv/engine"
)

// The operator's listing of records in any state, and eviction.

func init() {
	register(&command{
		name:    "list",
		args:    "(--data DIR | --server URL [--token-file FILE]) [--state S] [--tenant T] [--older-than D] [--limit N] [--after CURSOR] [--json]",
		summary: "list records in any state, by state, tenant and age, a page at a time: of a store no process has open (--data), or a running service's (--server)",
		flags:   listFlags,
	})
	register(&command{
		name:    "evict",
		args:    "(--data DIR | --server URL [--token-file FILE]) --tenant T --endpoint E --key K --reason TEXT [--token N] [--json]",
		summary: "remove a record, so that the next request with its key runs anew (not one in progress under a live lease; what a completed one wrote through Effects stays); the reason goes to the audit log",
		flags:   evictFlags,
	})
}

func listFlags(fs *flag.FlagSet) func(context.Context, io.Writer) error {
	var (
		dir, server, tokenFile string
		q                      admin.ListQuery
		asJSON                 bool
	)
	fs.StringVar(&dir, "data", "", "the store's directory (`DIR`); the store must not be open in another process")
	adminFlags(fs, &server, &tokenFile, "list the records of the running service whose admin API is at `URL` (serve --admin-addr)")
	fs.StringVar(&q.State, "state", "", "list only records in `STATE`: "+strings.Join(admin.States, ", "))
	fs.StringVar(&q.Tenant, "tenant", "", "list only this tenant's records")
	fs.DurationVar(&q.OlderThan, "older-than", 0, "list only records created longer ago than `D` (36h, say)")
	fs.IntVar(&q.Limit, "limit", 100, "list at most `N` records (1 to 1000)")
	fs.StringVar(&q.After, "after", "", "go on from where the last page ended (the `CURSOR` it printed)")
	fs.BoolVar(&asJSON, "json", false, "print the page as one JSON object: {\"records\": [...], \"next\": CURSOR}")
	return func(ctx context.Context, stdout io.Writer) error {
		if (dir == "") == (server == "") {
			return usageError{errors.New("give one of --data and --server")}
		}
		if q.Limit < 1 || q.Limit > 1000 {
			return usageError{fmt.Errorf("--limit %d: want 1 to 1000", q.Limit)}
		}
		if _, err := admin.ParseListQuery(q.Values()); err != nil {
			return usageError{err}
		}
		var page listPage
		if server != "" {
			c, err := newAdminClient(server, tokenFile)
			if err != nil {
				return err
			}
			if err := c.call(ctx, http.MethodGet, "/admin/v1/records?"+q.Values().Encode(), nil, &page); err != nil {
				return err
			}
		} else {
			e, err := openExisting(dir, true)
			if err != nil {
				return err
			}
			p, err := admin.List(ctx, e, q, time.Now())
			if cerr := e.Close(); err == nil {
				err = cerr
			}
			if errors.Is(err, idemkv.ErrInvalidArgument) {
				return usageError{err}
			}
			if err != nil {
				return err
			}
			page.Next = p.Next
			for i := range p.Records {
				page.Records = append(page.Records, admin.ViewOf(&p.Records[i]))
			}
		}
		if asJSON {
			if page.Records == nil {
				page.Records = []admin.RecordView{}
			}
			return printJSON(stdout, page)
		}
		return printList(stdout, &page)
	}
}

// listPage is a page of the listing, as the admin API answers it.
type listPage struct {
	Records []admin.RecordView `json:"records"`
	Next    string             `json:"next,omitempty"`
}

// printList writes a page as a table, and how to go on if there is more.
func printList(w io.Writer, p *listPage) error {
	now := time.Now()
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "AGE\tSTATE\tTENANT\tENDPOINT\tKEY\tTOKEN\tSTATUS\tEXPIRES\tNOTE")
	for i := range p.Records {
		v := &p.Records[i]
		state := v.State
		if v.Escalated {
			state = "escalated"
		}
		status := "-"
		if v.Status != 0 {
			status = fmt.Sprint(v.Status)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%q\t%d\t%s\t%s\t%s\n", now.Sub(v.Created).Round(time.Second), state,
			v.Tenant, v.Endpoint, v.Key, v.Token, status, v.Expires.UTC().Format(time.RFC3339), v.Note)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if p.Next != "" {
		_, err := fmt.Fprintf(w, "more: --after %s\n", p.Next)
		return err
	}
	return nil
}

func evictFlags(fs *flag.FlagSet) func(context.Context, io.Writer) error {
	var (
		dir, server, tokenFile string
		req                    admin.EvictRequest
		asJSON                 bool
	)
	fs.StringVar(&dir, "data", "", "the store's directory (`DIR`); the store must not be open in another process")
	adminFlags(fs, &server, &tokenFile, "evict from the running service whose admin API is at `URL` (serve --admin-addr)")
	fs.StringVar(&req.Tenant, "tenant", "", "the record's tenant")
	fs.StringVar(&req.Endpoint, "endpoint", "", "the record's endpoint, for example \"POST /v1/payments\"")
	fs.StringVar(&req.Key, "key", "", "the record's idempotency key")
	fs.StringVar(&req.Reason, "reason", "", "who evicts it and why (required; kept in the audit log)")
	fs.Uint64Var(&req.Token, "token", 0, "evict only if the record's token is still `N` (as inspect or list printed it)")
	fs.BoolVar(&asJSON, "json", false, "print the audit entry as JSON")
	return func(ctx context.Context, stdout io.Writer) error {
		if (dir == "") == (server == "") {
			return usageError{errors.New("give one of --data and --server")}
		}
		if err := req.Validate(); err != nil {
			return usageError{err}
		}
		var entry admin.AuditEntry
		err := onStore(ctx, dir, server, tokenFile, func(ac *adminClient) error {
			return ac.call(ctx, http.MethodPost, "/admin/v1/evict", req, &entry)
		}, func(e *engine.Engine, audit *admin.AuditLog) (err error) {
			entry, err = admin.Evict(ctx, e, audit, req)
			return err
		})
		if err != nil {
			return err
		}
		return printAuditEntry(stdout, &entry, asJSON)
	}
}
