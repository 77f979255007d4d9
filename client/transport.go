package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// HeaderKey is the request header that carries the idempotency key, and
// HeaderReplayed the response header a server sets on a replayed answer
// (draft-ietf-httpapi-idempotency-key-header; package httpidem on the
// server side).
const (
	HeaderKey      = "Idempotency-Key"
	HeaderReplayed = "Idempotent-Replayed"
)

// Transport is an http.RoundTripper that makes an unsafe request safe to
// retry against a server that honours Idempotency-Key, and retries it: it
// gives each unsafe request (POST, PUT, PATCH, DELETE, any method but GET,
// HEAD, OPTIONS and TRACE) a fresh idempotency key unless the
// request has one, keeps that key on every attempt, and retries, with
// jittered exponential backoff that honours Retry-After, what may succeed
// later: connection errors; 5xx, 408, 425 and 429 answers (on which the
// server releases the key); and a 409 only when it is one of package
// httpidem's problems that say "retry with the same key": in-progress,
// reconciling or lease-lost (an application/problem+json body of that
// type). It never retries a business 409 (out of stock, say), another
// 4xx (a 422 says the key was used for a different request; retrying it
// cannot help), nor an error that cannot pass (a certificate the client
// does not trust). Safe
// methods pass through, retried the same way. Against a server that
// ignores the header, a retried POST runs twice: the key is what makes
// retrying safe.
//
// A Transport is safe for concurrent use. The zero value uses
// http.DefaultTransport and the defaults of Options.
type Transport struct {
	// Base sends each attempt. Default: http.DefaultTransport.
	Base http.RoundTripper
	// Options shape the retries; nil means the defaults.
	Options *Options
}

// Options shape a Transport's retries. Zero fields take their defaults.
type Options struct {
	// MaxAttempts bounds the attempts of one request, the first included.
	// Default: 8.
	MaxAttempts int
	// MaxElapsed bounds the time from the first attempt to the start of
	// the last. Default: 2 minutes.
	MaxElapsed time.Duration
	// InitialInterval and MaxInterval shape the backoff between attempts:
	// doubling from InitialInterval, each wait drawn within ±50% of it,
	// and no wait longer than MaxInterval. A Retry-After on the answer
	// replaces the wait (capped at MaxInterval too). Defaults: 100 ms and
	// 10 s.
	InitialInterval, MaxInterval time.Duration
	// MaxBufferedBody bounds the body the Transport copies to send again,
	// for a request without GetBody (http.NewRequest sets it for the usual
	// readers). A larger body is sent once, without retries. Default: 1 MiB.
	MaxBufferedBody int64
	// NewKey returns a fresh idempotency key. Default: 128 random bits in
	// hex.
	NewKey func() string
	// After waits between attempts. Default: time.After. Tests inject it.
	After func(time.Duration) <-chan time.Time
}

// withDefaults returns a copy of o (which may be nil) with every zero
// field set to its default.
func (o *Options) withDefaults() Options {
	var c Options
	if o != nil {
		c = *o
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 8
	}
	if c.MaxElapsed <= 0 {
		c.MaxElapsed = 2 * time.Minute
	}
	if c.InitialInterval <= 0 {
		c.InitialInterval = 100 * time.Millisecond
	}
	if c.MaxInterval <= 0 {
		c.MaxInterval = 10 * time.Second
	}
	if c.MaxBufferedBody <= 0 {
		c.MaxBufferedBody = 1 << 20
	}
	if c.NewKey == nil {
		c.NewKey = newKey
	}
	if c.After == nil {
		c.After = time.After
	}
	return c
}

// New returns an http.Client whose transport is a Transport over base
// (nil: http.DefaultTransport).
func New(base http.RoundTripper, opts *Options) *http.Client {
	return &http.Client{Transport: &Transport{Base: base, Options: opts}}
}

// Replayed reports whether resp is a replay of an answer the server
// stored for an earlier attempt of the same request: that attempt
// reached the server, and its effect happened once.
func Replayed(resp *http.Response) bool {
	return resp != nil && resp.Header.Get(HeaderReplayed) == "true"
}

// SetKey gives req a fresh idempotency key unless it has one, and
// returns its key. The Transport gives a request without a key a fresh
// one on each RoundTrip, and never changes the caller's request: a
// caller that may send the request again once the Transport has given up
// (a job queue, a user pressing the button again) calls SetKey first and
// keeps the key, and the same operation is retried rather than run anew.
func SetKey(req *http.Request) string {
	if k := req.Header.Get(HeaderKey); k != "" {
		return k
	}
	if req.Header == nil {
		req.Header = make(http.Header)
	}
	k := newKey()
	req.Header.Set(HeaderKey, k)
	return k
}

// Key returns the idempotency key resp's request was sent with ("" if
// none): the key the Transport chose, if the caller set none.
func Key(resp *http.Response) string {
	if resp == nil || resp.Request == nil {
		return ""
	}
	return resp.Request.Header.Get(HeaderKey)
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	o := t.Options.withDefaults()
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	req, resend, err := prepare(req, &o)
	if err != nil {
		return nil, err
	}
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval, b.Multiplier = o.InitialInterval, o.MaxInterval, 2
	ctx := req.Context()
	start := time.Now()
	for attempt := 1; ; attempt++ {
		resp, err := base.RoundTrip(req)
		if !retryable(ctx, resp, err) || attempt >= o.MaxAttempts || !resend.ok() {
			return resp, err
		}
		wait := min(b.NextBackOff(), o.MaxInterval)
		if resp != nil {
			if ra, ok := retryAfter(resp.Header.Get("Retry-After"), o.MaxInterval); ok {
				wait = ra
			}
		}
		// Give up rather than start an attempt past MaxElapsed or the
		// caller's deadline: the answer in hand (a 409, a 503) says more
		// than a cancelled wait would.
		deadline, hasDeadline := ctx.Deadline()
		if time.Since(start)+wait > o.MaxElapsed || (hasDeadline && time.Until(deadline) < wait) {
			return resp, err
		}
		if resp != nil {
			// Drain a little so the connection can be reused, then let go.
			_, _ = io.CopyN(io.Discard, resp.Body, 4<<10)
			resp.Body.Close()
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-o.After(wait):
		}
		if err := ctx.Err(); err != nil { // both were ready: the caller wins
			return nil, err
		}
		if req, err = resend.next(req); err != nil {
			return nil, err
		}
	}
}

// The problem types (RFC 9457) of the 409s that package httpidem answers
// when the same request should be sent again with the same key: the
// first attempt is still running, its outcome is being reconciled, or it
// outlived its lease and another attempt took over. Any other 409 (out of
// stock, a version conflict) is the server's answer, and is not retried.
const (
	problemBase        = "https://github.com/idemkv/idemkv/blob/main/docs/http.md#"
	problemInProgress  = problemBase + "in-progress"
	problemReconciling = problemBase + "reconciling"
	problemLeaseLost   = problemBase + "lease-lost"
)

// maxProblem bounds the body of a 409 read to learn its problem type; the
// middleware's are a few hundred bytes.
const maxProblem = 8 << 10

// retryable reports whether an attempt's result calls for another, while
// the caller's context is live: a transport error that may pass; a 5xx,
// 408, 425 or 429 (the answers on which the server releases the key); a
// 409 of one of the middleware's problem types that mean "retry with the
// same key" (retryConflict). Never another 4xx.
func retryable(ctx context.Context, resp *http.Response, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	if err != nil {
		var verify *tls.CertificateVerificationError
		var unknown x509.UnknownAuthorityError
		var host x509.HostnameError
		return !errors.As(err, &verify) && !errors.As(err, &unknown) && !errors.As(err, &host)
	}
	switch s := resp.StatusCode; {
	case s >= 500, s == http.StatusRequestTimeout, s == http.StatusTooEarly, s == http.StatusTooManyRequests:
		return true
	case s == http.StatusConflict:
		return retryConflict(resp)
	}
	return false
}

// retryConflict reports whether the 409 resp is one of the middleware's
// in-progress, reconciling or lease-lost problems: an
// application/problem+json body whose type is one of theirs. It reads
// the start of the body to learn it, and puts it back: the caller of a
// 409 that is not retried reads the body whole.
func retryConflict(resp *http.Response) bool {
	mt, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if err != nil || mt != "application/problem+json" || resp.Body == nil {
		return false
	}
	head, err := io.ReadAll(io.LimitReader(resp.Body, maxProblem))
	rest := resp.Body
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(head), rest), rest}
	if err != nil {
		return false // the answer broke off: return what came
	}
	var p struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(head, &p) != nil {
		return false
	}
	switch p.Type {
	case problemInProgress, problemReconciling, problemLeaseLost:
		return true
	}
	return false
}

// retryAfter parses a Retry-After value, delay seconds or an HTTP date,
// capped at limit.
func retryAfter(v string, limit time.Duration) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil && s >= 0 {
		if s > int64(limit/time.Second) {
			return limit, true
		}
		return min(time.Duration(s)*time.Second, limit), true
	}
	if t, err := http.ParseTime(v); err == nil {
		return min(max(0, time.Until(t)), limit), true
	}
	return 0, false
}

// prepare returns the request to send first, with a key if its method is
// unsafe and it has none, and how to send it again.
func prepare(req *http.Request, o *Options) (*http.Request, resender, error) {
	if unsafe(req.Method) && req.Header.Get(HeaderKey) == "" {
		req = req.Clone(req.Context()) // never change the caller's request
		if req.Header == nil {
			req.Header = make(http.Header) // a request not made by http.NewRequest
		}
		req.Header.Set(HeaderKey, o.NewKey())
	}
	switch {
	case req.Body == nil || req.Body == http.NoBody || req.GetBody != nil:
		return req, resender{can: true}, nil
	}
	// A body that cannot be had again: copy it, if it is small enough.
	body, err := io.ReadAll(io.LimitReader(req.Body, o.MaxBufferedBody+1))
	if err != nil {
		req.Body.Close()
		return nil, resender{}, fmt.Errorf("client: read request body: %w", err)
	}
	if int64(len(body)) > o.MaxBufferedBody {
		// Too large to keep: send it once, the copied part first.
		rest := req.Body
		req = req.Clone(req.Context())
		req.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(body), rest), rest}
		return req, resender{}, nil
	}
	req.Body.Close()
	req = req.Clone(req.Context())
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	req.Body, _ = req.GetBody()
	req.ContentLength = int64(len(body))
	return req, resender{can: true}, nil
}

// resender makes the next attempt's request, with the same key and a
// fresh copy of the body.
type resender struct{ can bool }

func (r resender) ok() bool { return r.can }

func (r resender) next(req *http.Request) (*http.Request, error) {
	next := req.Clone(req.Context())
	if req.GetBody != nil {
		body, err := req.GetBody()
		if err != nil {
			return nil, fmt.Errorf("client: request body again: %w", err)
		}
		next.Body = body
	}
	return next, nil
}

// unsafe reports whether method may change the server's state (RFC 9110
// §9.2.1): the requests an idempotency key is for.
func unsafe(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return false
	}
	return true
}

func newKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}
