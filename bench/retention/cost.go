package retention

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/idemkv/idemkv/bench"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/ttl"
)

// SweepCost is the sweeper's cost, measured on its own: a store of CostKeys
// records is swept once while none has expired (a pass that only reads)
// and once after all have (a pass that deletes them all), at no rate
// limit; then the store is compacted to turn the tombstones into free
// space.
type SweepCost struct {
	Keys int `json:"keys"` // the number of records swept
	// IdlePassCPUSeconds is the CPU time of a pass with nothing expired,
	// which reads no record (it seeks past the buckets that have not
	// ended), in seconds.
	IdlePassCPUSeconds float64 `json:"idle_pass_cpu_seconds"`
	// CPUPerMillionDeleted is the CPU time per million records deleted by
	// a pass, its reads of them included, in seconds.
	CPUPerMillionDeleted float64 `json:"cpu_seconds_per_million_deleted"`
	DeletedPerSec        float64 `json:"deleted_per_sec"`    // the unlimited deleting pass's rate, records/s
	TableBytesBefore     uint64  `json:"table_bytes_before"` // the sstable bytes before the deleting pass
	// TableBytesAfter is the sstable bytes after it and the flush and
	// compaction that follow it.
	TableBytesAfter uint64 `json:"table_bytes_after"`
	// CompactionBytesPerDeletedByte is what reclaiming the space wrote:
	// sstable bytes written by the flush and compaction per byte of
	// records deleted.
	CompactionBytesPerDeletedByte float64 `json:"compaction_bytes_per_deleted_byte"`
}

// Guide extrapolates to the guide's scale: 5,000 requests/s, 24 h.
type Guide struct {
	KeysPerDay      float64 `json:"keys_per_day"`       // 5,000/s over 24 h: 432 M
	BytesPerLiveKey float64 `json:"bytes_per_live_key"` // the sweeper run's TableBytesPerLiveKey
	// SweepLagFraction is the longest a record stays after it expires, as
	// a share of the day, at the engine's default sweeper settings:
	// (bucket width + interval + pass) / 24 h.
	SweepLagFraction float64 `json:"sweep_lag_fraction"`
	StoreBytes       float64 `json:"store_bytes"` // KeysPerDay × BytesPerLiveKey, in bytes
	// SweeperCores is the sweeper's share of the machine, in cores: the
	// day's deletes, reads included, and its idle passes, at the measured
	// costs.
	SweeperCores float64 `json:"sweeper_cores"`
	// PassSeconds is how long a pass over the records that expire in one
	// interval takes at the default rate, in seconds.
	PassSeconds float64 `json:"pass_seconds"`
}

// sweepCost measures the sweeper on its own, on a store in dir whose
// clock the run moves.
func sweepCost(ctx context.Context, o *Options, dir string) (SweepCost, error) {
	e, clock, err := costStore(ctx, o, dir)
	if err != nil {
		return SweepCost{}, err
	}
	defer e.Close()
	res := SweepCost{Keys: o.CostKeys}
	// Nothing expired: a pass that skips every bucket.
	if _, res.IdlePassCPUSeconds, _, err = pass(ctx, e); err != nil {
		return SweepCost{}, err
	}
	before, err := e.Stats()
	if err != nil {
		return SweepCost{}, err
	}
	clock.Advance(2 * time.Hour)
	p, cpu, wall, err := pass(ctx, e)
	if err != nil {
		return SweepCost{}, err
	}
	if p.Deleted != o.CostKeys {
		return SweepCost{}, fmt.Errorf("the pass deleted %d of %d expired records", p.Deleted, o.CostKeys)
	}
	if err := settle(ctx, e); err != nil {
		return SweepCost{}, err
	}
	after, err := e.Stats()
	if err != nil {
		return SweepCost{}, err
	}
	res.CPUPerMillionDeleted = cpu / float64(p.Deleted) * 1e6
	res.DeletedPerSec = float64(p.Deleted) / wall
	res.TableBytesBefore, res.TableBytesAfter = before.TableBytes, after.TableBytes
	res.CompactionBytesPerDeletedByte = float64(after.TableBytesWritten-before.TableBytesWritten) / float64(max(1, p.DeletedBytes))
	return res, nil
}

// costStore seeds a store in dir with o.CostKeys completed records that
// expire in an hour of its clock (bench.Seed), opens it with the sweeper
// stopped and unlimited, and flushes and compacts it. It returns the
// store and its clock.
func costStore(ctx context.Context, o *Options, dir string) (*engine.Engine, *fakeclock.Clock, error) {
	clock := fakeclock.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	eo := *o.Engine
	eo.Clock, eo.Retention, eo.NoBackgroundSweep = clock, time.Hour, true
	eo.Sweep = ttl.Options{Rate: -1}
	if err := bench.Seed(ctx, dir, &eo, uint64(time.Now().UnixNano()), o.CostKeys, o.Tenants, nil); err != nil {
		return nil, nil, err
	}
	e, err := engine.Open(dir, &eo)
	if err != nil {
		return nil, nil, err
	}
	if err := settle(ctx, e); err != nil {
		return nil, nil, errors.Join(err, e.Close())
	}
	return e, clock, nil
}

// pass runs one sweeper pass and returns it, its CPU time and its wall
// time, in seconds.
func pass(ctx context.Context, e *engine.Engine) (p ttl.Pass, cpu, wall float64, err error) {
	cpu0, t0 := bench.CPUTime(), time.Now()
	p, err = e.Sweep(ctx)
	return p, (bench.CPUTime() - cpu0).Seconds(), time.Since(t0).Seconds(), err
}

// settle flushes and compacts e.
func settle(ctx context.Context, e *engine.Engine) error {
	if err := e.Flush(); err != nil {
		return err
	}
	return e.Compact(ctx)
}

// guide extrapolates the sweeper run to the guide's 5,000 requests/s and
// 24 h, with the sweeper settings of o (the engine's defaults unless they
// are set).
func guide(run Steady, cost SweepCost, o *engine.Options) Guide {
	const rate, day = 5000.0, 86400.0
	g := Guide{KeysPerDay: rate * day}
	// The run's bytes per live key include its own sweep lag (its interval
	// and pass time against a short window, a larger share than the
	// defaults' against 24 h), so the store size below is conservative.
	g.BytesPerLiveKey = run.TableBytesPerLiveKey
	// A pass reads the records whose buckets ended since the last one:
	// an interval's worth of the day's keys. A record is swept at most a
	// bucket's width, an interval and a pass after it expires.
	so := o.Sweep.EnsureDefaults()
	if so.Rate > 0 {
		g.PassSeconds = g.KeysPerDay * so.Interval.Seconds() / day / so.Rate
	}
	width := day / float64(engine.BucketsPerWindow)
	g.SweepLagFraction = (width + so.Interval.Seconds() + g.PassSeconds) / day
	g.StoreBytes = g.KeysPerDay * g.BytesPerLiveKey
	passesPerDay := day / math.Max(so.Interval.Seconds(), g.PassSeconds)
	g.SweeperCores = (passesPerDay*cost.IdlePassCPUSeconds)/day + rate*cost.CPUPerMillionDeleted/1e6
	return g
}
