package day

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/bench"
	"github.com/idemkv/idemkv/engine"
)

// runClock is a store's time during a run: it stands still between the
// phases (Open, Check, Backup) and runs at the wall clock's pace while
// traffic runs, so a store's expiries advance with the requests it
// takes and never step back across its Opens. It is its own steady
// clock, so the engine takes its standing still for time, not a step.
type runClock struct {
	mu      sync.Mutex
	base    time.Time
	started time.Time // zero while stopped
}

func (c *runClock) Now() time.Time {
	now, _ := c.Read()
	return now
}

// Read implements idemkv.SteadyClock: the elapsed time is the run's.
func (c *runClock) Read() (time.Time, time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.base
	if !c.started.IsZero() {
		now = c.base.Add(time.Since(c.started))
	}
	return now, now.Sub(epoch)
}

// epoch is the fixed point of runClock's steady time.
var epoch = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)

func (c *runClock) run() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started.IsZero() {
		c.started = time.Now()
	}
}

func (c *runClock) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.started.IsZero() {
		c.base = c.base.Add(time.Since(c.started))
		c.started = time.Time{}
	}
}

// WindowPoint is one window of the open-loop phase.
type WindowPoint struct {
	Second   float64       `json:"second"`    // the window's end, seconds into the phase
	Requests int64         `json:"requests"`  // the requests that ended in the window
	Latency  bench.Latency `json:"latency"`   // theirs, from each one's scheduled time
	RSS      uint64        `json:"rss_bytes"` // the process's resident memory at the window's end
	LSM      LSMPoint      `json:"lsm"`       // the store's LSM tree in the window
}

// LSMPoint is the store's LSM tree in one window (engine.Stats): where
// the tail's time goes when it is the tree's.
type LSMPoint struct {
	ReadAmp        int     `json:"read_amp"`              // sublevels a read may visit, at the window's end
	L0Files        int64   `json:"l0_files"`              // files in level 0, at the window's end
	CompactionDebt uint64  `json:"compaction_debt_bytes"` // bytes compaction still owes, at the window's end
	Compactions    int64   `json:"compactions"`           // compactions that ended in the window
	Flushes        int64   `json:"flushes"`               // memtable flushes in the window
	StallSeconds   float64 `json:"stall_seconds"`         // time writes were stopped by Pebble in the window
	SyncWait       float64 `json:"sync_wait_seconds"`     // commit time spent waiting for the WAL's fsync in the window
}

// lsmSampler reads an engine's Stats at each window's end, off the
// goroutine that paces the requests, so that its cost delays none.
type lsmSampler struct {
	e    *engine.Engine
	mu   sync.Mutex // held by a sample: one at a time, in order
	last engine.Stats
	wg   sync.WaitGroup
}

// sampleInto reads the tree in the background and stores it in *p under
// mu, the lock of the points p is among.
func (l *lsmSampler) sampleInto(mu *sync.Mutex, points *[]WindowPoint, i int) {
	l.wg.Go(func() {
		tree := l.sample()
		mu.Lock()
		(*points)[i].LSM = tree
		mu.Unlock()
	})
}

func (l *lsmSampler) sample() LSMPoint {
	l.mu.Lock()
	defer l.mu.Unlock()
	st, err := l.e.Stats()
	if err != nil {
		return LSMPoint{}
	}
	p := LSMPoint{ReadAmp: st.ReadAmp, L0Files: st.L0Files, CompactionDebt: st.CompactionDebt,
		Compactions: st.Compactions - l.last.Compactions, Flushes: st.Flushes - l.last.Flushes,
		StallSeconds: (st.WriteStallTime - l.last.WriteStallTime).Seconds(),
		SyncWait:     (st.CommitSyncWait - l.last.CommitSyncWait).Seconds()}
	l.last = st
	return p
}

// requester sends the run's requests: new keys (claim, then complete),
// retries of keys completed earlier in the run, and duplicates (the same
// new key twice at once). Every answer is checked.
type requester struct {
	e      *engine.Engine
	stream uint64
	next   atomic.Uint64
	// done holds recently completed requests for retries.
	mu      sync.Mutex
	done    []uint64
	tenants int
}

func (q *requester) id(i uint64) idemkv.ID { return bench.Key(q.stream, i, q.tenants) }

// fresh claims and completes a new key.
func (q *requester) fresh(ctx context.Context) error {
	i := q.next.Add(1)
	c, err := q.e.Claim(ctx, idemkv.ClaimRequest{ID: q.id(i), Fingerprint: bench.Fingerprint(q.stream, i, false)})
	if err != nil {
		return err
	}
	if c.Outcome != idemkv.Acquired {
		return fmt.Errorf("%w: a new key's claim was %v", bench.ErrViolation, c.Outcome)
	}
	if err := q.e.Complete(ctx, c.Lease, bench.Result(q.stream, i, nil), nil); err != nil {
		return err
	}
	q.mu.Lock()
	if len(q.done) < 1<<14 {
		q.done = append(q.done, i)
	} else {
		q.done[i%(1<<14)] = i
	}
	q.mu.Unlock()
	return nil
}

// retry claims a key completed earlier, which must replay.
func (q *requester) retry(ctx context.Context, r *rand.Rand) error {
	q.mu.Lock()
	if len(q.done) == 0 {
		q.mu.Unlock()
		return q.fresh(ctx)
	}
	i := q.done[r.IntN(len(q.done))]
	q.mu.Unlock()
	c, err := q.e.Claim(ctx, idemkv.ClaimRequest{ID: q.id(i), Fingerprint: bench.Fingerprint(q.stream, i, false)})
	if err != nil {
		return err
	}
	if c.Outcome != idemkv.Replay {
		return fmt.Errorf("%w: a completed key's retry was %v", bench.ErrViolation, c.Outcome)
	}
	return nil
}

// duplicate sends a new key twice at once: one claim acquires and
// completes, the other sees it in progress or replays it.
func (q *requester) duplicate(ctx context.Context) error {
	i := q.next.Add(1)
	req := idemkv.ClaimRequest{ID: q.id(i), Fingerprint: bench.Fingerprint(q.stream, i, false)}
	var wg sync.WaitGroup
	var outcomes [2]idemkv.Outcome
	var errs [2]error
	for k := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := q.e.Claim(ctx, req)
			outcomes[k], errs[k] = c.Outcome, err
			if err == nil && c.Outcome == idemkv.Acquired {
				errs[k] = q.e.Complete(ctx, c.Lease, bench.Result(q.stream, i, nil), nil)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	acquired := 0
	for _, o := range outcomes {
		switch o {
		case idemkv.Acquired:
			acquired++
		case idemkv.InProgress, idemkv.Replay:
		default:
			return fmt.Errorf("%w: a duplicate's claim was %v", bench.ErrViolation, o)
		}
	}
	if acquired != 1 {
		return fmt.Errorf("%w: %d of two duplicates acquired", bench.ErrViolation, acquired)
	}
	return nil
}

// openLoop sends requests at rate for d, each on its own goroutine at its
// scheduled time, and measures each from its scheduled time (so a stall
// shows in the latency of every request it delayed). It returns a point
// per window.
func (q *requester) openLoop(ctx context.Context, o *Options, d time.Duration) ([]WindowPoint, bench.Latency, error) {
	interval := time.Duration(float64(time.Second) / o.Rate)
	start := time.Now()
	var (
		mu       sync.Mutex
		cur      = bench.NewHistogram()
		all      = bench.NewHistogram()
		points   []WindowPoint
		firstErr error
		wg       sync.WaitGroup
	)
	record := func(lat time.Duration, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil && firstErr == nil {
			firstErr = err
		}
		cur.Record(lat)
		all.Record(lat)
	}
	windowEnd := start.Add(o.Window)
	lsm := &lsmSampler{e: q.e}
	lsm.sample()
	r := rand.New(rand.NewPCG(q.stream, 1))
	for n := int64(0); ; n++ {
		at := start.Add(time.Duration(n) * interval)
		if at.Sub(start) >= d || ctx.Err() != nil {
			break
		}
		if !at.Before(windowEnd) {
			mu.Lock()
			points = append(points, WindowPoint{Second: windowEnd.Sub(start).Seconds(), Requests: cur.Count(), Latency: cur.Latency(), RSS: rss()})
			lsm.sampleInto(&mu, &points, len(points)-1)
			cur.Reset()
			stop := firstErr != nil
			mu.Unlock()
			if stop {
				break
			}
			windowEnd = windowEnd.Add(o.Window)
		}
		if wait := time.Until(at); wait > 0 {
			time.Sleep(wait) // pacing the load, not synchronizing
		}
		kind := r.Float64()
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			switch {
			case kind < o.Retries:
				err = q.retry(ctx, rand.New(rand.NewPCG(uint64(n), 2)))
			case kind < o.Retries+o.Duplicates:
				err = q.duplicate(ctx)
			default:
				err = q.fresh(ctx)
			}
			record(time.Since(at), err)
		}()
	}
	wg.Wait()
	lsm.wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if cur.Count() > 0 {
		points = append(points, WindowPoint{Second: time.Since(start).Seconds(), Requests: cur.Count(), Latency: cur.Latency(), RSS: rss(), LSM: lsm.sample()})
	}
	return points, all.Latency(), firstErr
}

// closedLoop runs clients goroutines that each claim and complete new
// keys back to back for d, and returns the requests per second.
func (q *requester) closedLoop(ctx context.Context, clients int, d time.Duration) (float64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var n atomic.Int64
	errc := make(chan error, clients)
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				if err := q.fresh(ctx); err != nil {
					errc <- err
					cancel()
					return
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		return 0, err
	}
	return float64(n.Load()) / time.Since(start).Seconds(), nil
}
