package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/examples/processor"
)

func init() {
	register(&command{
		name:    "processor",
		args:    "[--addr ADDR] [--data DIR] [--latency D] [--fail-rate F] [--timeout-rate F] [--hold D] [--retention D]",
		summary: "run a simulated card processor over HTTP, with its own store: charges deduplicated on Idempotency-Key, looked up by key (idemkv serve --processor URL)",
		flags:   processorFlags,
	})
}

// processorConfig is what the processor flags set.
type processorConfig struct {
	addr      string
	dir       string
	retention time.Duration
	o         processor.Options
}

func processorFlags(fs *flag.FlagSet) func(context.Context, io.Writer) error {
	var c processorConfig
	fs.StringVar(&c.addr, "addr", "127.0.0.1:8081", "listen on `ADDR` (loopback only: the processor has no authentication)")
	fs.StringVar(&c.dir, "data", "idemkv-processor", "keep the processor's charges and keys in `DIR`")
	fs.DurationVar(&c.o.Latency, "latency", 0, "time each charge request takes")
	fs.Float64Var(&c.o.FailRate, "fail-rate", 0, "fraction of charge requests refused before charging (503)")
	fs.Float64Var(&c.o.TimeoutRate, "timeout-rate", 0, "fraction of charge requests charged and then left without an answer (504 after --hold, or when the caller gives up)")
	fs.DurationVar(&c.o.Hold, "hold", 30*time.Second, "how long a charge that times out holds its call")
	fs.DurationVar(&c.retention, "retention", 7*24*time.Hour, "how long charges are deduplicated and found by key: keep it above the callers' reconciliation limit")
	return func(ctx context.Context, stdout io.Writer) error {
		switch {
		case c.o.FailRate < 0 || c.o.TimeoutRate < 0 || c.o.FailRate+c.o.TimeoutRate > 1:
			return usageError{errors.New("--fail-rate and --timeout-rate are fractions, and together at most 1")}
		case c.o.Latency < 0 || c.o.Hold <= 0 || c.retention <= 0:
			return usageError{errors.New("--latency may not be negative, --hold and --retention must be positive")}
		case !isLoopback(c.addr):
			return usageError{fmt.Errorf("--addr %s is not a loopback address: the processor has no authentication", c.addr)}
		}
		ln, err := net.Listen("tcp", c.addr)
		if err != nil {
			return err
		}
		return runProcessor(ctx, ln, c, stdout)
	}
}

// runProcessor serves the processor on ln until ctx is done.
func runProcessor(ctx context.Context, ln net.Listener, c processorConfig, stdout io.Writer) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	e, err := engine.Open(c.dir, &engine.Options{Retention: c.retention})
	if err != nil {
		ln.Close()
		return err
	}
	c.o.Store, c.o.Logger = e, log
	p, err := processor.New(c.o)
	if err != nil {
		ln.Close()
		return errors.Join(err, e.Close())
	}
	_, conns := fileBudget()
	srv, cl := newServer(p.Handler(), defaultLimits(c.o.Latency+c.o.Hold, conns), slog.NewLogLogger(log.Handler(), slog.LevelWarn))
	ln = cl.Listener(ln)
	fmt.Fprintf(stdout, "idemkv: card processor on http://%s (store %s; keys kept %v)\n", ln.Addr(), c.dir, c.retention)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err = <-errc:
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	err = errors.Join(err, srv.Shutdown(sctx))
	cancel()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return errors.Join(err, e.Close())
}
