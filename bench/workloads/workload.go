package workloads

import (
	"context"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/bench"
)

// Workload names, in the order a run measures them.
const (
	// unique: every request a new key: local claim, a 16-byte effect,
	// complete.
	unique = "unique"
	// retry: like unique, but a fraction of requests re-send a recent key,
	// some while its first request is still running.
	retry = "retry"
	// hot: bursts of concurrent duplicates of few keys: the first claim of
	// a key completes it, the rest replay it or see it in progress.
	hot = "hot"
	// replay: read-only replays of preloaded completed keys.
	replay = "replay"
	// mismatch: a preloaded key re-sent with a different fingerprint:
	// answered mismatch, nothing written.
	mismatch = "mismatch"
	// remote: every request a new key: durable remote claim, a simulated
	// downstream call of Options.RemoteLatency, complete.
	remote = "remote"
)

// Names returns every workload's name, in run order.
func Names() []string {
	names := make([]string, len(workloads))
	for i, w := range workloads {
		names[i] = w.name
	}
	return names
}

// workload is one request mix. A request is one client call as a server
// would make it: the claim and whatever its outcome requires.
type workload struct {
	name string
	// readOnly workloads run against preloaded completed keys and write
	// nothing; they share one store per target across the sweep.
	readOnly bool
	// request runs one request for worker w.
	request func(ctx context.Context, w *worker) error
}

var workloads = []*workload{
	{name: unique, request: uniqueRequest},
	{name: retry, request: retryRequest},
	{name: hot, request: hotRequest},
	{name: replay, readOnly: true, request: replayRequest},
	{name: mismatch, readOnly: true, request: mismatchRequest},
	{name: remote, request: remoteRequest},
}

func workloadByName(name string) *workload {
	for _, w := range workloads {
		if w.name == name {
			return w
		}
	}
	return nil
}

// point is the state the workers of one measurement share.
type point struct {
	o     *Options
	store Store
	// stream is this point's first key stream: worker w's own new keys are
	// stream+1+w; hot keys are stream. Preloaded keys are preStream.
	stream, preStream uint64
	preloaded         uint64

	// retry: the most recently acquired new keys, as w<<40|i + 1 (0 empty).
	recent    []atomic.Uint64
	recentPos atomic.Uint64

	// hot: the number of hot requests started.
	hotSeq atomic.Uint64
}

// hotKeys returns the number of hot keys the point's requests used.
func (p *point) hotKeys() uint64 {
	d := uint64(p.o.HotDuplicates)
	return (p.hotSeq.Load() + d - 1) / d
}

// worker is one client goroutine of a point.
type worker struct {
	p    *point
	id   uint64
	rng  *rand.Rand
	hist *bench.Histogram
	// fresh counts this worker's new keys (unique, retry, remote): keys
	// 0..fresh-1 of its stream were acquired and completed.
	fresh    uint64
	outcomes Outcomes
}

func (w *worker) stream() uint64 { return w.p.stream + 1 + w.id }

// newKey claims, runs and completes the worker's next new key in mode.
// publish, if set, is called once the claim is acquired.
func (w *worker) newKey(ctx context.Context, mode idemkv.Mode, publish func(i uint64)) error {
	s, i := w.stream(), w.fresh
	c, err := bench.ClaimNew(ctx, w.p.store, s, i, w.p.o.Tenants, mode)
	if err != nil {
		return err
	}
	w.outcomes.Acquired++
	if publish != nil {
		publish(i)
	}
	var apply func(idemkv.Effects) error
	if mode == idemkv.ModeLocal {
		ek, ev := bench.Effect(c.Lease.ID, s, i)
		apply = func(e idemkv.Effects) error { return e.Set(ek, ev) }
	} else if d := w.p.o.RemoteLatency; d > 0 {
		// The downstream call. Sleeping models its latency; it is the
		// workload, not synchronization.
		time.Sleep(d)
	}
	if err := w.p.store.Complete(ctx, c.Lease, bench.Result(s, i, nil), apply); err != nil {
		return err
	}
	w.fresh++
	return nil
}

func uniqueRequest(ctx context.Context, w *worker) error {
	return w.newKey(ctx, idemkv.ModeLocal, nil)
}

func remoteRequest(ctx context.Context, w *worker) error {
	return w.newKey(ctx, idemkv.ModeRemote, nil)
}

// checkReplay checks that a claim of request (s, i) replayed its result.
func checkReplay(c idemkv.Claim, s, i uint64) error {
	want := bench.Result(s, i, nil)
	if c.Outcome != idemkv.Replay {
		return bench.Violation("claim of completed key %v: %v, want replay", c.Record.ID, c.Outcome)
	}
	if got := c.Record.Result; got.Status != want.Status || got.Pointer != want.Pointer {
		return bench.Violation("replay of %v: %d %q, stored %d %q", c.Record.ID, got.Status, got.Pointer, want.Status, want.Pointer)
	}
	return nil
}

// claim claims request (s, i)'s key with its own fingerprint, or another
// one.
func (p *point) claim(ctx context.Context, s, i uint64, other bool) (idemkv.Claim, error) {
	return p.store.Claim(ctx, idemkv.ClaimRequest{ID: bench.Key(s, i, p.o.Tenants), Fingerprint: bench.Fingerprint(s, i, other)})
}

func retryRequest(ctx context.Context, w *worker) error {
	p := w.p
	if pos := p.recentPos.Load(); pos > 0 && w.rng.Float64() < p.o.RetryFraction {
		// Re-send one of the most recently acquired keys: with several
		// workers some are still running.
		back := w.rng.Uint64N(min(pos, uint64(len(p.recent))))
		if v := p.recent[(pos-1-back)%uint64(len(p.recent))].Load(); v != 0 {
			v--
			s, i := p.stream+1+v>>40, v&(1<<40-1)
			c, err := p.claim(ctx, s, i, false)
			if err != nil {
				return err
			}
			if c.Outcome == idemkv.InProgress {
				w.outcomes.InProgress++
				return nil
			}
			w.outcomes.Replay++
			return checkReplay(c, s, i)
		}
	}
	return w.newKey(ctx, idemkv.ModeLocal, func(i uint64) {
		pos := p.recentPos.Add(1)
		p.recent[(pos-1)%uint64(len(p.recent))].Store(w.id<<40 | i + 1)
	})
}

// hotRequest sends request n of the hot sequence: key n/HotDuplicates of
// the point's hot stream.
func hotRequest(ctx context.Context, w *worker) error {
	p := w.p
	i := (p.hotSeq.Add(1) - 1) / uint64(p.o.HotDuplicates)
	c, err := p.claim(ctx, p.stream, i, false)
	if err != nil {
		return err
	}
	switch c.Outcome {
	case idemkv.Acquired:
		w.outcomes.Acquired++
		ek, ev := bench.Effect(c.Lease.ID, p.stream, i)
		return p.store.Complete(ctx, c.Lease, bench.Result(p.stream, i, nil),
			func(e idemkv.Effects) error { return e.Set(ek, ev) })
	case idemkv.InProgress:
		w.outcomes.InProgress++
		return nil
	}
	w.outcomes.Replay++
	return checkReplay(c, p.stream, i)
}

func replayRequest(ctx context.Context, w *worker) error {
	p := w.p
	i := w.rng.Uint64N(p.preloaded)
	c, err := p.claim(ctx, p.preStream, i, false)
	if err != nil {
		return err
	}
	w.outcomes.Replay++
	return checkReplay(c, p.preStream, i)
}

func mismatchRequest(ctx context.Context, w *worker) error {
	p := w.p
	i := w.rng.Uint64N(p.preloaded)
	c, err := p.claim(ctx, p.preStream, i, true)
	if err != nil {
		return err
	}
	if c.Outcome != idemkv.Mismatch {
		return bench.Violation("claim of %v with another fingerprint: %v, want mismatch", bench.Key(p.preStream, i, p.o.Tenants), c.Outcome)
	}
	if c.Record.Result.Status != 0 || c.Record.Result.Pointer != "" {
		return bench.Violation("mismatch on %v leaked the stored result", bench.Key(p.preStream, i, p.o.Tenants))
	}
	w.outcomes.Mismatch++
	return nil
}
