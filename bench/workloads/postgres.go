package workloads

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/idemkv/idemkv/bench/internal/pgsize"
	"github.com/idemkv/idemkv/pgstore"
)

// PostgresTarget is the PostgreSQL store (package pgstore), each of its
// stores a database of its own, which newDB creates on a server and
// returns the connection string of. Its commits, fsyncs and most of its
// CPU happen in the server: the harness's counters do not see them, and
// the report shows "-" for them (Target.External). Its bytes on disk are
// its tables' and indexes' after a VACUUM. opts nil: no background
// sweep, a pool of 16 connections.
func PostgresTarget(newDB func(ctx context.Context, name string) (dsn string, err error), opts *pgstore.Options) Target {
	var (
		mu  sync.Mutex
		dbs = map[string]string{} // store directory -> database
	)
	open := func(ctx context.Context, dir string) (Store, error) {
		mu.Lock()
		dsn, ok := dbs[dir]
		if !ok {
			var err error
			if dsn, err = newDB(ctx, fmt.Sprintf("bench_%d", len(dbs)+1)); err != nil {
				mu.Unlock()
				return nil, err
			}
			dbs[dir] = dsn
		}
		mu.Unlock()
		o := pgstore.Options{NoBackgroundSweep: true, MaxConns: 16} // as bench postgres
		if opts != nil {
			o = *opts
		}
		s, err := pgstore.Open(ctx, dsn, &o)
		if err != nil {
			return nil, err
		}
		return pgStore{s}, nil
	}
	return Target{Name: "pgstore", External: true,
		Open: func(dir string, _ vfs.FS) (Store, error) { return open(context.Background(), dir) },
		Seed: func(ctx context.Context, dir string, stream uint64, n, tenants int, body []byte) error {
			s, err := open(ctx, dir)
			if err != nil {
				return err
			}
			return errors.Join(load(ctx, s, stream, n, tenants, body), s.Close())
		},
	}
}

type pgStore struct{ *pgstore.Store }

// Settle vacuums the store's tables and returns their size with their
// indexes (TOAST included).
func (s pgStore) Settle(ctx context.Context) (disk, error) {
	n, err := pgsize.AtRest(ctx, s.Pool(), "idemkv_records", "idemkv_data")
	return disk{TableBytes: uint64(n)}, err
}
