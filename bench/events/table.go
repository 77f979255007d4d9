package events

import (
	"fmt"
	"io"
	"strings"

	"github.com/idemkv/idemkv/bench"
)

// WriteTable writes the report for people: the overhead sweep, the
// loads' lag, the drains, the consumers, and the goals.
func (r *Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	m := &r.Meta
	m.WriteHeader(&b, "bench events")
	relay := "a relay into a publisher with no broker on both sides"
	if !m.Relay {
		relay = "no relay (the outbox grows)"
	}
	fmt.Fprintf(&b, "\nCompletions with one event (%d-byte payload) against without: %gs a side, %d rounds alternating the order, fresh stores, %s\n",
		m.PayloadBytes, m.DurationSeconds, m.Rounds, relay)
	fmt.Fprintf(&b, "%7s %12s %12s %7s %13s %21s %21s %9s %9s %9s\n", "clients", "without/s", "with/s", "ratio",
		"ratio range", "without p50 / p99", "with p50 / p99", "CPU w/o", "CPU with", "backlog")
	for _, p := range r.Overhead {
		wo, wi := p.Rounds[0].Without, p.Rounds[0].With
		var backlog uint64
		for _, rd := range p.Rounds {
			backlog = max(backlog, rd.With.Backlog)
		}
		fmt.Fprintf(&b, "%7d %12s %12s %6.2f× %6.2f-%.2f× %21s %21s %9s %9s %9d\n", p.Concurrency,
			bench.Count(p.WithoutRequestsPerSec), bench.Count(p.WithRequestsPerSec), p.Ratio, p.RatioMin, p.RatioMax,
			bench.Micros(wo.Latency.P50)+" / "+bench.Micros(wo.Latency.P99), bench.Micros(wi.Latency.P50)+" / "+bench.Micros(wi.Latency.P99),
			bench.Micros(1e6*wo.CPUSecondsPerRequest), bench.Micros(1e6*wi.CPUSecondsPerRequest), backlog)
	}
	fmt.Fprintln(&b, "(latency and CPU a request from the first round; backlog: the most events not yet relayed when a side's clients stopped)")
	for _, p := range r.Overhead {
		if s := p.Rounds[0].With.CommitFigures.String(); s != "" {
			fmt.Fprintf(&b, "  %d clients, with: %s; without: %s\n", p.Concurrency, s, p.Rounds[0].Without.CommitFigures.String())
		}
	}

	if len(r.Loads) > 0 {
		fmt.Fprintf(&b, "\nOpen-loop loads relayed to JetStream (embedded, sync_always; fsync p50 %s, p99 %s on the run's disk): %gs, %d clients\n",
			bench.Micros(m.FsyncP50US), bench.Micros(m.FsyncP99US), m.LoadSeconds, m.Clients)
		fmt.Fprintf(&b, "%8s %10s %21s %10s %10s %10s %10s %10s %9s %9s %9s %7s\n", "rate", "delivered", "commit p50 / p99",
			"lag p50", "lag p99", "lag p99.9", "lag max", "relay/s", "backlog", "catch-up", "early", "acks")
		for _, l := range r.Loads {
			fmt.Fprintf(&b, "%8s %10s %21s %10s %10s %10s %10s %10s %9d %8.1fs %9d %7d\n", bench.Count(l.Rate),
				bench.Count(l.DeliveredPerSec), bench.Micros(l.Latency.P50)+" / "+bench.Micros(l.Latency.P99),
				bench.Micros(l.Lag.P50), bench.Micros(l.Lag.P99), bench.Micros(l.Lag.P999), bench.Micros(l.Lag.Max),
				bench.Count(l.RelayEventsPerSec), l.MaxBacklog, l.CatchUpSeconds, l.PublishedBeforeReturn, l.RelayAcks)
			if l.Unpublished > 0 {
				fmt.Fprintf(&b, "  %d events still unpublished at the end of the catch-up: their lag is a lower bound\n", l.Unpublished)
			}
		}
		fmt.Fprintln(&b, "(lag: Complete's return to PubAck; relay/s: events acknowledged while the load ran; early: acknowledged before Complete returned, lag 0; acks: the relay's outbox acknowledgements)")
	}
	if len(r.Drains) > 0 {
		fmt.Fprintf(&b, "\nDraining a backlog of %s events:\n", bench.Count(float64(m.Backlog)))
		for _, d := range r.Drains {
			fmt.Fprintf(&b, "  %-34s %10s events/s  (%s each)\n", d.Name, bench.Count(d.EventsPerSec), bench.Micros(1e6*d.Seconds/float64(d.Events)))
		}
	}
	if len(r.Consumers) > 0 {
		fmt.Fprintf(&b, "\nConsuming the stream's first %s messages, in order:\n", bench.Count(float64(m.Backlog)))
		for _, c := range r.Consumers {
			fmt.Fprintf(&b, "  %-34s %10s events/s  (%s each", c.Name, bench.Count(c.EventsPerSec), bench.Micros(1e6*c.Seconds/float64(c.Events)))
			if c.CommitsPerEvent > 0 {
				fmt.Fprintf(&b, ", %.2f commits each; %s", c.CommitsPerEvent, c.CommitFigures)
			}
			fmt.Fprintln(&b, ")")
		}
	}
	if len(r.Goals) > 0 {
		fmt.Fprintln(&b)
		for _, g := range r.Goals {
			met := "met"
			if !g.Met {
				met = "NOT met"
			}
			fmt.Fprintf(&b, "goal: %s: %.3f (bound %g): %s\n", g.Name, g.Measured, g.Target, met)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
