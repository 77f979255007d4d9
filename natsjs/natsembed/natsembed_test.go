package natsembed_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/natsjs"
	"github.com/idemkv/idemkv/natsjs/natsembed"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testTimeout bounds each test's broker calls. It only turns a hang into a
// failure; nothing waits for it to pass.
const testTimeout = 10 * time.Second

const streamName = "IDEMKV"

// The server listens on loopback, creates its store, and keeps the
// streams across a restart on the same directory and port.
func TestServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	dir := filepath.Join(t.TempDir(), "events")

	e, err := natsembed.Start(dir, 0)
	require.NoError(t, err)
	t.Cleanup(e.Shutdown)
	require.Positive(t, e.Port())
	require.True(t, strings.HasPrefix(e.URL(), "nats://127.0.0.1:"), e.URL())

	p, err := natsjs.Connect(e.URL(), nil)
	require.NoError(t, err)
	_, err = natsjs.EnsureStream(ctx, p.JetStream(), streamName, []string{"orders.>"}, 0)
	require.NoError(t, err)
	ev := idemkv.StoredEvent{
		Event:     idemkv.Event{Topic: "orders.created", Key: "o1", Payload: []byte("payload 1")},
		ID:        "ev-1",
		Seq:       1,
		EntitySeq: 1,
		Created:   time.Date(2026, 3, 1, 12, 0, 0, 1, time.FixedZone("CET", 3600)),
	}
	require.NoError(t, p.Publish(ctx, ev))
	require.NoError(t, p.Close())
	e.Shutdown()
	e.Shutdown() // a second Shutdown does nothing

	e2, err := natsembed.Start(dir, e.Port())
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

func TestStartBadArguments(t *testing.T) {
	_, err := natsembed.Start("", 0)
	require.ErrorContains(t, err, "empty store directory")
	_, err = natsembed.Start(t.TempDir(), -1)
	require.ErrorContains(t, err, "outside 0..65535")
}
