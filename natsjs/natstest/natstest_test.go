package natstest_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkv/idemkv/natsjs/natstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A message stored before Stop is in the stream after Restart, at the same
// URL, and the client reconnects to it by itself.
func TestRestartKeepsStreams(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srv := natstest.Start(t)
	url := srv.URL()

	down, back := make(chan struct{}, 1), make(chan struct{}, 1)
	nc := srv.Connect(t,
		nats.DisconnectErrHandler(func(*nats.Conn, error) { signal(down) }),
		nats.ReconnectHandler(func(*nats.Conn) { signal(back) }))
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Storage: jetstream.FileStorage})
	require.NoError(t, err)
	_, err = js.Publish(ctx, "s.a", []byte("before"))
	require.NoError(t, err)

	srv.Stop()
	<-down
	srv.Stop() // a second Stop does nothing
	srv.Restart(t)
	<-back
	require.Equal(t, url, srv.URL())

	_, err = js.Publish(ctx, "s.a", []byte("after"))
	require.NoError(t, err)
	s, err := js.Stream(ctx, "S")
	require.NoError(t, err)
	require.Equal(t, uint64(2), s.CachedInfo().State.Msgs)
	m, err := s.GetMsg(ctx, 1)
	require.NoError(t, err)
	require.Equal(t, "before", string(m.Data))
}

// signal sends on c without blocking nats.go's callback goroutine.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
