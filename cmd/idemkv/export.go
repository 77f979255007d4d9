package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"

	"github.com/idemkv/idemkv/admin"
	"github.com/idemkv/idemkv/pgstore"
)

func init() {
	register(&command{
		name:    "export",
		args:    "(--data DIR | --store URL | --server URL [--token-file FILE]) [--outbox] [--inbox] [--out FILE] [--json]",
		summary: "write every record (and, with --outbox, the outbox's cursor and events; with --inbox, the inbox's records) as JSON lines, for audits and migrations",
		flags:   exportFlags,
	})
}

func exportFlags(fs *flag.FlagSet) func(context.Context, io.Writer) error {
	var (
		dir, store, server, tokenFile, out string
		o                                  admin.ExportOptions
		asJSON                             bool
	)
	fs.StringVar(&dir, "data", "", "the store's directory (`DIR`); the store must not be open in another process")
	fs.StringVar(&store, "store", "", "export the PostgreSQL store at `URL` (processes may be using it)")
	adminFlags(fs, &server, &tokenFile, "export the store of the running service whose admin API is at `URL` (serve --admin-addr)")
	fs.BoolVar(&o.Outbox, "outbox", false, "add the outbox's cursor and the events it still holds")
	fs.BoolVar(&o.Inbox, "inbox", false, "add the records of the inbox's consumers")
	fs.StringVar(&out, "out", "", "write to `FILE`, which must not exist (default: standard output)")
	fs.BoolVar(&asJSON, "json", false, "with --out: print the counts as JSON")
	return func(ctx context.Context, stdout io.Writer) error {
		n := 0
		for _, s := range []string{dir, store, server} {
			if s != "" {
				n++
			}
		}
		if n != 1 {
			return usageError{errors.New("give one of --data, --store and --server")}
		}
		if store != "" {
			if err := validStoreFlag(store); err != nil {
				return usageError{err}
			}
		}
		w, finish, err := exportOutput(out, stdout)
		if err != nil {
			return err
		}
		var counts admin.ExportCounts
		switch {
		case server != "":
			counts, err = exportRemote(ctx, server, tokenFile, o, w)
		case store != "":
			counts, err = exportPostgres(ctx, store, o, w)
		default:
			counts, err = exportLocal(ctx, dir, o, w)
		}
		if err = finish(err); err != nil || out == "" {
			return err
		}
		if asJSON {
			return printJSON(stdout, counts)
		}
		_, err = fmt.Fprintf(stdout, "exported %d records and %d events to %s\n", counts.Records, counts.Events, out)
		return err
	}
}

// exportOutput returns where the export goes, and the function that ends
// it with the export's error: a file is synced, or removed on failure.
func exportOutput(out string, stdout io.Writer) (io.Writer, func(error) error, error) {
	if out == "" {
		bw := bufio.NewWriterSize(stdout, 64<<10)
		return bw, func(err error) error { return errors.Join(err, bw.Flush()) }, nil
	}
	f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, nil, err
	}
	bw := bufio.NewWriterSize(f, 64<<10)
	return bw, func(err error) error {
		if err == nil {
			err = errors.Join(bw.Flush(), f.Sync())
		}
		err = errors.Join(err, f.Close())
		if err != nil {
			_ = os.Remove(out)
		}
		return err
	}, nil
}

func exportLocal(ctx context.Context, dir string, o admin.ExportOptions, w io.Writer) (admin.ExportCounts, error) {
	e, err := openExisting(dir, true)
	if err != nil {
		return admin.ExportCounts{}, err
	}
	n, err := admin.Export(ctx, e, w, o)
	return n, errors.Join(err, e.Close())
}

func exportPostgres(ctx context.Context, url string, o admin.ExportOptions, w io.Writer) (admin.ExportCounts, error) {
	s, err := pgstore.Open(ctx, url, &pgstore.Options{NoBackgroundSweep: true, NoListen: true})
	if err != nil {
		return admin.ExportCounts{}, err
	}
	n, err := admin.Export(ctx, s, w, o)
	return n, errors.Join(err, s.Close())
}

// exportRemote copies the admin API's export to w, without its last line,
// which must say the export ended.
func exportRemote(ctx context.Context, server, tokenFile string, o admin.ExportOptions, w io.Writer) (admin.ExportCounts, error) {
	c, err := newAdminClient(server, tokenFile)
	if err != nil {
		return admin.ExportCounts{}, err
	}
	q := url.Values{"outbox": {strconv.FormatBool(o.Outbox)}, "inbox": {strconv.FormatBool(o.Inbox)}}
	body, err := c.stream(ctx, http.MethodGet, "/admin/v1/export?"+q.Encode())
	if err != nil {
		return admin.ExportCounts{}, err
	}
	defer body.Close()
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	var prev []byte
	for sc.Scan() {
		if prev != nil {
			if _, err := w.Write(append(prev, '\n')); err != nil {
				return admin.ExportCounts{}, err
			}
		}
		prev = append(prev[:0], sc.Bytes()...)
	}
	if err := sc.Err(); err != nil {
		return admin.ExportCounts{}, fmt.Errorf("admin API: export cut short: %w", err)
	}
	var end struct {
		Kind   string `json:"kind"`
		Detail string `json:"detail"`
		admin.ExportCounts
	}
	switch err := json.Unmarshal(prev, &end); {
	case err != nil || end.Kind != "end" && end.Kind != "error":
		return admin.ExportCounts{}, errors.New("admin API: export cut short")
	case end.Kind == "error":
		return end.ExportCounts, fmt.Errorf("admin API: export failed after %d records: %s", end.Records, end.Detail)
	}
	return end.ExportCounts, nil
}
