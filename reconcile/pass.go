package reconcile

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"github.com/idemkv/idemkv"
)

// Pass reads the records awaiting reconciliation (at most
// Options.PerPass of them, oldest first) and handles each one that is
// due: a record older than MaxAge is escalated; any other is asked about,
// and resolved (Applied, NotApplied) or put back with backoff (Unknown),
// or escalated after MaxAttempts. A record is due Grace past the last
// moment its attempt may have sent its downstream call: an abandoned one
// Grace past its lease, an uncertain one Grace past Record.Marked (or past
// this worker's first sight of it, if its store did not keep Marked).
// Every write is a compare-and-set on the token the listing read, so a
// record settled meanwhile (by its holder, another worker or an
// operator) is left as it is. Pass returns an error if the
// listing fails or ctx ends; the failures of single records are counted
// in Stats and retried at a later pass.
func (w *Worker) Pass(ctx context.Context) error {
	w.update(func(s *Stats) { s.Passes++ })
	recs, err := w.due(ctx, w.o.Clock.Now())
	if err != nil {
		w.storeError(err)
		return err
	}
	sem := make(chan struct{}, w.o.Concurrency)
	var wg sync.WaitGroup
	for _, rec := range recs {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			w.settle(ctx, rec)
		}()
	}
	wg.Wait()
	return ctx.Err()
}

// due pages through the listing, from where the last pass stopped, and
// returns the records due at now: at most PerPass records are read a
// pass, and the next pass goes on after them, so that every record is
// reached however many before it are skipped or backing off. The pass
// that reaches the listing's end forgets the backoff of the records that
// the passes since its start did not read.
func (w *Worker) due(ctx context.Context, now time.Time) ([]idemkv.Record, error) {
	w.mu.Lock()
	start := w.cursor
	if start == "" || w.listed == nil {
		w.listed = make(map[idemkv.ID]bool)
	}
	w.mu.Unlock()
	var (
		out  []idemkv.Record
		req  = idemkv.ListRequest{Tenant: w.o.Tenant, Limit: min(w.o.PerPass, 1000), After: start}
		read int
	)
	for {
		page, err := w.store.List(ctx, req)
		if err != nil {
			return nil, fmt.Errorf("reconcile: list: %w", err)
		}
		w.mu.Lock()
		for _, rec := range page.Records {
			w.listed[rec.ID] = true
		}
		w.mu.Unlock()
		for _, rec := range page.Records {
			read++
			if !w.handles(ctx, rec) {
				continue
			}
			if w.isDue(&rec, now) {
				out = append(out, rec)
			}
		}
		next := page.Next
		if next == "" || read >= w.o.PerPass {
			w.mu.Lock()
			w.cursor = next // "" after the last page: the next pass starts over
			if next == "" {
				w.forgetUnlistedLocked()
			}
			w.mu.Unlock()
			return out, nil
		}
		req.After = next
	}
}

// isDue reports whether rec is due at now: Grace past the last moment
// its attempt may have sent a downstream call (a call sent then can be on
// its way for that long), and not in backoff. That moment is an
// abandoned record's LeaseExpires, an uncertain one's Marked, or, for an
// uncertain record whose store keeps no Marked, the moment this worker
// first listed it. Never Created: it is the key's first claim, not this
// attempt's, and rounded down to the second.
func (w *Worker) isDue(rec *idemkv.Record, now time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	b, ok := w.backoff[rec.ID]
	if ok && b.token != rec.Token {
		b, ok = retry{token: rec.Token}, false // another attempt: start afresh
	}
	var sent time.Time // the last moment a call may have been sent
	switch {
	case rec.State == idemkv.StateInProgress:
		sent = rec.LeaseExpires
	case !rec.Marked.IsZero():
		sent = rec.Marked
	default:
		if !ok || b.seen.IsZero() {
			b.token, b.seen = rec.Token, now
			w.backoff[rec.ID] = b
		}
		sent = b.seen
	}
	if now.Before(sent.Add(w.grace())) {
		return false
	}
	return b.attempts == 0 || !now.Before(b.next)
}

// grace is the wait past the last moment a call may have been sent:
// Options.Grace, plus how far the clock runs ahead of its host's wall
// clock (an idemkv.OffsetClock: an engine after a step back of the wall
// clock). Times in a record are the store's, and a downstream that
// enforces a deadline reads a wall clock: while the store's time is ahead,
// a call's deadline comes later by the downstream's clock than by the
// store's, and the call may still land for that much longer.
func (w *Worker) grace() time.Duration {
	if oc, ok := w.o.Clock.(idemkv.OffsetClock); ok {
		if off := oc.WallOffset(); off < 0 {
			return w.o.Grace - off
		}
	}
	return w.o.Grace
}

// Due reports when rec is next due for this worker's question to the
// reconciler (it is asked at the first pass from then on), and the
// Unknown answers it got in a row; asks is false for a record the
// worker leaves alone (Options.Handles). For an uncertain record whose
// store keeps no Marked and that no pass has listed yet, it reports the
// zero time: its grace starts when a pass first lists it. A record older
// than MaxAge is escalated at that pass instead of asked. What it
// reports holds until the record changes, a pass asks, or the clock's
// lead over its host's wall clock (see Options.Grace) changes.
func (w *Worker) Due(rec idemkv.Record) (at time.Time, attempts int, asks bool) {
	if !w.handles(context.Background(), rec) {
		return time.Time{}, 0, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	b, ok := w.backoff[rec.ID]
	if ok && b.token != rec.Token {
		b = retry{}
	}
	grace := w.grace()
	switch {
	case rec.State == idemkv.StateInProgress:
		at = rec.LeaseExpires.Add(grace)
	case !rec.Marked.IsZero():
		at = rec.Marked.Add(grace)
	case !b.seen.IsZero():
		at = b.seen.Add(grace)
	}
	if b.attempts > 0 && b.next.After(at) {
		at = b.next
	}
	return at, b.attempts, true
}

// forgetUnlistedLocked forgets the backoff of the records the passes
// since the listing's start did not read, at its end. REQUIRES: w.mu
// held.
func (w *Worker) forgetUnlistedLocked() {
	for id := range w.backoff {
		if !w.listed[id] {
			delete(w.backoff, id)
		}
	}
	w.listed = nil
}

// settle handles one due record.
func (w *Worker) settle(ctx context.Context, rec idemkv.Record) {
	if age := w.o.Clock.Now().Sub(rec.Created); age >= w.o.MaxAge {
		w.escalate(ctx, rec, fmt.Sprintf("unsettled for %v, past the reconciler's limit of %v", age.Round(time.Second), w.o.MaxAge))
		return
	}
	ans, err := w.ask(ctx, rec)
	if err != nil {
		if p, ok := err.(*panicked); ok {
			w.panicked(ctx, rec, p)
		} else if ctx.Err() != nil {
			return // the worker is stopping: not the record's fault
		}
		w.update(func(s *Stats) { s.Errors++ })
		w.unknown(ctx, rec, err.Error())
		return
	}
	// Since: the store refuses the resolution if the attempt renewed its
	// lease or marked the record after the moment the pass judged it
	// due from: its call may have gone out after the answer.
	req := idemkv.ResolveRequest{ID: rec.ID, Token: rec.Token, Since: rec.LastCall()}
	var applyErr error
	if ans.Apply != nil {
		// Apply runs inside the store's Resolve: a panic in it would
		// unwind through the store. Recovered here, it is an error like
		// any other, and the store writes nothing.
		req.Apply = func(fx idemkv.Effects) (err error) {
			defer func() {
				if v := recover(); v != nil {
					err = &panicked{where: "Answer.Apply", value: v, stack: debug.Stack()}
				}
				applyErr = err
			}()
			return ans.Apply(fx)
		}
	}
	switch ans.Verdict {
	case Applied:
		req.Result = ans.Result
	case NotApplied:
		req.NoEffect = true
	default:
		w.unknown(ctx, rec, cmp.Or(ans.Reason, "the downstream could not say"))
		return
	}
	err = w.store.Resolve(ctx, req)
	switch {
	case err == nil:
		w.forget(rec.ID)
		w.update(func(s *Stats) {
			if req.NoEffect {
				s.NotApplied++
			} else {
				s.Applied++
			}
		})
		attrs := []slog.Attr{slog.String("verdict", ans.Verdict.String()), slog.String("state", rec.State.String()),
			slog.Uint64("attempt", uint64(rec.Attempt))}
		if !req.NoEffect {
			attrs = append(attrs, slog.Int("status", req.Result.Status))
		}
		w.log(ctx, slog.LevelInfo, msgResolved, &rec, attrs...)
		if w.o.OnResolve != nil {
			w.hook(ctx, rec, "OnResolve", func() { w.o.OnResolve(ctx, rec, ans.Verdict) })
		}
	case applyErr == nil && lost(err):
		// (An Apply's error is its own, whatever it wraps: a read of
		// the Apply's that found nothing is not the record's loss.)
		w.forget(rec.ID)
		w.update(func(s *Stats) { s.Lost++ })
		w.log(ctx, slog.LevelDebug, msgLost, &rec, slog.Any("err", err))
	case applyErr != nil, errors.Is(err, idemkv.ErrInvalidResult), errors.Is(err, idemkv.ErrInvalidArgument):
		// The answer could not be stored (a bad result, or its Apply
		// failed or panicked): as good as no answer.
		var p *panicked
		if errors.As(applyErr, &p) {
			w.panicked(ctx, rec, p)
		}
		w.update(func(s *Stats) { s.Errors++ })
		w.unknown(ctx, rec, "the reconciler's answer could not be stored: "+err.Error())
	default:
		w.storeError(err)
		w.log(ctx, slog.LevelWarn, msgStore, &rec, slog.Any("err", err))
	}
}

// ask calls the reconciler, bounded by Options.Timeout, and turns a
// panic, a timeout and a verdict out of range into errors.
func (w *Worker) ask(ctx context.Context, rec idemkv.Record) (Answer, error) {
	w.update(func(s *Stats) { s.Asked++ })
	cctx, cancel := context.WithTimeout(ctx, w.o.Timeout)
	defer cancel()
	type reply struct {
		a   Answer
		err error
	}
	ch := make(chan reply, 1)
	go func() {
		defer func() {
			if v := recover(); v != nil {
				ch <- reply{err: &panicked{where: "Reconcile", value: v, stack: debug.Stack()}}
			}
		}()
		a, err := w.r.Reconcile(cctx, rec)
		ch <- reply{a, err}
	}()
	select {
	case r := <-ch:
		if r.err == nil && r.a.Verdict > NotApplied {
			r.err = fmt.Errorf("reconciler answered %v", r.a.Verdict)
		}
		return r.a, r.err
	case <-cctx.Done():
		// A reconciler that ignores its context is left behind: its
		// answer, if it ever comes, is dropped.
		return Answer{}, fmt.Errorf("reconciler did not answer within %v: %w", w.o.Timeout, cctx.Err())
	}
}

// unknown puts rec back with backoff, or escalates it after MaxAttempts.
func (w *Worker) unknown(ctx context.Context, rec idemkv.Record, reason string) {
	w.update(func(s *Stats) { s.Unknown++ })
	now := w.o.Clock.Now()
	w.mu.Lock()
	b := w.backoff[rec.ID]
	if b.token != rec.Token {
		b = retry{token: rec.Token}
	}
	b.attempts++
	attempts := b.attempts
	if attempts < w.o.MaxAttempts {
		b.next = now.Add(w.backoffLocked(attempts))
		w.backoff[rec.ID] = b
	}
	w.mu.Unlock()
	if attempts >= w.o.MaxAttempts {
		w.escalate(ctx, rec, fmt.Sprintf("reconciliation gave up after %d attempts: %s", attempts, reason))
		return
	}
	w.log(ctx, slog.LevelWarn, msgUnknown, &rec, slog.Int("attempts", attempts), slog.String("reason", reason))
}

// backoffLocked is the wait after the given number of attempts: half of
// MinBackoff·2^(attempts-1), capped at MaxBackoff, plus a random part of
// the other half. REQUIRES: w.mu held (Rand is not safe for concurrent
// use).
func (w *Worker) backoffLocked(attempts int) time.Duration {
	d := w.o.MinBackoff
	for i := 1; i < attempts && d < w.o.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, w.o.MaxBackoff)
	half := d / 2
	return half + time.Duration(w.o.Rand.Int64N(int64(d-half)+1))
}

// escalate marks rec escalated with note and tells OnEscalate.
func (w *Worker) escalate(ctx context.Context, rec idemkv.Record, note string) {
	note = idemkv.Note(note)
	err := w.store.Escalate(ctx, idemkv.EscalateRequest{ID: rec.ID, Token: rec.Token, Note: note, Since: rec.LastCall()})
	switch {
	case err == nil:
		w.forget(rec.ID)
		w.update(func(s *Stats) { s.Escalated++ })
		w.log(ctx, slog.LevelError, msgEscalated, &rec, slog.String("state", rec.State.String()), slog.String("note", note))
		if w.o.OnEscalate != nil {
			w.hook(ctx, rec, "OnEscalate", func() { w.o.OnEscalate(rec, note) })
		}
	case lost(err):
		w.forget(rec.ID)
		w.update(func(s *Stats) { s.Lost++ })
		w.log(ctx, slog.LevelDebug, msgLost, &rec, slog.Any("err", err))
	default:
		w.storeError(err)
		w.log(ctx, slog.LevelWarn, msgStore, &rec, slog.Any("err", err))
	}
}

// panicked is a panic recovered from the application's code, with the
// stack of the goroutine that raised it.
type panicked struct {
	where string // "Reconcile", "Answer.Apply", or the hook's name
	value any
	stack []byte
}

func (p *panicked) Error() string { return fmt.Sprintf("%s panicked: %v", p.where, p.value) }

// panicked counts and logs a panic recovered from the application's code
// about rec. The caller decides what becomes of rec.
func (w *Worker) panicked(ctx context.Context, rec idemkv.Record, p *panicked) {
	w.update(func(s *Stats) { s.Panics++ })
	w.log(ctx, slog.LevelError, msgPanicked, &rec, slog.String("in", p.where),
		slog.String("panic", fmt.Sprint(p.value)), slog.String("stack", string(p.stack)))
}

// hook runs fn, a hook of the application's (named name) called about rec
// after it was settled, and recovers a panic in it: the record stays
// settled, the panic is counted and logged.
func (w *Worker) hook(ctx context.Context, rec idemkv.Record, name string, fn func()) {
	defer func() {
		if v := recover(); v != nil {
			w.panicked(ctx, rec, &panicked{where: name, value: v, stack: debug.Stack()})
		}
	}()
	fn()
}

// handles reports whether Options.Handles takes rec (true without it).
// A Handles that panics takes nothing: the panic is recovered and
// counted as the other hooks' are, and the record is left alone.
func (w *Worker) handles(ctx context.Context, rec idemkv.Record) (ok bool) {
	if w.o.Handles == nil {
		return true
	}
	w.hook(ctx, rec, "Handles", func() { ok = w.o.Handles(rec) })
	return ok
}

// lost reports whether a settling write found the record settled (or
// taken over) by someone else.
func lost(err error) bool {
	return errors.Is(err, idemkv.ErrFenced) || errors.Is(err, idemkv.ErrWrongState) || errors.Is(err, idemkv.ErrNotFound)
}

func (w *Worker) forget(id idemkv.ID) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.backoff, id)
}

// storeError counts a failed store call; the caller logs it.
func (w *Worker) storeError(err error) {
	w.update(func(s *Stats) {
		s.StoreErrors++
		s.LastError = err.Error()
	})
}

func (w *Worker) update(fn func(*Stats)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	fn(&w.stats)
}
