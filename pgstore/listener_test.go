package pgstore_test

import (
	"fmt"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/pgstore"
	"github.com/idemkv/idemkv/pgstore/pgtest"
)

// blackhole forwards TCP to upstream; freeze(port) stops forwarding, both
// ways, on the connection whose upstream side has local port port, and
// keeps both sockets open: a connection that died without a word (a NAT
// or load balancer that forgot it, a host gone without a reset).
type blackhole struct {
	ln     net.Listener
	mu     sync.Mutex
	frozen map[int]*atomic.Bool
}

func newBlackhole(t *testing.T, upstream string) *blackhole {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &blackhole{ln: ln, frozen: map[int]*atomic.Bool{}}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", upstream)
			if err != nil {
				_ = c.Close()
				continue
			}
			f := &atomic.Bool{}
			p.mu.Lock()
			p.frozen[u.LocalAddr().(*net.TCPAddr).Port] = f
			p.mu.Unlock()
			pump := func(dst, src net.Conn) {
				buf := make([]byte, 32<<10)
				for {
					n, err := src.Read(buf)
					if n > 0 && !f.Load() {
						if _, werr := dst.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						_ = dst.Close()
						return
					}
				}
			}
			go pump(u, c)
			go pump(c, u)
		}
	}()
	return p
}

func (p *blackhole) freeze(port int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if f := p.frozen[port]; f != nil {
		f.Store(true)
		return true
	}
	return false
}

// TestListenerThatDiedSilentlyIsReplaced: the connection of a process's
// listener stops carrying anything, without being closed. The listener
// finds out when its connection no longer answers (after listenCheck
// without a notification) and connects again: a duplicate that watched a
// record is woken, and claims again, within seconds of the holder's
// completion, rather than waiting out its whole timeout.
func TestListenerThatDiedSilentlyIsReplaced(t *testing.T) {
	srv := pgtest.Shared(t)
	dsn := srv.CreateDatabase(t)
	p := newBlackhole(t, fmt.Sprintf("127.0.0.1:%d", srv.Port()))
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	u.Host = p.ln.Addr().String()
	a := reviewOpenOn(t, u.String(), func(o *pgstore.Options) { pgstore.WithListenCheck(o, 200*time.Millisecond) })
	b := reviewOpenOn(t, dsn, nil)

	rows, err := b.Pool().Query(ctx, `SELECT client_port FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = 'idemkv listener'`)
	require.NoError(t, err)
	froze := 0
	for rows.Next() {
		var port int
		require.NoError(t, rows.Scan(&port))
		if p.freeze(port) {
			froze++
		}
	}
	require.NoError(t, rows.Err())
	require.Equal(t, 1, froze, "a's listener, through the proxy")

	// woken watches key on a while b holds it, and completes it.
	woken := func(key string) {
		t.Helper()
		id := reviewID(key)
		l := reviewClaim(t, b, id, idemkv.ModeLocal)
		var settled <-chan struct{}
		require.Eventually(t, func() bool { // refused while no listener listens
			c, err := a.Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: []byte{1}})
			require.NoError(t, err)
			require.Equal(t, idemkv.InProgress, c.Outcome)
			ch, stop, err := a.Watch(ctx, id, c.Record.Token)
			if err != nil {
				return false
			}
			t.Cleanup(stop)
			settled = ch
			return true
		}, 20*time.Second, 10*time.Millisecond)
		require.NoError(t, b.Complete(ctx, l, idemkv.Result{Status: 201}, nil))
		select {
		case <-settled:
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: the watch was not woken 20 s after the holder completed", key)
		}
		c, err := a.Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: []byte{1}})
		require.NoError(t, err)
		require.Equal(t, idemkv.Replay, c.Outcome)
	}
	woken("held-by-b")
	// The listener that replaced it listens: its notification wakes
	// the next watch.
	woken("held-by-b-again")
}

// TestListenerOutlivesIdleSessionTimeout: a connection string (or role)
// that ends idle sessions after half a second leaves the pool to cope,
// and the listener, which idles by design, unharmed: a duplicate's watch
// is not woken, nor refused, while the attempt it waits for runs on.
func TestListenerOutlivesIdleSessionTimeout(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	q := u.Query()
	q.Set("idle_session_timeout", "500")
	u.RawQuery = q.Encode()
	a := reviewOpenOn(t, u.String(), nil)
	b := reviewOpenOn(t, dsn, nil)
	id := reviewID("held")
	l := reviewClaim(t, b, id, idemkv.ModeLocal)
	c, err := a.Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: []byte{1}})
	require.NoError(t, err)
	require.Equal(t, idemkv.InProgress, c.Outcome)
	settled, stop, err := a.Watch(ctx, id, c.Record.Token)
	require.NoError(t, err)
	defer stop()
	select {
	case <-settled:
		t.Fatal("woken while the attempt runs: the listener was cut")
	case <-time.After(2 * time.Second): // four idle timeouts
	}
	require.NoError(t, b.Complete(ctx, l, idemkv.Result{Status: 201}, nil))
	select {
	case <-settled:
	case <-time.After(20 * time.Second):
		t.Fatal("not woken by the completion")
	}
}
