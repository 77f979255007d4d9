// Package engineprom exports an engine's figures to Prometheus: the
// operation counters, held leases and sweeper totals of engine.Stats, the
// claim filter's and the committer's work, and the Pebble gauges worth
// alerting on (level-0 files, compaction debt, disk bytes).
//
// The collector reads one engine.Stats snapshot per scrape and keeps no
// state of its own: nothing is counted between scrapes, and nothing it
// exports survives a restart (the engine's counters start from zero at
// every Open, which rate() and increase() treat as a counter reset). It
// registers only on the registry it is given, never on
// prometheus.DefaultRegisterer.
//
// The families, all prefixed idemkv_engine_, are documented next to their
// descriptors in collector.go; their names are stable. In short: claims,
// takeovers and fenced operations (counters), held leases (gauge), swept
// records and records held past their expiry, uncertain and escalated
// records, the age of the oldest unsettled one and escalations, the claim filter's skips,
// misses and size, the committer's commits, writes, busy time and fsync
// wait, claims the disk guard refused, Pebble's write stalls and the time
// spent in them, and disk bytes, read amplification, level-0 files and
// compaction debt.
//
// # Basics
//
//	e, err := engine.Open("idemkv-data", nil)
//	reg := prometheus.NewRegistry()
//	if err := engineprom.Register(reg, e); err != nil {
//		return err
//	}
//	http.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// examples/payments registers it next to the HTTP middleware's own metrics.
//
// # Caveats
//
//   - One engine per registry: the families have no labels, so a second
//     Register on the same registry fails with a
//     prometheus.AlreadyRegisteredError. To export two engines from one
//     process, register each through prometheus.WrapRegistererWith with
//     a label of its own (each of them: a family cannot mix labelled and
//     unlabelled samples).
//   - A closed or failed engine (idemkv.ErrClosed, idemkv.ErrFailed)
//     exports nothing at all rather than stale values; alert on the
//     absence of idemkv_engine_claims_total, not on its value.
//   - Each scrape costs one Engine.Stats call: a walk of the in-memory
//     lease table under its shard locks and a read of Pebble's metrics,
//     no disk I/O. Scraping every few seconds is fine; every millisecond
//     is not.
package engineprom
