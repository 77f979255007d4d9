package engine

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
)

// A flush that cannot create its sstable makes the store unhealthy: Health
// and Stats say so and why, new claims are refused at once, and a key
// already held can still be completed. The next flush that succeeds makes
// it healthy again.
func TestBackgroundErrorMakesTheStoreUnhealthyUntilAFlushSucceeds(t *testing.T) {
	var armed atomic.Bool
	inj := failingSSTables(&armed, errorfs.OpCreate)
	logs := &healthLog{unhealthy: make(chan struct{}, 1), healthy: make(chan struct{}, 1)}
	v := newEnv(t)
	v.opts.FS = errorfs.Wrap(vfs.Default, inj)
	v.opts.NoBackgroundSweep = true
	v.opts.Logger = logs
	v.reopen()
	require.NoError(t, v.e.Health(ctx))

	held := v.claim(id("held"), fpA, idemkv.ModeLocal)
	done := v.claim(id("done"), fpA, idemkv.ModeLocal)
	require.NoError(t, v.e.Complete(ctx, done.Lease, idemkv.Result{Status: 201}, nil))
	armed.Store(true)
	flushed := make(chan error, 1)
	go func() { flushed <- v.e.Flush() }() // Pebble retries the flush until it succeeds
	<-logs.unhealthy

	err := v.e.Health(ctx)
	require.ErrorIs(t, err, ErrUnhealthy)
	require.ErrorContains(t, err, "injected")
	_, err = v.e.Claim(ctx, idemkv.ClaimRequest{ID: id("new"), Fingerprint: fpA})
	require.ErrorIs(t, err, ErrUnhealthy, "refused at once")
	require.Equal(t, idemkv.Replay, v.claim(id("done"), fpA, idemkv.ModeLocal).Outcome, "replays go on")
	st := v.stats()
	require.Positive(t, st.BackgroundErrors)
	require.False(t, st.UnhealthySince.IsZero())
	require.NoError(t, v.e.Complete(ctx, held.Lease, idemkv.Result{Status: 201}, nil), "held keys go on")

	armed.Store(false)
	require.NoError(t, <-flushed)
	<-logs.healthy
	require.NoError(t, v.e.Health(ctx))
	require.True(t, v.stats().UnhealthySince.IsZero())
	require.Equal(t, idemkv.Acquired, v.claim(id("new"), fpA, idemkv.ModeLocal).Outcome)
	require.Equal(t, idemkv.Replay, v.claim(id("done"), fpA, idemkv.ModeLocal).Outcome)
}

// healthLog is a Logger that signals the health messages of health.go
// (once each) and drops the rest.
type healthLog struct{ unhealthy, healthy chan struct{} }

func (l *healthLog) Infof(string, ...any) {}
func (l *healthLog) Errorf(format string, _ ...any) {
	switch {
	case strings.HasPrefix(format, "idemkv: store unhealthy"):
		select {
		case l.unhealthy <- struct{}{}:
		default:
		}
	case strings.HasPrefix(format, "idemkv: store healthy again"):
		select {
		case l.healthy <- struct{}{}:
		default:
		}
	}
}
func (l *healthLog) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
