package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/engine/lowprio"
	"github.com/idemkv/idemkv/examples/payments"
	"github.com/idemkv/idemkv/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
)

// A store serve runs on: the Pebble engine under --data (the default), or
// PostgreSQL with --store.
type serveStore interface {
	payments.Store
	idemkv.Outbox
	Close() error
}

var (
	_ serveStore = (*engine.Engine)(nil)
	_ serveStore = (*pgstore.Store)(nil)
)

// servedStore is the store serve opened, and what its banner and limits
// say of it.
type servedStore struct {
	store serveStore
	// describe names the store; note adds the engine's tuning.
	describe, note string
	maxConns       int
	lease          time.Duration
	prio           *lowprio.Priority
}

// validStoreFlag checks --store: empty, or a PostgreSQL URL pgx can read.
func validStoreFlag(url string) error {
	if url == "" {
		return nil
	}
	if !strings.HasPrefix(url, "postgres://") && !strings.HasPrefix(url, "postgresql://") {
		return errors.New("--store takes a PostgreSQL URL, postgres://USER@HOST:PORT/DB (the Pebble store is --data DIR)")
	}
	if _, err := pgx.ParseConfig(url); err != nil {
		return fmt.Errorf("--store: %w", err)
	}
	return nil
}

// openStore opens the store c names.
func (c *serveConfig) openStore(ctx context.Context) (servedStore, error) {
	_, maxConns := fileBudget()
	if c.store != "" {
		s, err := pgstore.Open(ctx, c.store, nil)
		if err != nil {
			return servedStore{}, err
		}
		return servedStore{store: s, describe: "postgres " + redactURL(c.store), maxConns: maxConns,
			lease: 30 * time.Second}, nil
	}
	o, prio, err := c.bg.apply(nil)
	if err != nil {
		return servedStore{}, err
	}
	storeFiles, maxConns := fileBudget()
	o.ConfigurePebble = keepFilesUnder(storeFiles, o.ConfigurePebble)
	memLimit := memoryLimit()
	maxConns = fitMemory(o, memLimit, maxConns)
	if err := unfinishedRestore(c.dir); err != nil {
		return servedStore{}, err
	}
	e, err := engine.Open(c.dir, o)
	if err != nil {
		return servedStore{}, err
	}
	eo := o.EnsureDefaults()
	return servedStore{store: e, describe: c.dir, maxConns: maxConns, lease: eo.Lease, prio: prio,
		note: fmt.Sprintf(", compactions at nice %d; caches %d+%d MiB%s", c.bg.nice,
			eo.ReplayCacheSize>>20, eo.CacheSize>>20, limitNote(memLimit))}, nil
}

// redactURL is the connection string without its password, for logs.
func redactURL(url string) string {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return "(unreadable URL)"
	}
	hosts := fmt.Sprintf("%s:%d", cfg.Host, cfg.Port)
	for _, f := range cfg.Fallbacks {
		if h := fmt.Sprintf("%s:%d", f.Host, f.Port); !strings.Contains(hosts, h) {
			hosts += "," + h
		}
	}
	return fmt.Sprintf("%s@%s/%s", cfg.User, hosts, cfg.Database)
}

// registerStoreMetrics exports, for a PostgreSQL store, what the engine's
// collector exports of settling and contention (idemkv_pgstore_*): the
// records awaiting settling, read at each scrape, and the counts of this
// process's claims, conflicts and fenced writes.
func registerStoreMetrics(reg prometheus.Registerer, st serveStore) error {
	s, ok := st.(*pgstore.Store)
	if !ok {
		return nil // the engine's are registered by payments
	}
	unsettled := func(read func(pgstore.Unsettled) float64) func() float64 {
		return func() float64 {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			u, err := s.Unsettled(ctx)
			if err != nil {
				return math.NaN()
			}
			return read(u)
		}
	}
	counter := func(name, help string, read func(idemkv.Counts) int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(read(s.Counts())) })
	}
	for _, c := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "idemkv_pgstore_uncertain_records",
			Help: "Uncertain records awaiting reconciliation (not escalated)."},
			unsettled(func(u pgstore.Unsettled) float64 { return float64(u.Uncertain) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "idemkv_pgstore_escalated_records",
			Help: "Escalated records awaiting an operator."},
			unsettled(func(u pgstore.Unsettled) float64 { return float64(u.Escalated) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "idemkv_pgstore_abandoned_records",
			Help: "Remote records in progress past their lease."},
			unsettled(func(u pgstore.Unsettled) float64 { return float64(u.Abandoned) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "idemkv_pgstore_oldest_unsettled_seconds",
			Help: "Age of the oldest uncertain or abandoned record (0 if none)."},
			unsettled(func(u pgstore.Unsettled) float64 {
				if u.Oldest.IsZero() {
					return 0
				}
				return s.Now().Sub(u.Oldest).Seconds()
			})),
		counter("idemkv_pgstore_claims_total", "Claims this process made.", func(st idemkv.Counts) int64 { return st.Claims }),
		counter("idemkv_pgstore_conflicts_total", "Transactions of this process that failed to serialize and ran again.", func(st idemkv.Counts) int64 { return st.Conflicts }),
		counter("idemkv_pgstore_fenced_total", "Writes of this process refused because their token was no longer current.", func(st idemkv.Counts) int64 { return st.Fenced }),
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
