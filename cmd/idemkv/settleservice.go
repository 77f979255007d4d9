package main

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"time"

	"github.com/idemkv/idemkv/admin"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/examples/payments"
	"github.com/idemkv/idemkv/reconcile"
)

// An operator's resolve goes through the payments service whose record
// it settles (package admin, ResolveOptions): serve's admin API through
// the service it runs, "resolve --data DIR" through one built here on the
// store, as serve builds it.

// settleThrough returns what a resolve settles through with svc: its
// Reconcile answers a resolve with --verify, and its Settle every other.
// Settle is asserted, not required: it lands in package payments on
// another branch of issue 36, and until then a resolve without --verify
// writes the record alone, as before.
func settleThrough(svc *payments.Service) *admin.ResolveOptions {
	o := &admin.ResolveOptions{Reconciler: svc}
	if s, ok := any(svc).(reconcile.Settler); ok {
		o.Settler = s
	}
	return o
}

// serviceFlags are what "resolve --data" needs to build the payments
// service as serve runs it: its processor, and the settings that change
// what a payment writes.
type serviceFlags struct {
	processorURL     string
	processorTimeout time.Duration
	events           bool
	accountLimit     int64
}

func (f *serviceFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.processorURL, "processor", "", "with --data: the card processor at `URL` the service charges (serve --processor), asked by --verify and by the service's settlement; without it a settlement that must ask the processor is refused, and so is --verify")
	fs.DurationVar(&f.processorTimeout, "processor-timeout", 5*time.Second, "with --processor: give up on a call to it after `D`")
	fs.BoolVar(&f.events, "events", false, "with --data: the service publishes payments.created events (serve --events): an applied payment's event goes with its row")
	fs.Int64Var(&f.accountLimit, "account-limit", 0, "with --data: the service's --account-limit `N`, so that an applied payment's hold is converted as serve converts it")
}

// set reports whether any of the flags was given, for the commands that
// take them only with --data.
func (f *serviceFlags) set() bool {
	return f.processorURL != "" || f.events || f.accountLimit != 0
}

func (f *serviceFlags) validate() error {
	if f.accountLimit < 0 || f.processorTimeout <= 0 {
		return errors.New("--account-limit may not be negative, --processor-timeout must be positive")
	}
	if f.processorURL != "" {
		if _, err := payments.NewProcessorClient(f.processorURL, f.processorTimeout, nil); err != nil {
			return err
		}
	}
	return nil
}

// service builds the payments service on e, as serve does, with the
// processor at --processor, or without --processor one that cannot be
// reached: a store no process holds has no simulated processor running
// beside it, and the service must not take the silence of one built
// afresh for "no charge".
func (f *serviceFlags) service(e *engine.Engine) (*payments.Service, error) {
	var proc payments.Processor = noProcessor{}
	if f.processorURL != "" {
		c, err := payments.NewProcessorClient(f.processorURL, f.processorTimeout, nil)
		if err != nil {
			return nil, err
		}
		proc = c
	}
	return payments.New(payments.Config{Store: e, Processor: proc, Events: f.events, AccountLimit: f.accountLimit,
		Logger: slog.New(slog.DiscardHandler)})
}

// errNoProcessor is what the service hears from noProcessor.
var errNoProcessor = errors.New("no card processor to ask: give --processor URL, the processor the service charges")

// noProcessor is the processor of a service built without --processor:
// every call fails, so that a settlement that must ask it is refused
// rather than told "no charge".
type noProcessor struct{}

func (noProcessor) Charge(context.Context, payments.ChargeRequest) (payments.Charge, error) {
	return payments.Charge{}, errNoProcessor
}

func (noProcessor) Lookup(context.Context, string) (payments.Charge, bool, error) {
	return payments.Charge{}, false, errNoProcessor
}
