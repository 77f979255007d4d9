package natsjs_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv/natsjs"
)

// The embedded server listens on loopback, creates its store, and keeps
// the streams across a restart on the same directory and port.
func TestEmbedded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	dir := filepath.Join(t.TempDir(), "events")

	e, err := natsjs.StartEmbedded(dir, 0)
	require.NoError(t, err)
	t.Cleanup(e.Shutdown)
	require.Positive(t, e.Port())
	require.True(t, strings.HasPrefix(e.URL(), "nats://127.0.0.1:"), e.URL())

	p, err := natsjs.Connect(e.URL(), nil)
	require.NoError(t, err)
	_, err = natsjs.EnsureStream(ctx, p.JetStream(), streamName, []string{"orders.>"}, 0)
	require.NoError(t, err)
	require.NoError(t, p.Publish(ctx, event(1, "orders.created", "o1", 1)))
	require.NoError(t, p.Close())
	e.Shutdown()
	e.Shutdown() // a second Shutdown does nothing

	e2, err := natsjs.StartEmbedded(dir, e.Port())
	require.NoError(t, err)
	t.Cleanup(e2.Shutdown)
	require.Equal(t, e.URL(), e2.URL())
	p, err = natsjs.Connect(e2.URL(), nil)
	require.NoError(t, err)
	defer p.Close()
	got, err := natsjs.ReadAll(ctx, p.JetStream(), streamName, 0)
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, "payload 1", string(got[0].Data))
}

func TestEmbeddedBadArguments(t *testing.T) {
	_, err := natsjs.StartEmbedded("", 0)
	require.ErrorContains(t, err, "empty store directory")
	_, err = natsjs.StartEmbedded(t.TempDir(), -1)
	require.ErrorContains(t, err, "outside 0..65535")
}
