package sim

import "time"

// A Link is one direction of a network path between processes: it
// delays every message by a random time within [Min, Max] (most of them
// near Min, some anywhere up to Max, so that messages overtake each other
// and some arrive long after their sender gave up on them) and loses a
// fraction Loss of them.
type Link struct {
	Min, Max time.Duration
	// Slow is the fraction of messages delayed anywhere up to Max; the
	// others take at most a tenth of the way from Min to Max.
	Slow float64
	Loss float64
}

// Send delivers fire to p over l: it runs on the scheduler goroutine once
// the message arrives (an event of p: held while p is frozen, dropped if
// p has crashed). It reports false if the message was lost.
func (w *World) Send(l Link, p *Proc, fire func()) bool {
	if l.Loss > 0 && w.rng.Float64() < l.Loss {
		return false
	}
	w.At(l.delay(w), p, fire)
	return true
}

func (l Link) delay(w *World) time.Duration {
	span := l.Max - l.Min
	if span <= 0 {
		return l.Min
	}
	if w.rng.Float64() >= l.Slow {
		span /= 10
	}
	return l.Min + time.Duration(w.rng.Int64N(int64(span)+1))
}
