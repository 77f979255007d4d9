package once_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/once"
)

// TestWritesOnly: a local function declared to only write commits its
// result and writes with its claim in one step on a store that can
// (idemkv.LocalRunner: its Exec has no lease then), and through a claim
// and a commit on one that cannot; either way a duplicate replays the
// first outcome and keeps the first writes, a failure or a panic leaves
// the key free, and a function that reads after all reads checked.
func TestWritesOnly(t *testing.T) {
	v := newEnv(t, nil)
	_, oneStep := v.e.(idemkv.LocalRunner)
	c := call("w")
	c.WritesOnly = true
	var tokens []uint64
	write := func(value string) once.Func {
		return func(_ context.Context, x *once.Exec) (idemkv.Result, error) {
			tokens = append(tokens, x.Lease.Token)
			if err := x.Effects.Set([]byte("job/w"), []byte(value)); err != nil {
				return idemkv.Result{}, err
			}
			return created, x.Effects.Emit(idemkv.Event{Topic: "jobs.done", Key: "w", Payload: []byte(value)})
		}
	}
	out, err := once.Do(ctx, v.e, c, write("first"))
	require.NoError(t, err)
	assert.Equal(t, once.Outcome{Result: created}, out)
	assert.Equal(t, created, v.record("w").Result)
	assert.Equal(t, "first", v.data("job/w"))
	if oneStep {
		assert.Equal(t, []uint64{0}, tokens, "one step: the function ran before the claim")
	} else {
		assert.NotZero(t, tokens[0])
	}

	out, err = once.Do(ctx, v.e, c, write("second"))
	require.NoError(t, err)
	assert.True(t, out.Replayed)
	assert.Equal(t, created, out.Result)
	assert.Equal(t, "first", v.data("job/w"), "a duplicate's writes are dropped")
	evs, err := v.e.ReadOutbox(ctx, 0, 10)
	require.NoError(t, err)
	assert.Len(t, evs, 1)

	boom := errors.New("boom")
	out, err = once.Do(ctx, v.e, c, func(context.Context, *once.Exec) (idemkv.Result, error) { return idemkv.Result{}, boom })
	require.NoError(t, err, "a completed key replays, whatever the function would do")
	assert.True(t, out.Replayed)

	c = call("fails")
	c.WritesOnly = true
	_, err = once.Do(ctx, v.e, c, func(context.Context, *once.Exec) (idemkv.Result, error) { return idemkv.Result{}, boom })
	require.ErrorIs(t, err, boom)
	assert.Zero(t, v.state("fails"), "the key is free")
	c.ID = id("panics")
	assert.PanicsWithValue(t, "kaput", func() {
		_, _ = once.Do(ctx, v.e, c, func(context.Context, *once.Exec) (idemkv.Result, error) { panic("kaput") })
	})
	assert.Zero(t, v.state("panics"))

	c.ID = id("reads")
	out, err = once.Do(ctx, v.e, c, func(_ context.Context, x *once.Exec) (idemkv.Result, error) {
		b, err := x.Effects.Get([]byte("job/w"))
		if err != nil {
			return idemkv.Result{}, err
		}
		return idemkv.Result{Status: 200, Body: b}, x.Effects.Set([]byte("copy"), b)
	})
	require.NoError(t, err)
	assert.Equal(t, "first", string(out.Result.Body))
	assert.Equal(t, "first", v.data("copy"))
}
