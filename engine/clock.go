package engine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine/internal/record"
)

// Wall clocks step: NTP corrects them, operators set them, virtual
// machines resume with them wrong. Leases, expiry and the sweeper all act
// on the engine's own time instead, which follows the wall clock
// (Options.Clock) only while it agrees, within Options.ClockTolerance,
// with the time a steady clock says has elapsed:
//
//   - A step forward is not followed. Engine time goes on at the steady
//     clock's pace, so no lease or record expires early and the sweeper
//     deletes nothing elapsed time has not expired; when the wall clock is
//     corrected the engine follows it again. A step forward that holds
//     for clockSettle is taken as a correction and followed.
//   - Engine time never goes backwards. After a step back it goes on at
//     the steady clock's pace from where it was, so leases end on time and
//     retention is not shortened, until the wall clock agrees again.
//   - Synced commits carry a high-water mark of engine time, and Open
//     starts from it when the wall clock is behind it, so a clock set back
//     while the store was closed shortens nothing either.
//   - A wall clock ahead of the mark at Open (by more than the tolerance)
//     is followed: the store may have been closed that long. But for
//     clockSettle after Open the jump is provisional: a step back to no
//     earlier than the mark plus the time elapsed since Open is followed,
//     as the correction of a clock that was wrong at Open; the background
//     sweeper deletes nothing the mark plus elapsed time has not expired;
//     and the mark written meanwhile is the old mark plus elapsed time, a
//     time known to have passed. Leases granted before such a correction
//     last longer by the step, and reads are not held back: a retry during
//     the hour may find its record expired. An explicit Engine.Sweep
//     vouches for the clock and ends the hour. Close writes the mark, so
//     a store closed for less than the tolerance reopens with no hour.

// TrustClock, as Options.ClockTolerance, makes the engine follow
// Options.Clock as it is, steps and all. It is for tools and tests that
// set a manual clock on purpose without a steady reading (a Clock that is
// not an idemkv.SteadyClock).
const TrustClock time.Duration = -1

// clockSettle is how long the wall clock must stay ahead of elapsed time
// before the engine takes the step as a correction and follows it: longer
// than NTP takes to step a clock back (ntpd waits 15 minutes).
const clockSettle = time.Hour

// clockDrift is the rate, in parts per million, at which the wall clock
// may run apart from the steady clock between two readings without being
// taken as a step. NTP slews a clock by at most 500 ppm.
const clockDrift = 1000

// clockDriftSpan bounds the span over which drift is allowed for, so that
// a wall clock left behind by a step does not come to agree with elapsed
// time just because long has passed.
const clockDriftSpan = 10 * time.Minute

// clockMarkEvery is how far engine time must pass the persisted
// high-water mark before a synced commit carries a new one: at most one a
// second (or one per tolerance, if that is shorter), so the mark lags the
// latest durable record by no more than the tolerance.
const clockMarkEvery = time.Second

// engineClock is the engine's time (see above). It implements idemkv.Clock
// for the sweeper.
type engineClock struct {
	read      func() (time.Time, time.Duration)
	tolerance time.Duration // TrustClock: follow the wall clock as is
	openAt    time.Duration // the steady reading at Open
	markEvery time.Duration // see clockMarkEvery
	logf      func(format string, args ...any)

	mu struct {
		sync.Mutex
		// anchor is engine time at the last reading that agreed with
		// elapsed time, and anchorAt the steady reading then.
		anchor   time.Time
		anchorAt time.Duration
		// aheadSince is the steady reading when the wall clock was first
		// seen ahead; off says whether it disagrees now, and offset by
		// how much (wall minus engine time).
		aheadSince time.Duration
		off        bool
		offset     time.Duration
		// provisional says the wall clock was ahead of the persisted mark
		// at Open, by less than clockSettle ago; floor is the mark.
		provisional bool
		floor       time.Time
	}
	steps atomic.Int64
	// mark is the high-water mark last put into a commit, unix nanoseconds.
	mark atomic.Int64
	// last is the latest engine time handed out, unix nanoseconds. It only
	// grows, except when a correction of a clock ahead at Open is followed,
	// which happens under mu while fast is nil.
	last atomic.Int64
	// fast is the anchor of the last reading under mu that agreed with
	// elapsed time, for Now's lock-free path; nil while the clock
	// disagrees or engine time is provisional, when every reading takes mu.
	fast atomic.Pointer[clockAnchor]
}

// clockAnchor is a reading that agreed with elapsed time: its wall time in
// unix nanoseconds and its steady time.
type clockAnchor struct {
	wall int64
	at   time.Duration
}

// clockFastSpan is how long after an anchor Now may take its lock-free
// path: drift over it is far below any tolerance, and a reading under the
// lock at least this often keeps the anchor fresh.
const clockFastSpan = time.Second

// newEngineClock returns the engine's clock on c, starting no earlier than
// mark, the high-water mark persisted by an earlier Open (zero: none).
func newEngineClock(c idemkv.Clock, tolerance time.Duration, mark time.Time, logf func(string, ...any)) *engineClock {
	ec := &engineClock{read: steadyReader(c), tolerance: tolerance, logf: logf}
	w, at := ec.read()
	w = w.Round(0) // compare wall readings, never Go's monotonic ones
	ec.openAt = at
	ec.markEvery = clockMarkEvery
	if tolerance > 0 {
		ec.markEvery = min(clockMarkEvery, tolerance)
	}
	ec.mu.anchor, ec.mu.anchorAt = w, at
	ec.last.Store(w.UnixNano())
	switch {
	case tolerance < 0 || mark.IsZero():
	case w.Before(mark):
		ec.mu.anchor = mark
		ec.last.Store(mark.UnixNano())
	case w.Sub(mark) > tolerance:
		ec.mu.provisional, ec.mu.floor = true, mark
	}
	if !mark.IsZero() { // the zero Time's UnixNano is not defined
		ec.mark.Store(mark.UnixNano())
	}
	return ec
}

// steadyReader returns c's Read, or for a plain Clock one that measures
// elapsed time with Go's monotonic clock.
func steadyReader(c idemkv.Clock) func() (time.Time, time.Duration) {
	if sc, ok := c.(idemkv.SteadyClock); ok {
		return sc.Read
	}
	start := time.Now()
	return func() (time.Time, time.Duration) { return c.Now(), time.Since(start) }
}

// Now returns engine time: the time leases, expiry and record timestamps
// are read from (Options.Clock, checked against a steady clock; see
// Options.ClockTolerance). A worker beside the engine that compares times
// with its records (package reconcile) should read this clock: *Engine is
// an idemkv.Clock.
func (e *Engine) Now() time.Time { return e.clock.Now() }

// WallOffset returns how far the wall clock (Options.Clock) is ahead of
// engine time now (negative: behind), zero while the engine follows it:
// Stats.ClockOffset. *Engine is an idemkv.OffsetClock.
func (e *Engine) WallOffset() time.Duration {
	e.clock.Now() // a reading notices a step
	return e.clock.offset()
}

// Now returns engine time.
func (c *engineClock) Now() time.Time {
	if c.tolerance < 0 {
		w, _ := c.read()
		return w.Round(0)
	}
	if t, ok := c.fastNow(); ok {
		return t
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	t, _ := c.nowLocked()
	return t
}

// fastNow is Now without the lock, for the common reading: one that agrees
// with the anchor of a recent reading under the lock, within the
// tolerance. ok is false when the reading needs the lock.
func (c *engineClock) fastNow() (t time.Time, ok bool) {
	a := c.fast.Load()
	if a == nil {
		return time.Time{}, false
	}
	w, at := c.read()
	since := at - a.at
	if since < 0 || since > clockFastSpan {
		return time.Time{}, false
	}
	w = w.Round(0)
	wn := w.UnixNano()
	if d := wn - (a.wall + int64(since)); d > int64(c.tolerance) || d < -int64(c.tolerance) {
		return time.Time{}, false
	}
	return c.advance(w), true
}

// advance makes t engine time unless a later time was handed out, and
// returns the one that is.
func (c *engineClock) advance(t time.Time) time.Time {
	tn := t.UnixNano()
	for {
		l := c.last.Load()
		if tn <= l {
			return time.Unix(0, l).In(t.Location())
		}
		if c.last.CompareAndSwap(l, tn) {
			return t
		}
	}
}

// nowLocked reads the clocks and returns engine time and the steady
// reading. Reading under the lock handles readings in the order taken: one
// taken before a step cannot undo what one after it saw.
// REQUIRES: c.mu held.
func (c *engineClock) nowLocked() (time.Time, time.Duration) {
	w, at := c.read()
	w = w.Round(0)
	since := at - c.mu.anchorAt
	elapsed := c.mu.anchor.Add(since)
	allow := c.tolerance + min(since, clockDriftSpan)/1e6*clockDrift
	d := w.Sub(elapsed)
	t := w
	switch {
	case d > allow:
		if !c.mu.off || c.mu.offset < 0 || d-c.mu.offset > allow {
			c.mu.aheadSince = at // a new step forward, or a further one
		}
		if at-c.mu.aheadSince < clockSettle {
			c.disagreeLocked(d, "ahead of")
			t = elapsed
			break
		}
		c.logf("idemkv: the wall clock has been %v ahead of elapsed time for %v; engine time follows it from now on", d, clockSettle)
		c.agreeLocked(w, at)
	case d < -allow && c.correctsOpenLocked(w, at):
		c.logf("idemkv: the wall clock, ahead of the store's last time when the store was opened, was set back %v; engine time follows it back", -d)
		c.steps.Add(1)
		c.agreeLocked(w, at)
		c.last.Store(w.UnixNano()) // back: fast is nil while provisional
	case d < -allow:
		c.disagreeLocked(d, "behind")
		t = elapsed
	default:
		if c.mu.off {
			c.logf("idemkv: the wall clock agrees with elapsed time again (within %v); engine time follows it", c.tolerance)
		}
		c.trackLocked(elapsed, d, since, at)
	}
	if !c.mu.off && !c.provisionalLocked(at) {
		c.fast.Store(&clockAnchor{wall: c.mu.anchor.UnixNano(), at: c.mu.anchorAt})
	} else {
		c.fast.Store(nil)
	}
	return c.advance(t), at
}

// provisionalLocked reports whether engine time is still provisional after
// Open, at steady reading at, ending it once clockSettle has passed.
// REQUIRES: c.mu held.
func (c *engineClock) provisionalLocked(at time.Duration) bool {
	if c.mu.provisional && at-c.openAt >= clockSettle {
		c.mu.provisional = false
	}
	return c.mu.provisional
}

// markLocked returns engine time and the time a mark written now may
// carry: engine time, or while it is provisional no later than the old
// mark plus the time elapsed since Open, a time known to have passed.
// REQUIRES: c.mu held.
func (c *engineClock) markLocked() (t, mark time.Time) {
	t, at := c.nowLocked()
	if c.provisionalLocked(at) {
		if f := c.mu.floor.Add(at - c.openAt); f.Before(t) {
			return t, f
		}
	}
	return t, t
}

// correctsOpenLocked reports whether wall reading w, at steady reading at,
// is the correction of a clock that was ahead at Open: a step back no
// earlier than the persisted mark plus the time elapsed since, less than
// clockSettle after Open. It ends the provisional time once that has
// passed. REQUIRES: c.mu held.
func (c *engineClock) correctsOpenLocked(w time.Time, at time.Duration) bool {
	if !c.mu.provisional {
		return false
	}
	if at-c.openAt >= clockSettle {
		c.mu.provisional = false
		return false
	}
	if w.Before(c.mu.floor.Add(at - c.openAt)) {
		return false
	}
	c.mu.provisional = false
	return true
}

// agreeLocked makes wall reading w, at steady reading at, the anchor.
// REQUIRES: c.mu held.
func (c *engineClock) agreeLocked(w time.Time, at time.Duration) {
	c.mu.anchor, c.mu.anchorAt = w, at
	c.mu.off, c.mu.offset = false, 0
}

// trackLocked moves the anchor to steady reading at, on a wall reading
// that agrees with elapsed time, d from it, since the last anchor. The
// anchor moves toward the wall clock by no more than the drift allowed
// for since: the tolerance is room for one step, not for each reading,
// so that steps forward each within it, repeated, add up to one the
// engine notices rather than one it follows. REQUIRES: c.mu held.
func (c *engineClock) trackLocked(elapsed time.Time, d, since, at time.Duration) {
	drift := time.Duration(int64(min(since, clockDriftSpan)) * clockDrift / 1e6)
	c.mu.anchor, c.mu.anchorAt = elapsed.Add(max(-drift, min(d, drift))), at
	c.mu.off, c.mu.offset = false, 0
}

// disagreeLocked records that the wall clock is d from elapsed time,
// logging and counting a new step. REQUIRES: c.mu held.
func (c *engineClock) disagreeLocked(d time.Duration, how string) {
	if !c.mu.off || (d > 0) != (c.mu.offset > 0) {
		c.steps.Add(1)
		c.logf("idemkv: the wall clock is %v %s elapsed time; engine time follows elapsed time until they agree within %v",
			d.Abs(), how, c.tolerance)
	}
	c.mu.off, c.mu.offset = true, d
}

// offset returns how far the wall clock is from elapsed time while they
// disagree, zero while engine time follows it.
func (c *engineClock) offset() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.offset
}

// sweepClock is the sweeper's clock: engine time, but while engine time is
// provisional after Open no later than the mark plus the time elapsed
// since, so that nothing is deleted on the word of a clock that may yet be
// corrected back.
type sweepClock struct{ c *engineClock }

func (s sweepClock) Now() time.Time {
	if s.c.tolerance < 0 {
		return s.c.Now()
	}
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	_, m := s.c.markLocked()
	return m
}

// confirm ends the provisional time after Open: the caller vouches for the
// wall clock.
func (c *engineClock) confirm() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mu.provisional = false
}

// writeMark writes the mark, synced; Close calls it. With TrustClock it
// writes the wall clock's reading: opening a store once with TrustClock is
// how a mark left by a wrong clock is set back.
func (c *engineClock) writeMark(db *pebble.DB) error {
	var t int64
	if c.tolerance < 0 {
		w, _ := c.read()
		t = w.UnixNano()
	} else {
		t = c.markNow().UnixNano()
	}
	b := db.NewBatch()
	defer b.Close()
	_ = b.Set(clockKey, binary.BigEndian.AppendUint64(nil, uint64(t)), nil)
	if err := commitBatch(b, pebble.Sync); err != nil {
		return fmt.Errorf("engine: write clock mark: %w", err)
	}
	c.mark.Store(t)
	return nil
}

// markNow is markLocked's mark, under the lock.
func (c *engineClock) markNow() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, m := c.markLocked()
	return m
}

// stamp adds the high-water mark to b, a synced group about to commit, if
// it has passed the mark last written by markEvery. Every record in b
// carries engine time handed out before b was built, so no durable record
// is later than the durable mark by more than that (while engine time is
// provisional, than the time known to have passed).
func (c *engineClock) stamp(b *pebble.Batch) {
	if c.tolerance < 0 {
		return
	}
	t := c.markNow().UnixNano()
	if prev := c.mark.Load(); prev != 0 && t-prev < int64(c.markEvery) {
		return
	}
	c.mark.Store(t)
	_ = b.Set(clockKey, binary.BigEndian.AppendUint64(nil, uint64(t)), nil)
}

// readClockMark returns the high-water mark of engine time persisted in
// db, zero if there is none.
func readClockMark(db *pebble.DB) (time.Time, error) {
	v, closer, err := db.Get(clockKey)
	if errors.Is(err, pebble.ErrNotFound) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("engine: read clock mark: %w", err)
	}
	defer closer.Close()
	if len(v) != 8 {
		return time.Time{}, fmt.Errorf("engine: read clock mark: %w: %d bytes", record.ErrCorrupt, len(v))
	}
	if binary.BigEndian.Uint64(v) == 0 {
		return time.Time{}, nil
	}
	return time.Unix(0, int64(binary.BigEndian.Uint64(v))), nil
}
