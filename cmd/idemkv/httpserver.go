package main

import (
	"log"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// serverLimits bound what HTTP clients can hold of a server the command
// starts: time to send a request, to read an answer, to sit idle, header
// bytes, and connections. Without them a slow or idle client keeps its
// connection and file descriptor for as long as it likes, and enough of
// them starve the store of the descriptors it needs (docs/operations.md,
// "Connections and time").
type serverLimits struct {
	readHeader time.Duration // to send the request line and headers
	read       time.Duration // to send the whole request, body included
	write      time.Duration // from the end of the headers to the end of the answer
	idle       time.Duration // a keep-alive connection between requests
	maxHeader  int           // request line and headers, in bytes
	maxConns   int           // open connections; at the cap idle ones close first
}

// defaultLimits are the limits of a server whose handlers take at most
// handlerTime, with maxConns connections.
func defaultLimits(handlerTime time.Duration, maxConns int) serverLimits {
	return serverLimits{
		readHeader: 5 * time.Second,
		read:       15 * time.Second,
		write:      15*time.Second + handlerTime,
		idle:       60 * time.Second,
		maxHeader:  32 << 10,
		maxConns:   maxConns,
	}
}

// Descriptors kept for the store and the process when the connection cap
// is derived from the file limit: the store's share is at most half the
// limit, and at most storeFiles.
const (
	storeFiles   = 1024
	processFiles = 32
)

// fileBudget splits the process's file descriptor limit between the
// store (Pebble's open sstables, WAL and manifest) and connections.
func fileBudget() (store, conns int) {
	var rl syscall.Rlimit
	limit := 1024
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err == nil && rl.Cur < 1<<30 {
		limit = int(rl.Cur)
	}
	store = min(limit/2, storeFiles)
	return store, max(1, limit-store-processFiles)
}

// keepFilesUnder returns a ConfigurePebble that applies configure, if
// any, and keeps the store's open sstables within its share of the file
// limit, files, leaving some for its WAL, manifest and directories.
func keepFilesUnder(files int, configure func(*pebble.Options)) func(*pebble.Options) {
	return func(po *pebble.Options) {
		if configure != nil {
			configure(po)
		}
		if n := max(16, files-64); po.MaxOpenFiles == 0 || po.MaxOpenFiles > n {
			po.MaxOpenFiles = n
		}
	}
}

// newServer returns a server of h with limits l; serve it on the listener
// its connLimiter returns.
func newServer(h http.Handler, l serverLimits, errLog *log.Logger) (*http.Server, *connLimiter) {
	cl := &connLimiter{max: l.maxConns}
	cl.mu.waiting = map[*limitedConn]time.Time{}
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.readHeader,
		ReadTimeout:       l.read,
		WriteTimeout:      l.write,
		IdleTimeout:       l.idle,
		MaxHeaderBytes:    l.maxHeader,
		ConnState:         cl.track,
		ErrorLog:          errLog,
	}, cl
}

// connLimiter caps a server's open connections. A connection accepted at
// the cap closes the connection that has waited longest for a request
// (an idle keep-alive, or one that has sent nothing yet) to make room, as
// nginx does, so that idle clients cannot lock others out. If every
// connection is in the middle of a request, the new one is closed at once.
type connLimiter struct {
	max int
	mu  struct {
		sync.Mutex
		open int
		// waiting holds the open connections between requests, with the
		// time each began to wait.
		waiting map[*limitedConn]time.Time
	}
}

// Listener returns ln with the cap applied.
func (c *connLimiter) Listener(ln net.Listener) net.Listener { return &limitedListener{ln, c} }

// track is the server's ConnState hook: it keeps the set of connections
// waiting for a request.
func (c *connLimiter) track(conn net.Conn, s http.ConnState) {
	lc, ok := conn.(*limitedConn)
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if s == http.StateNew || s == http.StateIdle {
		c.mu.waiting[lc] = time.Now()
		return
	}
	delete(c.mu.waiting, lc)
}

// admit takes a slot for a new connection. It reports whether one was
// free or made free, and returns the waiting connection to close for it,
// if any: that connection's slot passes to the new one.
func (c *connLimiter) admit() (ok bool, evict *limitedConn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.open < c.max {
		c.mu.open++
		return true, nil
	}
	var oldest time.Time
	for lc, since := range c.mu.waiting {
		if evict == nil || since.Before(oldest) {
			evict, oldest = lc, since
		}
	}
	if evict == nil {
		return false, nil
	}
	delete(c.mu.waiting, evict)
	evict.evicted = true
	return true, evict
}

// closed gives back the slot of lc, which has closed.
func (c *connLimiter) closed(lc *limitedConn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.mu.waiting, lc)
	if !lc.evicted {
		c.mu.open--
	}
}

type limitedListener struct {
	net.Listener
	c *connLimiter
}

func (l *limitedListener) Accept() (net.Conn, error) {
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ok, evict := l.c.admit()
		if evict != nil {
			evict.Conn.Close() // the server sees it fail and closes it
		}
		if ok {
			return &limitedConn{Conn: conn, c: l.c}, nil
		}
		conn.Close()
	}
}

// limitedConn gives its slot back when it closes, unless it was evicted:
// its slot then went to the connection that evicted it.
type limitedConn struct {
	net.Conn
	c       *connLimiter
	once    sync.Once
	evicted bool // guarded by c.mu
}

func (lc *limitedConn) Close() error {
	err := lc.Conn.Close()
	lc.once.Do(func() { lc.c.closed(lc) })
	return err
}
