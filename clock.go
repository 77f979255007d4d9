package idemkv

import "time"

// The time every store and layer reads, and the timers the layers above
// a store wait on.

// Clock tells a store, its sweeper and the layers above it the time.
// Leases, retention and record timestamps are all read from one Clock, so
// a test that injects a manual one controls expiry exactly.
type Clock interface {
	Now() time.Time
}

// A SteadyClock is a Clock that also measures elapsed time on a steady
// clock, one that setting the wall clock does not move (Go's monotonic
// clock is one). A store checks the wall reading against it, so that a
// step of the wall clock does not expire records or leases early (see
// engine.Options.ClockTolerance). A store given a plain Clock measures
// elapsed time with Go's monotonic clock.
type SteadyClock interface {
	Clock
	// Read returns the wall time, as Now does, and the steady time elapsed
	// since a fixed point of the clock's choosing, read together.
	Read() (wall time.Time, elapsed time.Duration)
}

// An OffsetClock is a Clock whose time can run apart from its host's
// wall clock: an engine's does after a step of the wall clock it does not
// follow (engine.Options.ClockTolerance). A layer that compares the
// clock's times with another process's clock allows for the offset:
// reconcile waits longer while the store's time runs ahead.
type OffsetClock interface {
	Clock
	// WallOffset returns how far the host's wall clock is ahead of the
	// clock's time now (negative: behind it), zero while they agree.
	WallOffset() time.Duration
}

// A TimerClock is a Clock that can also run a function once a duration of
// its own time has passed. The layers above a store that wait (a handler's
// lease heartbeat, say) take one, so that a simulation that drives time
// also drives them; without one they use Go's timers.
type TimerClock interface {
	Clock
	// AfterFunc calls f in its own goroutine once d has passed, unless
	// stop is called first; stop reports whether it prevented the call.
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

// AfterFunc runs f once d has passed on c's time if c is a TimerClock,
// and on Go's timers otherwise (a nil c included).
func AfterFunc(c Clock, d time.Duration, f func()) (stop func() bool) {
	if tc, ok := c.(TimerClock); ok {
		return tc.AfterFunc(d, f)
	}
	return time.AfterFunc(d, f).Stop
}

// SystemClock is the clock of every store and layer that is given none:
// the wall clock, with Go's monotonic clock as its steady reading and Go's
// timers for AfterFunc.
type SystemClock struct{}

// monotonicStart is SystemClock's fixed point of steady time.
var monotonicStart = time.Now()

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// Read implements SteadyClock with Go's monotonic clock.
func (SystemClock) Read() (time.Time, time.Duration) {
	t := time.Now()
	return t, t.Sub(monotonicStart)
}

// AfterFunc implements TimerClock with time.AfterFunc.
func (SystemClock) AfterFunc(d time.Duration, f func()) (stop func() bool) {
	return time.AfterFunc(d, f).Stop
}
