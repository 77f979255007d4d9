package engine

import (
	"testing"

	"github.com/idemkv/idemkv"
	"github.com/stretchr/testify/require"
)

// A panic while a write holds its key busy (out of Pebble, building or
// committing the batch) fails the engine like a failed commit: the writer
// gets ErrFailed, a caller waiting on the key wakes to it, and Close
// returns instead of hanging.
func TestPanicInAWriteFailsTheEngine(t *testing.T) {
	v := newEnv(t)
	c := v.claim(id("k"), fpA, idemkv.ModeRemote)
	require.Equal(t, idemkv.Acquired, c.Outcome)

	busy, panicNow := make(chan struct{}), make(chan struct{})
	v.e.testHookWrite = func() {
		close(busy)
		<-panicNow
		panic("pebble: batch too large")
	}
	waiting := make(chan struct{})
	v.e.testHookWait = func() { close(waiting) }
	completed := make(chan error)
	go func() { completed <- v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, nil) }()
	<-busy
	released := make(chan error)
	go func() { released <- v.e.Release(ctx, c.Lease, nil) }()
	<-waiting // Release waits for the write in flight on its key
	close(panicNow)

	require.ErrorIs(t, <-completed, idemkv.ErrFailed)
	require.ErrorIs(t, <-released, idemkv.ErrFailed, "the waiter woke to the failure")
	_, err := v.e.Claim(ctx, idemkv.ClaimRequest{ID: id("other"), Fingerprint: fpA})
	require.ErrorIs(t, err, idemkv.ErrFailed)
	require.ErrorIs(t, v.e.Close(), idemkv.ErrFailed)
	v.e = nil

	v.open() // nothing of the panicked write is there
	require.Equal(t, idemkv.InProgress, v.claim(id("k"), fpA, idemkv.ModeRemote).Outcome)
}

// A panic while a stripe mutex is held (out of a Pebble read) leaves the
// mutex free: the next call on the same key answers.
func TestPanicInALookupReleasesTheStripe(t *testing.T) {
	v := newEnv(t)
	v.complete(id("k"))
	v.e.testHookLookup = func() { panic("pebble: corrupt block") }
	require.Panics(t, func() { _, _ = v.e.Get(ctx, id("k")) })
	require.Panics(t, func() { v.claim(id("k"), fpA, idemkv.ModeLocal) })
	v.e.testHookLookup = nil
	require.Equal(t, idemkv.Replay, v.claim(id("k"), fpA, idemkv.ModeLocal).Outcome)
	_, err := v.e.Get(ctx, id("k"))
	require.NoError(t, err)
}
