package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/natsjs"
	"github.com/idemkv/idemkv/natsjs/natsembed"
	"github.com/idemkv/idemkv/outbox"
)

// eventsStream is the JetStream stream serve publishes the payments'
// events to (subjects payments.>), created if missing.
const eventsStream = "PAYMENTS"

// validEventsFlag checks --events: "", "embedded" or a nats:// URL.
func validEventsFlag(v string) error {
	if v == "" || v == "embedded" || strings.HasPrefix(v, "nats://") || strings.HasPrefix(v, "tls://") {
		return nil
	}
	return fmt.Errorf("--events %q: give nats://HOST:PORT (a NATS server with JetStream) or embedded", v)
}

// eventSource is a store the relay reads: its outbox, and its clock.
type eventSource interface {
	idemkv.Outbox
	Now() time.Time
}

// startEvents connects to the broker --events names (starting the
// embedded one first if asked), makes sure the stream exists, and runs
// the outbox relay from e to it; the function it returns stops the relay,
// then the connection and the embedded server.
func startEvents(c serveConfig, e eventSource, log *slog.Logger, reg prometheus.Registerer, stdout io.Writer) (func(), error) {
	url := c.events
	var emb *natsembed.Server
	if url == "embedded" {
		var err error
		if emb, err = natsembed.Start(filepath.Join(c.dir, "jetstream"), 0); err != nil {
			return nil, fmt.Errorf("start embedded JetStream: %w", err)
		}
		url = emb.URL()
	}
	stopEmb := func() {
		if emb != nil {
			emb.Shutdown()
		}
	}
	pub, err := natsjs.Connect(url, nil)
	if err != nil {
		stopEmb()
		return nil, fmt.Errorf("--events %s: %w", url, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, err = natsjs.EnsureStream(ctx, pub.JetStream(), eventsStream, []string{"payments.>"}, natsjs.DefaultDuplicateWindow)
	cancel()
	if err != nil {
		_ = pub.Close()
		stopEmb()
		return nil, fmt.Errorf("--events %s: stream %s: %w", url, eventsStream, err)
	}
	_, shared := e.(idemkv.SharedOutbox) // a store a fleet shares: every process's relay claims its part
	r, err := outbox.New(e, pub, &outbox.Options{
		Clock:  e,
		Logger: log,
		Shared: shared,
	})
	if err != nil {
		_ = pub.Close()
		stopEmb()
		return nil, err
	}
	if err := registerRelayMetrics(reg, r); err != nil {
		_ = pub.Close()
		stopEmb()
		return nil, err
	}
	fmt.Fprintf(stdout, "idemkv: publishing payments.created events to %s (JetStream stream %s, duplicate window %v)\n",
		url, eventsStream, natsjs.DefaultDuplicateWindow)
	rctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = r.Run(rctx) })
	return sync.OnceFunc(func() {
		stop()
		wg.Wait()
		_ = pub.Close()
		stopEmb()
	}), nil
}

// registerRelayMetrics exports the relay's figures (outbox.Stats) on reg.
func registerRelayMetrics(reg prometheus.Registerer, r *outbox.Relay) error {
	for _, c := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "idemkv_outbox_lag_events",
			Help: "Committed events the broker has not acknowledged yet."},
			func() float64 { return float64(r.Stats().LagEvents) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "idemkv_outbox_lag_seconds",
			Help: "Age of the oldest committed event the broker has not acknowledged (0 if none)."},
			func() float64 { return r.Stats().LagSeconds }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "idemkv_outbox_published_total",
			Help: "Events the broker acknowledged (republishes after a crash included)."},
			func() float64 { return float64(r.Stats().Published) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "idemkv_outbox_publish_errors_total",
			Help: "Publishes that failed (the event is published again, never dropped)."},
			func() float64 { return float64(r.Stats().PublishErrors) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "idemkv_outbox_rollbacks_total",
			Help: "Times the store no longer held events the relay had published (restored, or failed over) and the relay read it again from its cursor."},
			func() float64 { return float64(r.Stats().Rollbacks) }),
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
