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
// status, counting attempts and the response bodies closed.
type scripted struct {
	statuses []int
	attempts atomic.Int32
	closed   atomic.Int32
	bodies   []string
	// retryAfter, if set, is every answer's Retry-After.
	retryAfter string
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
	if n >= len(s.statuses) {
		return nil, errors.New("script ran out")
	}
	h := http.Header{}
	if s.retryAfter != "" {
		h.Set("Retry-After", s.retryAfter)
	}
	return &http.Response{StatusCode: s.statuses[n], Header: h,
		Body: countingBody{strings.NewReader("answer"), &s.closed}, Request: req}, nil
}

func instant(time.Duration) <-chan time.Time {
	c := make(chan time.Time, 1)
	c <- time.Time{}
	return c
}

// Every answer it retries past is closed; the one it returns is not.
func TestRetriedAnswersAreClosed(t *testing.T) {
	s := &scripted{statuses: []int{503, 409, 201}}
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
