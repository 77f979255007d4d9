package client

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv/httpidem"
)

func TestRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want time.Duration
		ok   bool
	}{
		{"", 0, false},
		{"3", 3 * time.Second, true},
		{"0", 0, true},
		{"9300000000", 10 * time.Second, true}, // would overflow a Duration: capped
		{"-1", 0, false},
		{"soon", 0, false},
		{time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat), 0, true},
		{time.Now().Add(time.Hour).UTC().Format(http.TimeFormat), 10 * time.Second, true},
	} {
		got, ok := retryAfter(tc.v, 10*time.Second)
		require.Equal(t, tc.ok, ok, tc.v)
		require.Equal(t, tc.want, got, tc.v)
	}
}

// scripted is a base transport that answers each attempt with the next
// status (a text/plain "answer"), or the next of answers if set, counting
// attempts and the response bodies closed.
type scripted struct {
	statuses []int
	answers  []answer
	attempts atomic.Int32
	closed   atomic.Int32
	bodies   []string
	// retryAfter, if set, is every answer's Retry-After.
	retryAfter string
}

// answer is one scripted answer: an error, or a status with a body.
type answer struct {
	status int
	ctype  string
	body   string
	err    error
}

type countingBody struct {
	io.Reader
	closed *atomic.Int32
}

func (b countingBody) Close() error { b.closed.Add(1); return nil }

func (s *scripted) RoundTrip(req *http.Request) (*http.Response, error) {
	n := int(s.attempts.Add(1)) - 1
	if req.Body != nil {
		b, _ := io.ReadAll(req.Body)
		req.Body.Close()
		s.bodies = append(s.bodies, string(b))
	}
	var a answer
	switch {
	case n < len(s.answers):
		a = s.answers[n]
	case n < len(s.statuses):
		a = answer{status: s.statuses[n], ctype: "text/plain", body: "answer"}
	default:
		return nil, errors.New("script ran out")
	}
	if a.err != nil {
		return nil, a.err
	}
	h := http.Header{"Content-Type": {a.ctype}}
	if s.retryAfter != "" {
		h.Set("Retry-After", s.retryAfter)
	}
	return &http.Response{StatusCode: a.status, Header: h,
		Body: countingBody{strings.NewReader(a.body), &s.closed}, Request: req}, nil
}

// problem is a 409 answer of the given problem type, as httpidem writes
// one.
func problem(typ string) answer {
	return answer{status: http.StatusConflict, ctype: "application/problem+json",
		body: `{"type":"` + typ + `","title":"t","status":409}`}
}

var created = answer{status: http.StatusCreated, ctype: "application/json", body: `{"id":"x"}`}

func instant(time.Duration) <-chan time.Time {
	c := make(chan time.Time, 1)
	c <- time.Time{}
	return c
}

// Every answer it retries past is closed; the one it returns is not.
func TestRetriedAnswersAreClosed(t *testing.T) {
	s := &scripted{answers: []answer{{status: 503}, problem(problemInProgress), created}}
	c := New(s, &Options{After: instant})
	resp, err := c.Post("http://x/", "text/plain", strings.NewReader("body"))
	require.NoError(t, err)
	require.Equal(t, 201, resp.StatusCode)
	require.EqualValues(t, 3, s.attempts.Load())
	require.EqualValues(t, 2, s.closed.Load())
	require.Equal(t, []string{"body", "body", "body"}, s.bodies)
}

// A body too large to copy, without GetBody, is sent once.
func TestLargeBodyWithoutGetBodyIsSentOnce(t *testing.T) {
	s := &scripted{statuses: []int{503, 201}}
	c := New(s, &Options{After: instant, MaxBufferedBody: 4})
	req, err := http.NewRequest("POST", "http://x/", io.NopCloser(strings.NewReader("a longer body")))
	require.NoError(t, err)
	resp, err := c.Do(req)
	require.NoError(t, err)
	require.Equal(t, 503, resp.StatusCode, "not retried")
	require.Equal(t, []string{"a longer body"}, s.bodies, "sent whole")
}

// No attempt starts past MaxElapsed: the answer in hand is returned.
func TestMaxElapsedBoundsTheLastStart(t *testing.T) {
	s := &scripted{statuses: []int{503, 503, 503, 201}}
	c := New(s, &Options{After: instant, MaxElapsed: time.Second, InitialInterval: 2 * time.Second})
	resp, err := c.Post("http://x/", "text/plain", strings.NewReader("body"))
	require.NoError(t, err)
	require.Equal(t, 503, resp.StatusCode)
	require.EqualValues(t, 1, s.attempts.Load(), "the first wait would end past MaxElapsed")
}

// A wait that would outlast the caller's deadline is not started: the
// caller gets the answer in hand, not a DeadlineExceeded.
func TestDeadlineBeforeTheWaitReturnsTheAnswer(t *testing.T) {
	s := &scripted{statuses: []int{503, 201}, retryAfter: "5"}
	c := New(s, &Options{After: instant})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", "http://x/", strings.NewReader("body"))
	require.NoError(t, err)
	resp, err := c.Do(req)
	require.NoError(t, err)
	require.Equal(t, 503, resp.StatusCode)
	require.EqualValues(t, 1, s.attempts.Load())
	require.Zero(t, s.closed.Load(), "the answer returned is open")
}

// The problem types the client retries are the middleware's.
func TestProblemTypesAreTheMiddlewares(t *testing.T) {
	require.Equal(t, httpidem.ProblemBase+httpidem.ProblemInProgress, problemInProgress)
	require.Equal(t, httpidem.ProblemBase+httpidem.ProblemReconciling, problemReconciling)
	require.Equal(t, httpidem.ProblemBase+httpidem.ProblemLeaseLost, problemLeaseLost)
}

// What may succeed later is retried, with the same key: connection
// errors, 5xx, 408, 425, 429, and the middleware's 409s that say "retry
// with the same key".
func TestRetriesWhatMaySucceedLater(t *testing.T) {
	for name, first := range map[string]answer{
		"connection error":   {err: errors.New("connection reset by peer")},
		"500":                {status: 500},
		"502":                {status: 502},
		"503":                {status: 503},
		"504":                {status: 504},
		"408":                {status: 408},
		"425":                {status: 425},
		"429":                {status: 429},
		"409 in-progress":    problem(problemInProgress),
		"409 reconciling":    problem(problemReconciling),
		"409 lease-lost":     problem(problemLeaseLost),
		"409 with a charset": {status: 409, ctype: "application/problem+json; charset=utf-8", body: problem(problemInProgress).body},
	} {
		t.Run(name, func(t *testing.T) {
			s := &scripted{answers: []answer{first, created}}
			var keys []string
			c := New(recordKeys(s, &keys), &Options{After: instant})
			resp, err := c.Post("http://x/", "application/json", strings.NewReader(`{}`))
			require.NoError(t, err)
			defer resp.Body.Close()
			require.Equal(t, http.StatusCreated, resp.StatusCode)
			require.EqualValues(t, 2, s.attempts.Load())
			require.Len(t, keys, 2)
			require.Equal(t, keys[0], keys[1], "the same key")
		})
	}
}

// The server's own answers are returned at once, their bodies whole: a
// business 409 (a problem of another type, or not a problem at all) and
// every other 4xx.
func TestNeverRetriesTheServersAnswer(t *testing.T) {
	outOfStock := `{"type":"https://shop.example/problems/out-of-stock","title":"Out of stock","status":409}`
	for name, a := range map[string]answer{
		"409 business problem":         {status: 409, ctype: "application/problem+json", body: outOfStock},
		"409 text":                     {status: 409, ctype: "text/plain", body: "out of stock"},
		"409 json, not a problem":      {status: 409, ctype: "application/json", body: problem(problemInProgress).body},
		"409 problem without a type":   {status: 409, ctype: "application/problem+json", body: `{"title":"Conflict","status":409}`},
		"409 problem that is not json": {status: 409, ctype: "application/problem+json", body: `{"type":`},
		"409 empty":                    {status: 409},
		"409 big problem": {status: 409, ctype: "application/problem+json",
			body: `{"detail":"` + strings.Repeat("x", 3*maxProblem) + `","type":"` + problemInProgress + `"}`},
		"400": {status: 400, ctype: "application/problem+json", body: `{"type":"about:blank"}`},
		"401": {status: 401},
		"402": {status: 402, ctype: "application/json", body: `{"error":"card declined"}`},
		"403": {status: 403},
		"404": {status: 404},
		"410": {status: 410},
		"412": {status: 412},
		"413": {status: 413},
		"422": {status: 422, ctype: "application/problem+json", body: `{"type":"` + problemBase + `key-mismatch"}`},
	} {
		t.Run(name, func(t *testing.T) {
			s := &scripted{answers: []answer{a, created}}
			c := New(s, &Options{After: instant})
			resp, err := c.Post("http://x/", "application/json", strings.NewReader(`{}`))
			require.NoError(t, err)
			defer resp.Body.Close()
			require.Equal(t, a.status, resp.StatusCode)
			require.EqualValues(t, 1, s.attempts.Load(), "not retried")
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.Equal(t, a.body, string(body), "the body comes back whole")
		})
	}
}

// A 429's Retry-After is the wait, as a 503's is.
func TestRetryAfterOnA429(t *testing.T) {
	s := &scripted{statuses: []int{429, 201}, retryAfter: "3"}
	var waits []time.Duration
	c := New(s, &Options{After: func(d time.Duration) <-chan time.Time {
		waits = append(waits, d)
		return instant(d)
	}})
	resp, err := c.Post("http://x/", "text/plain", strings.NewReader("body"))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 201, resp.StatusCode)
	require.Equal(t, []time.Duration{3 * time.Second}, waits)
}

// recordKeys wraps base, appending each attempt's Idempotency-Key to keys.
func recordKeys(base http.RoundTripper, keys *[]string) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		*keys = append(*keys, req.Header.Get(HeaderKey))
		return base.RoundTrip(req)
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }
