package natsjs_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv/natsjs"
)

func seqs(ms []natsjs.Message) []uint64 {
	var s []uint64
	for _, m := range ms {
		s = append(s, m.Seq)
	}
	return s
}

func TestRead(t *testing.T) {
	ctx, _, p, s := setup(t, nil)
	js := p.JetStream()

	// An empty stream reads as nothing, at once.
	got, err := natsjs.ReadAll(ctx, js, streamName, 0)
	require.NoError(t, err)
	require.Empty(t, got)

	for i := uint64(1); i <= 5; i++ {
		require.NoError(t, p.Publish(ctx, event(i, "t", "", i)))
	}
	got, err = natsjs.ReadAll(ctx, js, streamName, 3)
	require.NoError(t, err)
	require.Equal(t, []uint64{3, 4, 5}, seqs(got))
	got, err = natsjs.ReadAll(ctx, js, streamName, 6)
	require.NoError(t, err)
	require.Empty(t, got)

	// Deleted messages are skipped, the last one too: Read ends when
	// nothing is pending, not at a sequence.
	require.NoError(t, s.DeleteMsg(ctx, 2))
	require.NoError(t, s.DeleteMsg(ctx, 5))
	got, err = natsjs.ReadAll(ctx, js, streamName, 1)
	require.NoError(t, err)
	require.Equal(t, []uint64{1, 3, 4}, seqs(got))

	// fn's error stops the read.
	stop := errors.New("stop")
	calls := 0
	err = natsjs.Read(ctx, js, streamName, 0, func(natsjs.Message) error {
		calls++
		if calls == 2 {
			return stop
		}
		return nil
	})
	require.ErrorIs(t, err, stop)
	require.Equal(t, 2, calls)

	// Every Read deleted its consumer.
	info, err := s.Info(ctx)
	require.NoError(t, err)
	require.Zero(t, info.State.Consumers)

	_, err = natsjs.ReadAll(ctx, js, "NOSUCH", 0)
	require.Error(t, err)
}

// Read honours ctx.
func TestReadCanceled(t *testing.T) {
	ctx, _, p, _ := setup(t, nil)
	require.NoError(t, p.Publish(ctx, event(1, "t", "", 1)))
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	_, err := natsjs.ReadAll(canceled, p.JetStream(), streamName, 0)
	require.ErrorIs(t, err, context.Canceled)
}
