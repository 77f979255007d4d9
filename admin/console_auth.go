package admin

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// The console's sessions. An operator gives the admin token once, on the
// login page; the console answers with a session cookie (HttpOnly,
// SameSite=Strict, Secure when served over TLS) that lasts
// SessionLifetime. Sessions live in the process: a restart logs everyone
// out.
//
// Every state-changing request (a POST) must carry the session's CSRF
// token in its form, and, when the browser says where it comes from
// (Origin, Sec-Fetch-Site), come from the console's own origin: a page on
// another site can neither read the token nor pass the origin check, and
// SameSite=Strict keeps the cookie off its requests anyway.

// SessionLifetime is how long a console session lasts after its login.
const SessionLifetime = 8 * time.Hour

// maxSessions bounds the sessions kept at once; a login beyond it drops
// the oldest.
const maxSessions = 1000

const sessionCookie = "idemkv_console"

type session struct {
	csrf    string
	expires time.Time
}

type sessions struct {
	mu sync.Mutex
	m  map[[sha256.Size]byte]session // by the digest of the cookie's value
}

// randomToken returns 32 random bytes, base64url.
func randomToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// start opens a session and returns its cookie value.
func (s *sessions) start(now time.Time) (id string, sess session) {
	id = randomToken()
	sess = session{csrf: randomToken(), expires: now.Add(SessionLifetime)}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = make(map[[sha256.Size]byte]session)
	}
	if len(s.m) >= maxSessions {
		s.pruneLocked(now)
	}
	s.m[sha256.Sum256([]byte(id))] = sess
	return id, sess
}

// pruneLocked drops expired sessions, and the one closest to expiry if
// none has.
func (s *sessions) pruneLocked(now time.Time) {
	var oldest [sha256.Size]byte
	var oldestAt time.Time
	for k, v := range s.m {
		if !now.Before(v.expires) {
			delete(s.m, k)
			continue
		}
		if oldestAt.IsZero() || v.expires.Before(oldestAt) {
			oldest, oldestAt = k, v.expires
		}
	}
	if len(s.m) >= maxSessions {
		delete(s.m, oldest)
	}
}

// lookup returns the session of r's cookie, if it is current.
func (s *sessions) lookup(r *http.Request, now time.Time) (session, bool) {
	c, err := r.Cookie(sessionCookie)
	if err != nil || c.Value == "" {
		return session{}, false
	}
	k := sha256.Sum256([]byte(c.Value))
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, ok := s.m[k]
	if !ok || !now.Before(sess.expires) {
		delete(s.m, k)
		return session{}, false
	}
	return sess, true
}

// end closes the session of r's cookie.
func (s *sessions) end(r *http.Request) {
	if c, err := r.Cookie(sessionCookie); err == nil {
		s.mu.Lock()
		delete(s.m, sha256.Sum256([]byte(c.Value)))
		s.mu.Unlock()
	}
}

// setSessionCookie sets (or, with an empty id, clears) the cookie.
func setSessionCookie(w http.ResponseWriter, r *http.Request, id string, maxAge int) {
	http.SetCookie(w, &http.Cookie{
		Name: sessionCookie, Value: id, Path: consolePath,
		MaxAge: maxAge, HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode,
	})
}

// sameOrigin reports whether a POST comes from the console's own pages,
// as far as the browser says: Sec-Fetch-Site, where sent, must be
// same-origin, and Origin, where sent, must name this host. A client that
// sends neither (curl) is judged by its CSRF token alone.
func sameOrigin(r *http.Request) bool {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" {
		return false
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			return false
		}
	}
	return true
}

// validCSRF reports whether r's form carries sess's CSRF token.
func validCSRF(r *http.Request, sess session) bool {
	got := r.PostFormValue("csrf")
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(sess.csrf)) == 1
}

// checkToken reports whether tok, sent in r, is the admin token (a
// constant-time comparison of digests), or, when wait is positive, that
// r's address has sent too many wrong ones and must wait that long
// (throttle.go).
func (a *api) checkToken(r *http.Request, tok string) (right bool, wait time.Duration) {
	return a.guard.admit(r, sha256.Sum256([]byte(tok)), func(sum [sha256.Size]byte) bool {
		return subtle.ConstantTimeCompare(sum[:], a.token[:]) == 1
	})
}

// consoleHeaders are on every console answer: nothing but the console's
// own scripts, styles and images, no framing, no sniffing, no caching,
// no referrer to another site (a page's address holds keys; within the
// console it is kept, as a browser sends "Origin: null" on a form's POST
// from a page with no referrer at all, and sameOrigin refuses that).
func consoleHeaders(h http.Header) {
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
		"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
}
