package httpidem

import "sync"

// flights lets a request wait, in-process and without polling, for the
// request of this process that holds its key. Every request joins its
// key's flight before it claims; the first to join owns the flight and
// ends it once it is done (stored, released, or not acquired at all), so
// a request that finds the key in progress and did not own the flight
// knows the holder is in this process and can wait for the end.
type flights struct {
	mu sync.Mutex
	m  map[string]chan struct{}
}

// join returns the flight of k and whether the caller owns it.
func (f *flights) join(k string) (done chan struct{}, owner bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ch, ok := f.m[k]; ok {
		return ch, false
	}
	if f.m == nil {
		f.m = make(map[string]chan struct{})
	}
	ch := make(chan struct{})
	f.m[k] = ch
	return ch, true
}

// end ends the flight of k that done belongs to, waking its waiters.
func (f *flights) end(k string, done chan struct{}) {
	f.mu.Lock()
	if f.m[k] == done {
		delete(f.m, k)
	}
	f.mu.Unlock()
	close(done)
}
