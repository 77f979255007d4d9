package ttl

import (
	"bytes"
	"context"
	"errors"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestClasses(t *testing.T) {
	c := Classes{DefaultClass: 24 * time.Hour, "money": 30 * 24 * time.Hour, "http": time.Hour}
	require.NoError(t, c.Validate())
	w, err := c.Lookup("")
	require.NoError(t, err)
	require.Equal(t, 24*time.Hour, w)
	w, err = c.Lookup("money")
	require.NoError(t, err)
	require.Equal(t, 30*24*time.Hour, w)
	_, err = c.Lookup("nope")
	require.ErrorIs(t, err, ErrUnknownClass)
	require.Contains(t, err.Error(), "[default http money]")
	require.Equal(t, 30*24*time.Hour, c.Longest())

	for _, bad := range []Classes{
		{"": time.Hour},
		{"UPPER": time.Hour},
		{"has space": time.Hour},
		{"waytoolongwaytoolongwaytoolongway": time.Hour},
		{"zero": 0},
		{"negative": -time.Hour},
		{"forever": MaxWindow + 1},
	} {
		require.Error(t, bad.Validate(), "%v", bad)
	}
}

// memTarget is an in-memory Target: sorted keys, each expired or not, and
// a saved cursor. It stands in for the engine, whose own tests cover the
// real thing.
type memTarget struct {
	keys    []string
	expired map[string]bool
	cursor  []byte
	failAt  int // fail the chunk that would examine this key index (0: never)
	// failNext fails this many chunks from now on, then none: a transient
	// fault.
	failNext int
	chunks   int
}

func newMemTarget(n int, expiredEvery int) *memTarget {
	m := &memTarget{expired: map[string]bool{}}
	for i := range n {
		k := string(rune('a'+i/26)) + string(rune('a'+i%26))
		m.keys = append(m.keys, k)
		m.expired[k] = i%expiredEvery == 0
	}
	sort.Strings(m.keys)
	return m
}

func (m *memTarget) SweepCursor() ([]byte, error) { return bytes.Clone(m.cursor), nil }

func (m *memTarget) SweepChunk(_ context.Context, cursor []byte, n int, _ time.Time) (Chunk, error) {
	m.chunks++
	i := sort.SearchStrings(m.keys, string(cursor))
	if cursor != nil && i < len(m.keys) && m.keys[i] == string(cursor) {
		i++
	}
	if m.failAt > 0 && i <= m.failAt && m.failAt < i+n {
		return Chunk{}, errors.New("injected")
	}
	if m.failNext > 0 {
		m.failNext--
		return Chunk{}, errTransient
	}
	var c Chunk
	var kept []string
	kept = append(kept, m.keys[:i]...)
	j := i
	for ; j < len(m.keys) && c.Examined < n; j++ {
		c.Examined++
		k := m.keys[j]
		if m.expired[k] {
			c.Deleted++
			continue
		}
		kept = append(kept, k)
		c.Next = []byte(k)
	}
	if j < len(m.keys) {
		c.Next = []byte(m.keys[j-1])
	} else {
		c.Next = nil
	}
	m.keys = append(kept, m.keys[j:]...)
	m.cursor = bytes.Clone(c.Next)
	return c, nil
}

func TestPassResumesFromSavedCursor(t *testing.T) {
	m := newMemTarget(100, 3)
	m.failAt = 50
	s, err := New(m, &Options{ChunkSize: 10, Rate: -1})
	require.NoError(t, err)
	_, err = s.Pass(context.Background())
	require.Error(t, err)
	require.NotNil(t, m.cursor)

	m.failAt = 0
	p, err := s.Pass(context.Background())
	require.NoError(t, err)
	require.True(t, p.Resumed)
	require.Less(t, p.Examined, 100)
	require.Nil(t, m.cursor)
	require.Len(t, m.keys, 66)

	// A fresh pass over what is left deletes nothing more.
	p, err = s.Pass(context.Background())
	require.NoError(t, err)
	require.False(t, p.Resumed)
	require.Equal(t, 66, p.Examined)
	require.Zero(t, p.Deleted)
	st := s.Stats()
	require.EqualValues(t, 2, st.Passes)
	require.EqualValues(t, 34, st.Deleted)
}

// TestRunStartsPassesOnTheInjectedTimer drives the background loop with a
// timer channel the test owns: no waiting on the wall clock.
func TestRunStartsPassesOnTheInjectedTimer(t *testing.T) {
	m := newMemTarget(30, 2)
	ticks := make(chan time.Time)
	passes := make(chan Pass)
	s, err := New(m, &Options{ChunkSize: 4, Rate: -1, Interval: time.Hour,
		After:  func(time.Duration) <-chan time.Time { return ticks },
		OnPass: func(p Pass) { passes <- p }})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()

	p := <-passes // the first pass runs at once
	require.Equal(t, 15, p.Deleted)
	for k := range m.expired {
		m.expired[k] = true // everything expires
	}
	ticks <- time.Now()
	p = <-passes
	require.Equal(t, 15, p.Deleted)
	require.Empty(t, m.keys)

	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
}

var errTransient = errors.New("injected transient fault")

// TestRunRetriesAfterFailedPasses: a fault that lasts four passes costs
// four retries, each waiting twice as long as the last up to Interval,
// and the sweeper then sweeps as before. Stats say it is failing, and
// why, until a pass succeeds.
func TestRunRetriesAfterFailedPasses(t *testing.T) {
	m := newMemTarget(30, 2)
	m.failNext = 4
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	waits, ticks := make(chan time.Duration), make(chan time.Time)
	var inARow []int
	s, err := New(m, &Options{ChunkSize: 4, Rate: -1, Interval: 3 * time.Second, RetryWait: time.Second,
		After: func(d time.Duration) <-chan time.Time {
			waits <- d
			return ticks
		},
		OnError: func(err error, n int) {
			require.ErrorIs(t, err, errTransient)
			inARow = append(inARow, n)
		}})
	require.NoError(t, err)
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()

	next := func() time.Duration {
		select {
		case d := <-waits:
			return d
		case err := <-done:
			t.Fatalf("Run returned %v instead of retrying", err)
			return 0
		}
	}
	for i, ceiling := range []time.Duration{time.Second, 2 * time.Second, 3 * time.Second, 3 * time.Second} {
		d := next()
		require.GreaterOrEqual(t, d, ceiling/2, "retry %d", i+1)
		require.LessOrEqual(t, d, ceiling, "retry %d", i+1)
		st := s.Stats()
		require.EqualValues(t, i+1, st.Failures)
		require.ErrorIs(t, st.LastError, errTransient)
		require.False(t, st.FailingSince.IsZero())
		require.Zero(t, st.Passes)
		ticks <- time.Time{}
	}
	next() // after the pass that succeeded: Interval from its start
	st := s.Stats()
	require.EqualValues(t, 1, st.Passes)
	require.EqualValues(t, 15, st.Deleted)
	require.True(t, st.FailingSince.IsZero(), "no longer failing")
	require.EqualValues(t, 4, st.Failures)
	require.ErrorIs(t, st.LastError, errTransient, "kept for diagnosis")
	require.Equal(t, []int{1, 2, 3, 4}, inARow)

	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
}

func TestOptionsValidate(t *testing.T) {
	for _, o := range []Options{
		{Interval: -1},
		{ChunkSize: -1},
		{ChunkSize: 1 << 20},
		{RetryWait: -time.Second},
	} {
		_, err := New(&memTarget{}, &o)
		require.Error(t, err, "%+v", o)
	}
}
