package once_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/once"
)

// TestNoEffectAfterATakeoverLeavesTheKeyUncertain: a resumable remote
// call takes over a holder that crashed (its call may have gone out,
// under the same operation id); the downstream refuses the new call
// before acting, and the function says so (NoEffect). That proves
// nothing of the first call: the key becomes uncertain for a reconciler
// to ask about, rather than released for a retry to charge again.
func TestNoEffectAfterATakeoverLeavesTheKeyUncertain(t *testing.T) {
	errRefused := errors.New("psp: invalid request (refused before acting)")
	v := newEnv(t, nil)
	crashed := v.holder("k", idemkv.ModeRemote, true)
	v.clock.Advance(lease + time.Second)
	c := remote("k")
	c.Resumable = true
	_, err := once.Do(ctx, v.e, c, func(_ context.Context, x *once.Exec) (idemkv.Result, error) {
		require.True(t, x.Lease.Takeover())
		require.Equal(t, crashed.OperationID, x.Lease.OperationID)
		return idemkv.Result{}, once.NoEffect(errRefused)
	})
	require.ErrorIs(t, err, once.ErrUncertain)
	require.NotErrorIs(t, err, once.ErrNoEffect, "the key was not released")
	require.ErrorIs(t, err, errRefused, "the cause is kept")
	rec, err := v.e.Get(ctx, id("k"))
	require.NoError(t, err)
	require.Equal(t, idemkv.StateUncertain, rec.State)
}

// TestANoteOfAnyBytesIsKept: a remote function's error that echoes a
// downstream's answer (a NUL, bytes that are not UTF-8) still marks its
// key uncertain, on every store: the note is made one every store keeps.
func TestANoteOfAnyBytesIsKept(t *testing.T) {
	v := newEnv(t, nil)
	_, err := once.Do(ctx, v.e, remote("k"), func(context.Context, *once.Exec) (idemkv.Result, error) {
		return idemkv.Result{}, errors.New("psp: 502 body \xff\x00")
	})
	require.ErrorIs(t, err, once.ErrUncertain)
	rec, err := v.e.Get(ctx, id("k"))
	require.NoError(t, err)
	require.Equal(t, idemkv.StateUncertain, rec.State)
	require.Contains(t, rec.Note, "psp: 502 body")
}
