package bench

import (
	"context"
	"fmt"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/bench/internal/baseline"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/engine/lowprio"
)

// Store is a store under test: the idemkv contract plus what the harness
// needs to verify and measure it.
type Store interface {
	idemkv.Store
	// GetData reads a value written through Effects. It returns an error
	// wrapping idemkv.ErrNotFound if the key is absent.
	GetData(key []byte) ([]byte, error)
	// Settle flushes the memtable and compacts the whole key space, so that
	// Disk reports the size of the data at rest.
	Settle(ctx context.Context) error
	// Disk reports the store's Pebble size and write figures.
	Disk() (Disk, error)
}

// Disk is a store's Pebble figures.
type Disk struct {
	// TableBytes is the size of all live sstables, in bytes.
	TableBytes uint64
	// WriteAmp is Pebble's write amplification over the store's life:
	// bytes written to sstables by flushes and compactions per byte
	// flushed.
	WriteAmp float64
	// DiskBytes is the size of all the store's files (sstables, WAL,
	// manifest), in bytes.
	DiskBytes uint64
}

// Target is one implementation under test. Open opens a fresh store in
// dir on fs; the harness passes a filesystem that counts syncs.
type Target struct {
	Name string
	Open func(dir string, fs vfs.FS) (Store, error)
}

// EngineTarget is the engine opened with opts (nil: defaults), its FS
// replaced by the harness's counting wrapper around it.
func EngineTarget(opts *engine.Options) Target {
	return Target{Name: "engine", Open: func(dir string, fs vfs.FS) (Store, error) {
		o := withFS(opts, fs)
		e, err := engine.Open(dir, o)
		if err != nil {
			return nil, err
		}
		return engineStore{e}, nil
	}}
}

// BaselineTarget is the hand-written raw-Pebble store (see package doc,
// "The baseline") opened with the same opts as the engine.
func BaselineTarget(opts *engine.Options) Target {
	return Target{Name: "baseline", Open: func(dir string, fs vfs.FS) (Store, error) {
		db, err := baseline.Open(dir, withFS(opts, fs))
		if err != nil {
			return nil, err
		}
		return baselineStore{db}, nil
	}}
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

func (s engineStore) Settle(ctx context.Context) error {
	if err := s.Flush(); err != nil {
		return err
	}
	return s.Compact(ctx)
}

func (s engineStore) Disk() (Disk, error) {
	st, err := s.Stats()
	if err != nil {
		return Disk{}, err
	}
	return Disk{TableBytes: st.TableBytes, WriteAmp: st.WriteAmp, DiskBytes: st.DiskBytes}, nil
}

type baselineStore struct{ *baseline.DB }

func (s baselineStore) Settle(ctx context.Context) error {
	if err := s.Flush(); err != nil {
		return err
	}
	return s.Compact(ctx)
}

func (s baselineStore) Disk() (Disk, error) {
	m, err := s.Metrics()
	if err != nil {
		return Disk{}, err
	}
	total := m.Total()
	return Disk{TableBytes: uint64(total.TablesSize), WriteAmp: total.WriteAmp(), DiskBytes: m.DiskSpaceUsage()}, nil
}

// withCompactionNice makes o run its stores' compactions at nice (package
// engine/lowprio) if nice is positive and o does not configure Pebble
// already.
func withCompactionNice(o *engine.Options, nice int) error {
	if nice == 0 || o.ConfigurePebble != nil {
		return nil
	}
	p, err := lowprio.New(&lowprio.Options{Nice: nice, Logger: o.Logger})
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	o.ConfigurePebble = p.Configure
	return nil
}
