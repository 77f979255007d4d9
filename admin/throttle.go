package admin

import (
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Wrong tokens are throttled per client address. A client gets
// failedBurst wrong tokens at once (an operator's typos, a script's
// misconfigured runs, never reach it), then one each failedEvery; while it
// has none left, every request of its address that carries a token (a
// bearer header, or the console's sign-in form) is refused with 429
// before the token is compared, so that a guess made meanwhile learns
// nothing, right or wrong. Only that address waits: a client guessing
// cannot lock out an operator at another address. IPv6 addresses are
// counted by their /64, which one host usually holds whole.
//
// The addresses tracked are bounded; a new address beyond the bound
// shares one budget with every other such address, so a client that
// holds many addresses gets no more guesses than one.
const (
	failedBurst  = 100
	failedEvery  = time.Second
	maxThrottled = 4096
)

// throttle is the budgets of wrong tokens, by client address.
type throttle struct {
	now func() time.Time
	mu  sync.Mutex
	by  map[netip.Prefix]*rate.Limiter
}

func newThrottle(now func() time.Time) *throttle {
	return &throttle{now: now, by: make(map[netip.Prefix]*rate.Limiter)}
}

// wait returns how long r's address must wait before a token it sends is
// compared; zero when it need not.
func (t *throttle) wait(r *http.Request) time.Duration {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	l := t.by[t.addressLocked(r, now)]
	if l == nil {
		return 0
	}
	if n := l.TokensAt(now); n < 1 {
		return time.Duration((1 - n) * float64(failedEvery))
	}
	return 0
}

// failed counts a wrong token sent from r's address.
func (t *throttle) failed(r *http.Request) {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.addressLocked(r, now)
	l := t.by[a]
	if l == nil {
		l = rate.NewLimiter(rate.Every(failedEvery), failedBurst)
		t.by[a] = l
	}
	l.AllowN(now, 1)
}

// addressLocked is the address r's budget is kept under: its client's
// address, or, while maxThrottled others are tracked, the shared one
// (the zero Prefix). Budgets that have filled up again are forgotten to
// make room.
func (t *throttle) addressLocked(r *http.Request, now time.Time) netip.Prefix {
	a := clientPrefix(r)
	if _, ok := t.by[a]; ok || len(t.by) < maxThrottled {
		return a
	}
	for p, l := range t.by {
		if p.IsValid() && l.TokensAt(now) >= failedBurst {
			delete(t.by, p)
		}
	}
	if len(t.by) < maxThrottled {
		return a
	}
	return netip.Prefix{}
}

// clientPrefix is r's client address: the host itself for IPv4, its /64
// for IPv6; the zero Prefix if RemoteAddr holds no address.
func clientPrefix(r *http.Request) netip.Prefix {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Prefix{}
	}
	ip = ip.Unmap()
	bits := 32
	if ip.Is6() {
		bits = 64
	}
	p, _ := ip.Prefix(bits)
	return p
}

// retryAfter is d as a Retry-After header's whole seconds, rounded up.
func retryAfter(d time.Duration) string {
	return strconv.Itoa(int((d + time.Second - 1) / time.Second))
}

// throttledDetail says why a token was not compared.
func throttledDetail(d time.Duration) string {
	return "too many wrong admin tokens from this address: try again in " + retryAfter(d) + " s"
}
