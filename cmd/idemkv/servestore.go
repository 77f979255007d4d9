package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/engine/lowprio"
	"github.com/idemkv/idemkv/examples/payments"
	"github.com/idemkv/idemkv/pgstore"
	"github.com/jackc/pgx/v5"
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
	return fmt.Sprintf("%s@%s:%d/%s", cfg.User, cfg.Host, cfg.Port, cfg.Database)
}
