package admin

import (
	"crypto/sha256"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Wrong tokens are throttled per client address. A client gets
// failedBurst different wrong tokens at once, then one each failedEvery;
// while it has none left, every token its address sends (a bearer
// header, or the console's sign-in form), the right one too, is refused
// with 429 before it is compared, so that a guess made meanwhile learns
// nothing. A wrong token the address sent lately (one of its last
// recentWrong different ones) costs nothing again: a script retrying
// with a stale token is not guessing, and does not hold back the
// operators who share its address. IPv6 addresses are counted by their
// /64, which one host usually holds whole.
//
// The addresses tracked are bounded: past maxThrottled, a new address
// shares one budget with every other new one (while the tracked ones
// have spent some of theirs), so that a client holding many addresses
// gets no more guesses than one.
const (
	failedBurst  = 100
	failedEvery  = time.Second
	recentWrong  = 16
	maxThrottled = 4096
)

// throttle is the budgets of wrong tokens, by client address.
type throttle struct {
	now func() time.Time
	mu  sync.Mutex
	by  map[netip.Prefix]*budget
}

// budget is an address's wrong tokens: what it may still send, and the
// digests of its last different ones.
type budget struct {
	lim    *rate.Limiter
	recent [][sha256.Size]byte // at most recentWrong, oldest first
}

func newThrottle(now func() time.Time) *throttle {
	return &throttle{now: now, by: make(map[netip.Prefix]*budget)}
}

// admit decides a token sent from r's address, whose digest is sum:
// right says whether it is the admin token (matches), and wait, when
// positive, that the address must wait that long and the token was not
// compared. Deciding and counting in one locked step keeps concurrent
// guesses within the budget.
func (t *throttle) admit(r *http.Request, sum [sha256.Size]byte, matches func([sha256.Size]byte) bool) (right bool, wait time.Duration) {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.addressLocked(r, now)
	b := t.by[a]
	if b != nil {
		if n := b.lim.TokensAt(now); n < 1 {
			return false, time.Duration((1 - n) * float64(failedEvery))
		}
	}
	if matches(sum) {
		return true, 0
	}
	if b == nil {
		b = &budget{lim: rate.NewLimiter(rate.Every(failedEvery), failedBurst)}
		t.by[a] = b
	}
	if !slices.Contains(b.recent, sum) {
		if len(b.recent) == recentWrong {
			b.recent = b.recent[1:]
		}
		b.recent = append(b.recent, sum)
		b.lim.AllowN(now, 1)
	}
	return false, 0
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
	for p, b := range t.by {
		if p.IsValid() && b.lim.TokensAt(now) >= failedBurst {
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
