package httpidem

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
)

// errNotSent is returned by writes after a streamed response's outcome
// could not be committed: nothing is sent, the client gets a 503.
var errNotSent = errors.New("httpidem: response not sent: its outcome could not be stored")

// capture buffers a handler's response so that its outcome can be stored
// before the client sees any of it. A response that outgrows limit, or
// that the handler flushes, is committed at that moment (spill) and then
// streamed.
type capture struct {
	w      http.ResponseWriter
	header http.Header
	status int
	buf    bytes.Buffer
	limit  int
	// spill commits the outcome of a response about to stream. If it
	// fails the response is dropped (the caller answers the failure).
	spill     func(c *capture) error
	streaming bool
	dropped   bool
}

func (c *capture) Header() http.Header { return c.header }

func (c *capture) WriteHeader(code int) {
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code)) // as net/http does
	}
	if c.status != 0 || code < 200 {
		return // informational responses are not relayed
	}
	c.status = code
}

func (c *capture) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	if c.dropped {
		return 0, errNotSent
	}
	if c.streaming {
		return c.w.Write(p)
	}
	if c.buf.Len()+len(p) <= c.limit {
		return c.buf.Write(p)
	}
	if err := c.startStreaming(); err != nil {
		return 0, err
	}
	return c.w.Write(p)
}

// Flush commits the outcome (the response is streaming from now on) and
// flushes what was written so far.
func (c *capture) Flush() {
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	if !c.streaming && !c.dropped && c.startStreaming() != nil {
		return
	}
	if c.streaming {
		http.NewResponseController(c.w).Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection's writer (for
// deadlines).
func (c *capture) Unwrap() http.ResponseWriter { return c.w }

func (c *capture) startStreaming() error {
	if err := c.spill(c); err != nil {
		c.dropped = true
		return errNotSent
	}
	c.streaming = true
	h := c.w.Header()
	for k, v := range c.header {
		h[k] = v
	}
	c.w.WriteHeader(c.status)
	if c.buf.Len() > 0 {
		_, err := c.w.Write(c.buf.Bytes())
		c.buf.Reset()
		return err
	}
	return nil
}

// send writes a buffered response to the client.
func (c *capture) send(extra http.Header) {
	h := c.w.Header()
	for k, v := range c.header {
		h[k] = v
	}
	for k, v := range extra {
		h[k] = v
	}
	status := c.status
	if status == 0 {
		status = http.StatusOK
	}
	c.w.WriteHeader(status)
	c.w.Write(c.buf.Bytes())
}
