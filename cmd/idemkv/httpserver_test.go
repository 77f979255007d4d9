package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// limitRig serves a handler with limits l on loopback. GET /block waits
// until the test sends on unblock; any other request answers 200 at once.
// states receives every connection state change, after the limiter has
// seen it.
type limitRig struct {
	addr    string
	states  chan http.ConnState
	unblock chan struct{}
}

func newLimitRig(t *testing.T, l serverLimits) *limitRig {
	r := &limitRig{states: make(chan http.ConnState, 64), unblock: make(chan struct{})}
	h := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/block" {
			<-r.unblock
		}
		_, _ = io.Copy(io.Discard, req.Body)
		fmt.Fprintln(w, "ok")
	})
	srv, cl := newServer(h, l, nil)
	track := srv.ConnState
	srv.ConnState = func(c net.Conn, s http.ConnState) {
		track(c, s)
		r.states <- s
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	r.addr = ln.Addr().String()
	go srv.Serve(cl.Listener(ln))
	t.Cleanup(func() { srv.Close() })
	return r
}

// await waits for the server to report state s for some connection.
func (r *limitRig) await(t *testing.T, s http.ConnState) {
	t.Helper()
	for got := range r.states {
		if got == s {
			return
		}
	}
}

func (r *limitRig) dial(t *testing.T) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", r.addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	// A guard against a hang, not a synchronization: every read below
	// ends long before it.
	require.NoError(t, c.SetDeadline(time.Now().Add(30*time.Second)))
	return c
}

// get sends GET path on c, keeping the connection alive.
func get(t *testing.T, c net.Conn, path string) {
	t.Helper()
	_, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path)
	require.NoError(t, err)
}

func readStatus(t *testing.T, br *bufio.Reader) int {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// requireClosed reads c to its end: the server closed it (after an
// answer, perhaps) before the guard's deadline.
func requireClosed(t *testing.T, c net.Conn) {
	t.Helper()
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "the server did not close the connection")
}

// At the cap, a new connection closes the connection idle longest; when
// none is idle, the new one is refused, and admitted again once a slot
// frees.
func TestConnLimiterClosesIdleConnectionsFirst(t *testing.T) {
	l := defaultLimits(time.Minute, 2)
	r := newLimitRig(t, l)

	idle := r.dial(t)
	r.await(t, http.StateNew)
	get(t, idle, "/")
	require.Equal(t, 200, readStatus(t, bufio.NewReader(idle)))
	r.await(t, http.StateIdle)

	busy := r.dial(t)
	r.await(t, http.StateNew)
	get(t, busy, "/block")
	r.await(t, http.StateActive)

	third := r.dial(t) // at the cap: the idle connection makes room
	requireClosed(t, idle)
	get(t, third, "/")
	br := bufio.NewReader(third)
	require.Equal(t, 200, readStatus(t, br))
	r.await(t, http.StateIdle)

	get(t, third, "/block")
	r.await(t, http.StateActive)
	refused := r.dial(t) // every slot is serving a request
	requireClosed(t, refused)

	r.unblock <- struct{}{}
	r.unblock <- struct{}{}
	require.Equal(t, 200, readStatus(t, br))
	require.Equal(t, 200, readStatus(t, bufio.NewReader(busy)))
	r.await(t, http.StateIdle)
	r.await(t, http.StateIdle)
	late := r.dial(t) // an idle connection makes room again
	get(t, late, "/")
	require.Equal(t, 200, readStatus(t, bufio.NewReader(late)))
}

// Slow, idle and oversized clients are cut off by the limits.
func TestServerLimitsCutOffSlowClients(t *testing.T) {
	l := defaultLimits(time.Minute, 100)
	l.readHeader, l.read, l.idle = 200*time.Millisecond, 300*time.Millisecond, 200*time.Millisecond
	r := newLimitRig(t, l)

	half := r.dial(t) // headers never finished
	_, err := io.WriteString(half, "POST / HTTP/1.1\r\nHost: x\r\n")
	require.NoError(t, err)
	requireClosed(t, half)

	trickle := r.dial(t) // a body that never arrives in full
	_, err = io.WriteString(trickle, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
	require.NoError(t, err)
	requireClosed(t, trickle)

	idle := r.dial(t) // a keep-alive connection left idle
	get(t, idle, "/")
	br := bufio.NewReader(idle)
	require.Equal(t, 200, readStatus(t, br))
	_, err = br.ReadByte()
	require.Error(t, err)

	big := r.dial(t)
	// The server may answer before it has read all of this.
	_, _ = fmt.Fprintf(big, "GET / HTTP/1.1\r\nHost: x\r\nX-Big: %s\r\n\r\n", strings.Repeat("a", 64<<10))
	require.Equal(t, http.StatusRequestHeaderFieldsTooLarge, readStatus(t, bufio.NewReader(big)))
}

func TestFileBudget(t *testing.T) {
	store, conns := fileBudget()
	require.Positive(t, store)
	require.LessOrEqual(t, store, storeFiles)
	require.Positive(t, conns)
}
