// Package fakeclock is a manually advanced clock for tests and the demo, so
// that lease expiry and retention are driven deterministically, never by
// sleeping.
package fakeclock

import (
	"sync"
	"time"
)

// Clock is a clock that moves only when told to. The zero value is not
// usable; call New.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// New returns a clock reading start.
func New(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the clock's current reading.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d and returns the new reading.
func (c *Clock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}
