package natsjs_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv/natsjs"
	"github.com/idemkv/idemkv/natsjs/natstest"
)

func TestEnsureStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	srv := natstest.Start(t)
	js, err := jetstream.New(srv.Connect(t))
	require.NoError(t, err)

	// Created on disk with the default window.
	s, err := natsjs.EnsureStream(ctx, js, "A", []string{"a.>"}, 0)
	require.NoError(t, err)
	cfg := s.CachedInfo().Config
	require.Equal(t, jetstream.FileStorage, cfg.Storage)
	require.Equal(t, natsjs.DefaultDuplicateWindow, cfg.Duplicates)
	require.Equal(t, []string{"a.>"}, cfg.Subjects)

	// Again: unchanged.
	s, err = natsjs.EnsureStream(ctx, js, "A", []string{"a.>"}, 0)
	require.NoError(t, err)
	require.Equal(t, cfg, s.CachedInfo().Config)

	// A new subject and a longer window are added; the rest stays.
	_, err = js.UpdateStream(ctx, func() jetstream.StreamConfig { c := cfg; c.MaxMsgs = 1000; return c }())
	require.NoError(t, err)
	_, err = natsjs.EnsureStream(ctx, js, "A", []string{"b.>", "a.>"}, 10*time.Minute)
	require.NoError(t, err)
	info, err := js.Stream(ctx, "A")
	require.NoError(t, err)
	got := info.CachedInfo().Config
	require.Equal(t, []string{"a.>", "b.>"}, got.Subjects)
	require.Equal(t, 10*time.Minute, got.Duplicates)
	require.Equal(t, int64(1000), got.MaxMsgs)

	// A shorter window (a service started with the default) leaves the
	// operator's longer one.
	s, err = natsjs.EnsureStream(ctx, js, "A", []string{"a.>"}, 0)
	require.NoError(t, err)
	require.Equal(t, 10*time.Minute, s.CachedInfo().Config.Duplicates)

	// A subject the stream already captures through a wildcard is there;
	// a wildcard that captures the stream's subjects takes their place
	// (the server refuses overlapping subjects).
	s, err = natsjs.EnsureStream(ctx, js, "A", []string{"a.created", "b.x.*"}, 0)
	require.NoError(t, err)
	require.Equal(t, []string{"a.>", "b.>"}, s.CachedInfo().Config.Subjects)
	_, err = natsjs.EnsureStream(ctx, js, "P", []string{"payments.created", "payments.refunded"}, 0)
	require.NoError(t, err)
	s, err = natsjs.EnsureStream(ctx, js, "P", []string{"payments.*"}, 0)
	require.NoError(t, err)
	require.Equal(t, []string{"payments.*"}, s.CachedInfo().Config.Subjects)

	// A memory stream is refused, not silently kept.
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "M", Subjects: []string{"m.>"}, Storage: jetstream.MemoryStorage})
	require.NoError(t, err)
	_, err = natsjs.EnsureStream(ctx, js, "M", []string{"m.>"}, 0)
	require.ErrorContains(t, err, "not file")

	_, err = natsjs.EnsureStream(ctx, js, "N", []string{"n.>"}, -time.Second)
	require.ErrorContains(t, err, "negative duplicate window")
	_, err = natsjs.EnsureStream(ctx, js, "N", nil, 0)
	require.ErrorContains(t, err, "no subjects")
	_, err = natsjs.EnsureStream(ctx, js, "bad name", []string{"n.>"}, 0)
	require.Error(t, err)
}
