// Package fakeclock is a manually advanced clock for tests and the demo, so
// that lease expiry and retention are driven deterministically, never by
// sleeping.
package fakeclock

import (
	"sync"
	"time"
)

// Clock is a clock that moves only when told to. It keeps a wall reading
// and a steady one, like a real machine: Advance moves both (time passes),
// Step moves only the wall reading (someone set the clock). It implements
// idemkv.SteadyClock. The zero value is not usable; call New.
type Clock struct {
	mu      sync.Mutex
	now     time.Time
	elapsed time.Duration
}

// New returns a clock reading start.
func New(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the clock's current wall reading.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Read returns the wall reading and the time advanced since New.
func (c *Clock) Read() (time.Time, time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now, c.elapsed
}

// Advance lets d pass: it moves both readings forward by d and returns the
// new wall reading.
func (c *Clock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	c.elapsed += d
	return c.now
}

// Step sets the wall reading d forward (or back, if d is negative) without
// any time passing, as an NTP step or an operator does, and returns it.
func (c *Clock) Step(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}
