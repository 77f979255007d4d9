package pgstore

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The fleet's one clock. Every process sharing a database decides leases,
// expiry and retention by the time it reads; if each read its own wall
// clock, a process whose clock ran ahead by S would take over a lease, or
// treat a record as expired, S early. The default clock is the database's
// instead: read at Open and again every clockSyncInterval, and between
// reads carried forward on the process's monotonic clock, so the process's
// wall clock (and any step of it) never enters a decision. Its error is
// half the round trip of the read it keeps plus the monotonic clock's drift
// over one interval: microseconds to milliseconds, against minutes of skew.

// clockSyncInterval is how often the database's clock is read again.
const clockSyncInterval = 10 * time.Second

// clockSamples is how many reads one sync takes; it keeps the one with the
// shortest round trip, the least uncertain.
const clockSamples = 3

// clockSyncTimeout bounds one sync, connection included: a sync that
// cannot finish keeps the last read.
const clockSyncTimeout = 2 * time.Second

// clockStale is how old the last read may grow before Health reports the
// clock: the monotonic clock carries it on, but its drift is unbounded.
const clockStale = time.Minute

// dbClock is the database's clock, carried forward locally between reads.
type dbClock struct {
	pool  *pgxpool.Pool
	local func() time.Time // the process's clock: time.Now, skewed in tests

	mu   sync.Mutex
	base time.Time // the database's time at the kept read
	at   time.Time // the local reading that corresponds to base
	last time.Time // the last time Now returned: it never goes back
	// synced is the local reading of the last read that succeeded.
	synced time.Time
}

func newDBClock(ctx context.Context, pool *pgxpool.Pool, local func() time.Time) (*dbClock, error) {
	if local == nil {
		local = time.Now
	}
	c := &dbClock{pool: pool, local: local}
	if err := c.sync(ctx); err != nil {
		return nil, fmt.Errorf("pgstore: read the database's clock: %w", err)
	}
	return c, nil
}

// Now implements idemkv.Clock.
func (c *dbClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.base.Add(c.local().Sub(c.at))
	if now.Before(c.last) {
		now = c.last // a later read placed the database's time a little earlier
	}
	c.last = now
	return now
}

// sync reads the database's clock clockSamples times on one connection
// and keeps the read with the shortest round trip, placing it at the
// round trip's middle. The connection is taken first, so that a wait for
// a busy pool is not part of any round trip.
func (c *dbClock) sync(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, clockSyncTimeout)
	defer cancel()
	conn, err := c.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	var best time.Duration = -1
	var base, at time.Time
	for range clockSamples {
		var db time.Time
		t0 := c.local()
		if err := conn.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&db); err != nil {
			return err
		}
		t1 := c.local()
		if rtt := t1.Sub(t0); best < 0 || rtt < best {
			best, base, at = rtt, db, t0.Add(rtt/2)
		}
	}
	c.mu.Lock()
	c.base, c.at, c.synced = base, at, c.local()
	c.mu.Unlock()
	return nil
}

// stale reports a clock not read for clockStale: nil, or why.
func (c *dbClock) stale() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if age := c.local().Sub(c.synced); age > clockStale {
		return fmt.Errorf("pgstore: the database's clock was last read %v ago", age.Round(time.Second))
	}
	return nil
}

// run syncs every clockSyncInterval until ctx is done. A failed read
// keeps the last one: the monotonic clock carries it on.
func (c *dbClock) run(ctx context.Context) {
	t := time.NewTicker(clockSyncInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = c.sync(ctx)
		}
	}
}
