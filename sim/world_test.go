package sim

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// pingPong is a small world: a client calls a server over a lossy link,
// retrying on timeouts, while a third process crashes the server once.
func pingPong(seed uint64) (*World, []string, error) {
	w := New(seed, epoch)
	client, server, chaos := w.NewProc("client"), w.NewProc("server"), w.NewProc("chaos")
	link := Link{Min: time.Millisecond, Max: 2 * time.Second, Slow: 0.3, Loss: 0.2}
	var got []string
	served := 0
	w.Go(client, func() {
		for i := 0; i < 5; i++ {
			for {
				v, err := client.Call(context.Background(), time.Second, func(reply func(any, error)) {
					n := i
					w.Send(link, server, func() {
						served++
						w.Send(link, client, func() { reply(fmt.Sprint("pong ", n), nil) })
					})
				})
				if err == nil {
					got = append(got, v.(string))
					w.Logf("client: %v", v)
					break
				}
				w.Logf("client: %v", err)
				_ = client.Sleep(100 * time.Millisecond)
			}
		}
	})
	w.Go(chaos, func() {
		_ = chaos.Sleep(time.Duration(w.Rand().Int64N(int64(3 * time.Second))))
		server.Freeze(500 * time.Millisecond)
		w.Logf("chaos: froze the server")
	})
	err := w.Run(epoch.Add(time.Hour))
	w.Close()
	_ = served
	return w, got, err
}

func TestWorldIsDeterministic(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		w1, got1, err1 := pingPong(seed)
		w2, got2, err2 := pingPong(seed)
		require.NoError(t, err1)
		require.NoError(t, err2)
		require.Equal(t, got1, got2)
		var b1, b2 strings.Builder
		w1.Trace().WriteTo(&b1, 0)
		w2.Trace().WriteTo(&b2, 0)
		require.Equal(t, b1.String(), b2.String(), "seed %d", seed)
		require.Len(t, got1, 5)
		for i, g := range got1 {
			require.Equal(t, fmt.Sprint("pong ", i), g)
		}
	}
}

func TestCrashReleasesBlockedActors(t *testing.T) {
	w := New(1, epoch)
	p, chaos := w.NewProc("p"), w.NewProc("chaos")
	var errs = make(chan error, 2)
	closed := false
	p.OnCrash(func() { closed = true })
	w.Go(p, func() { errs <- p.Sleep(time.Hour) })
	w.Go(p, func() {
		_, err := p.Call(context.Background(), 0, func(func(any, error)) {})
		errs <- err
	})
	fired := false
	p.AfterFunc(2*time.Second, func() { fired = true })
	w.Go(chaos, func() {
		_ = chaos.Sleep(time.Second)
		p.Crash()
	})
	require.NoError(t, w.Run(epoch.Add(24*time.Hour)))
	require.ErrorIs(t, <-errs, ErrCrashed)
	require.ErrorIs(t, <-errs, ErrCrashed)
	require.True(t, closed)
	require.False(t, fired, "a crashed process's timer fired")
	require.True(t, p.Dead())
	w.Close()
}

func TestFreezeHoldsTimersAndMessages(t *testing.T) {
	w := New(1, epoch)
	p, other := w.NewProc("p"), w.NewProc("other")
	var at []time.Duration
	p.AfterFunc(time.Second, func() { at = append(at, w.Now().Sub(epoch)) })
	w.Go(other, func() {
		p.Freeze(5 * time.Second)
		w.Send(Link{Min: time.Second, Max: time.Second}, p, func() { at = append(at, w.Now().Sub(epoch)) })
	})
	require.NoError(t, w.Run(epoch.Add(time.Minute)))
	require.Equal(t, []time.Duration{5 * time.Second, 5 * time.Second}, at)
	w.Close()
}

func TestPokeEndsCallsWhoseContextEnded(t *testing.T) {
	w := New(1, epoch)
	p, other := w.NewProc("p"), w.NewProc("other")
	ctx, cancel := context.WithCancel(context.Background())
	var err error
	w.Go(p, func() { _, err = p.Call(ctx, 0, func(func(any, error)) {}) })
	w.Go(other, func() {
		_ = other.Sleep(time.Second)
		cancel()
		p.Poke()
	})
	require.NoError(t, w.Run(epoch.Add(time.Minute)))
	require.True(t, errors.Is(err, context.Canceled), "%v", err)
	w.Close()
}

func TestActorPanicFailsTheRun(t *testing.T) {
	w := New(1, epoch)
	p := w.NewProc("p")
	w.Go(p, func() { panic("boom") })
	err := w.Run(epoch.Add(time.Minute))
	require.ErrorContains(t, err, "boom")
	w.Close()
}

// A timer of a process that crashed never fires; stopping it says so,
// as a Go timer's Stop does for a timer that never ran.
func TestTimerOfACrashedProcessStops(t *testing.T) {
	w := New(1, epoch)
	p, chaos := w.NewProc("p"), w.NewProc("chaos")
	stop := p.AfterFunc(time.Second, func() { t.Error("fired") })
	w.Go(chaos, func() { p.Crash() })
	require.NoError(t, w.Run(epoch.Add(time.Minute)))
	require.True(t, stop(), "a timer that never fired")
	require.True(t, p.AfterFunc(time.Second, func() {})(), "a dead process's timer")
	w.Close()
}
