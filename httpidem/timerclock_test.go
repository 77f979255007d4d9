package httpidem_test

import (
	"slices"
	"sync"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/fakeclock"
)

// timerClock is a fakeclock.Clock that is also an idemkv.TimerClock, as a
// simulation's clock is: its timers fire only when Advance lets their time
// come. Advance moves time to each due timer in turn, in deadline order,
// runs its function in a goroutine of its own, as the contract says, and
// waits for it to return before going on: once Advance returns, every
// heartbeat due by then has run, and a test needs no sleep to know it.
type timerClock struct {
	*fakeclock.Clock

	mu     sync.Mutex
	timers []*fakeTimer // in the order they were armed
}

var _ idemkv.TimerClock = (*timerClock)(nil)

type fakeTimer struct {
	at time.Time
	f  func()
}

func newTimerClock(start time.Time) *timerClock {
	return &timerClock{Clock: fakeclock.New(start)}
}

// AfterFunc implements idemkv.TimerClock.
func (c *timerClock) AfterFunc(d time.Duration, f func()) (stop func() bool) {
	t := &fakeTimer{at: c.Now().Add(d), f: f}
	c.mu.Lock()
	c.timers = append(c.timers, t)
	c.mu.Unlock()
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		i := slices.Index(c.timers, t)
		if i < 0 {
			return false // fired, or stopped before
		}
		c.timers = slices.Delete(c.timers, i, i+1)
		return true
	}
}

// Advance lets d pass, firing the timers due on the way, and returns the
// new time.
func (c *timerClock) Advance(d time.Duration) time.Time {
	end := c.Now().Add(d)
	for {
		t := c.nextDue(end)
		if t == nil {
			break
		}
		if wait := t.at.Sub(c.Now()); wait > 0 {
			c.Clock.Advance(wait)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			t.f()
		}()
		<-done
	}
	return c.Clock.Advance(end.Sub(c.Now()))
}

// nextDue removes and returns the earliest timer due by end, nil if none.
func (c *timerClock) nextDue(end time.Time) *fakeTimer {
	c.mu.Lock()
	defer c.mu.Unlock()
	best := -1
	for i, t := range c.timers {
		if !t.at.After(end) && (best < 0 || t.at.Before(c.timers[best].at)) {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	t := c.timers[best]
	c.timers = slices.Delete(c.timers, best, best+1)
	return t
}

// pending returns how many timers are armed.
func (c *timerClock) pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}
