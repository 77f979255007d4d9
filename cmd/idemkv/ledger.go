package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/examples/ledger"
	"github.com/idemkv/idemkv/inbox"
	"github.com/idemkv/idemkv/natsjs"
	"github.com/idemkv/idemkv/ttl"
)

func init() {
	register(&command{
		name:    "ledger",
		args:    "--events nats://HOST:PORT [--data DIR] [--stream NAME] [--retention D] | --data DIR --balances ACCOUNT,...",
		summary: "run the ledger consumer of examples/ledger: payments.created events applied once each, with its stream position, in its own store",
		flags:   ledgerFlags,
	})
}

// ledgerClass is the retention class of the ledger's dedup marks.
const ledgerClass = "inbox"

func ledgerFlags(fs *flag.FlagSet) func(context.Context, io.Writer) error {
	var (
		url, dir, stream, balances string
		retention                  time.Duration
	)
	fs.StringVar(&url, "events", "", "consume from the NATS JetStream server at `URL` (nats://HOST:PORT)")
	fs.StringVar(&dir, "data", "idemkv-ledger", "keep the ledger's balances, dedup marks and position in `DIR`")
	fs.StringVar(&stream, "stream", eventsStream, "the JetStream stream to read (serve --events publishes to PAYMENTS)")
	fs.DurationVar(&retention, "retention", 7*24*time.Hour, "keep each event's dedup mark this long: longer than the broker may redeliver an event the ledger has applied (its duplicate window, the longest relay outage)")
	fs.StringVar(&balances, "balances", "", "print the USD balances of these comma-separated `ACCOUNTS`, in cents, and the position, from a store no process holds, and exit")
	return func(ctx context.Context, stdout io.Writer) error {
		switch {
		case len(balances) > 0 && url != "":
			return usageError{errors.New("give --events to consume, or --balances to print, not both")}
		case len(balances) > 0:
			return printBalances(ctx, dir, strings.Split(balances, ","), stdout)
		case url == "":
			return usageError{errors.New("--events nats://HOST:PORT is required")}
		case retention <= 0:
			return usageError{errors.New("--retention must be positive")}
		}
		if err := validEventsFlag(url); err != nil || url == "embedded" {
			return usageError{fmt.Errorf("--events %q: give nats://HOST:PORT", url)}
		}
		return runLedger(ctx, url, dir, stream, retention, stdout)
	}
}

// runLedger consumes stream at url into the ledger in dir until ctx ends.
func runLedger(ctx context.Context, url, dir, stream string, retention time.Duration, stdout io.Writer) error {
	e, err := engine.Open(dir, &engine.Options{RetentionClasses: ttl.Classes{ledgerClass: retention}})
	if err != nil {
		return err
	}
	defer e.Close()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	c, err := ledger.New(e, &inbox.Options{Retention: ledgerClass, Logger: log})
	if err != nil {
		return err
	}
	nc, err := nats.Connect(url, nats.MaxReconnects(-1))
	if err != nil {
		return fmt.Errorf("--events %s: %w", url, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	pos, err := c.Position(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "idemkv: ledger consuming stream %s at %s from position %d (store %s)\n", stream, url, pos+1, dir)
	// The consumer's Logger records each event (applied, rejected) and
	// natsjs.Consume's read failures.
	err = natsjs.Consume(ctx, js, stream, c, ledger.Handle, nil)
	switch {
	case errors.Is(err, context.Canceled):
		err = nil
	case errors.Is(err, natsjs.ErrStreamReplaced):
		err = fmt.Errorf("%w\nthe ledger in %s counts another stream than %s has now; give --data a new directory to read this one from its start", err, dir, stream)
	}
	return err
}

// printBalances prints the position and each account's USD balance, in
// cents (minor units), from the ledger in dir.
func printBalances(ctx context.Context, dir string, accounts []string, stdout io.Writer) error {
	e, err := engine.Open(dir, &engine.Options{ReadOnly: true})
	if err != nil {
		return err
	}
	defer e.Close()
	c, err := ledger.New(e, nil)
	if err != nil {
		return err
	}
	pos, err := c.Position(ctx)
	if err != nil {
		return err
	}
	out := struct {
		Position uint64 `json:"position"`
		// Currency and Unit say what the balances' totals count.
		Currency string                    `json:"currency"`
		Unit     string                    `json:"unit"`
		Balances map[string]ledger.Balance `json:"balances"`
	}{pos, "USD", "cents", map[string]ledger.Balance{}}
	for _, a := range accounts {
		if out.Balances[a], err = ledger.Read(ctx, e, a, "USD"); err != nil {
			return err
		}
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}
