package workloads

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/bench"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/engine/baseline"
)

// Store is a store under test: the idemkv contract plus what the harness
// needs to verify and measure it.
type Store interface {
	idemkv.Store
	idemkv.DataReader
	// Settle flushes the memtable and compacts the whole key space, and
	// returns the size of the data at rest.
	Settle(ctx context.Context) (disk, error)
}

// disk is a store's Pebble figures.
type disk struct {
	// TableBytes is the size of all live sstables, in bytes.
	TableBytes uint64
	// WriteAmp is Pebble's write amplification since the store was
	// opened: bytes written to sstables by flushes and compactions per
	// byte flushed.
	WriteAmp float64
}

// Target is one implementation under test.
type Target struct {
	Name string
	// External says the store does its work in another process (a
	// database server): the harness's fsync, batch and CPU counters do
	// not see it, and the report leaves them out.
	External bool
	// Open opens the store in dir, creating it if needed, on fs: the
	// harness passes a filesystem that counts syncs.
	Open func(dir string, fs vfs.FS) (Store, error)
	// Seed writes n completed records of stream (bench.Key, bench.Result
	// with body, no effect) into a new store in dir, which Open then opens
	// with the records in it, as they would be had requests completed
	// them.
	Seed func(ctx context.Context, dir string, stream uint64, n, tenants int, body []byte) error
}

// engineTarget is the engine opened with opts (nil: defaults), its FS
// replaced by the harness's counting wrapper around it. It is seeded
// through engine.Load (bench.Seed), in the layout the engine writes.
func engineTarget(opts *engine.Options) Target {
	return Target{Name: "engine",
		Open: func(dir string, fs vfs.FS) (Store, error) {
			e, err := engine.Open(dir, withFS(opts, fs))
			if err != nil {
				return nil, err
			}
			return engineStore{e}, nil
		},
		Seed: func(ctx context.Context, dir string, stream uint64, n, tenants int, body []byte) error {
			return bench.Seed(ctx, dir, opts, stream, n, tenants, body)
		},
	}
}

// baselineTarget is the hand-written raw-Pebble store (see package doc,
// "The baseline") opened with the same opts as the engine. It is seeded
// through its own claims and completions: its layout is its own.
func baselineTarget(opts *engine.Options) Target {
	open := func(dir string, fs vfs.FS) (Store, error) {
		db, err := baseline.Open(dir, withFS(opts, fs))
		if err != nil {
			return nil, err
		}
		return baselineStore{db}, nil
	}
	return Target{Name: "baseline", Open: open,
		Seed: func(ctx context.Context, dir string, stream uint64, n, tenants int, body []byte) error {
			s, err := open(dir, opts.EnsureDefaults().FS)
			if err != nil {
				return err
			}
			return errors.Join(load(ctx, s, stream, n, tenants, body), s.Close())
		},
	}
}

// withFS returns a copy of opts whose FS is fs.
func withFS(opts *engine.Options, fs vfs.FS) *engine.Options {
	var o engine.Options
	if opts != nil {
		o = *opts
	}
	o.FS = fs
	return &o
}

type engineStore struct{ *engine.Engine }

func (s engineStore) Settle(ctx context.Context) (disk, error) {
	err := s.Flush()
	if err == nil {
		err = s.Compact(ctx)
	}
	st, serr := s.Stats()
	return disk{TableBytes: st.TableBytes, WriteAmp: st.WriteAmp}, errors.Join(err, serr)
}

type baselineStore struct{ *baseline.DB }

func (s baselineStore) Settle(ctx context.Context) (disk, error) {
	err := s.Flush()
	if err == nil {
		err = s.Compact(ctx)
	}
	m, merr := s.Metrics()
	if err = errors.Join(err, merr); err != nil {
		return disk{}, err
	}
	total := m.Total()
	return disk{TableBytes: uint64(total.TablesSize), WriteAmp: total.WriteAmp()}, nil
}

// load stores n completed records of stream (status, 32-byte pointer and
// body, no effect) in s, claiming and completing each, with 64 concurrent
// clients.
func load(ctx context.Context, s Store, stream uint64, n, tenants int, body []byte) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range 64 {
		wg.Go(func() {
			for i := uint64(next.Add(1) - 1); i < uint64(n); i = uint64(next.Add(1) - 1) {
				c, err := bench.ClaimNew(ctx, s, stream, i, tenants, idemkv.ModeLocal)
				if err == nil {
					err = s.Complete(ctx, c.Lease, bench.Result(stream, i, body), nil)
				}
				if err != nil {
					errs <- err
					next.Store(int64(n))
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}
