package inbox_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/inbox"
)

// from is msg with its Source set.
func from(source string, m inbox.Message) inbox.Message {
	m.Source = source
	return m
}

// TestSourceIsRecordedWithThePosition: the first message from a source
// records it with the position; once the position is past 0, a message
// from another source (a stream deleted and created again, numbered from
// 1 again) is refused with ErrSourceChanged before its handler runs, and
// nothing is written: neither the handler's writes, nor the event's mark,
// nor the position. A copy of a settled event from another source does
// not move the position either.
func TestSourceIsRecordedWithThePosition(t *testing.T) {
	v := newEnv(t)
	c := v.consumer()
	b := &book{}
	src, err := c.Source(ctx)
	require.NoError(t, err)
	assert.Empty(t, src, "nothing recorded before a message")

	for i := uint64(1); i <= 3; i++ {
		_, err := c.Process(ctx, from("old", msg("ev-"+string(rune('0'+i)), i, payload("acct_1", 100))), b.handle)
		require.NoError(t, err)
	}
	src, err = c.Source(ctx)
	require.NoError(t, err)
	assert.Equal(t, "old", src)

	runs := b.n()
	_, err = c.Process(ctx, from("new", msg("ev-new", 4, payload("acct_1", 7))), b.handle)
	require.ErrorIs(t, err, inbox.ErrSourceChanged)
	assert.Equal(t, runs, b.n(), "the handler did not run")
	assert.EqualValues(t, 3, v.position(c))
	assert.Equal(t, "300", v.data("total/acct_1"))
	_, err = v.mark("id/ev-new")
	require.ErrorIs(t, err, idemkv.ErrNotFound, "no mark: the event is applied once its source is right")

	// A copy of a settled event, further on in the new stream or not.
	for _, pos := range []uint64{9, 2} {
		out, err := c.Process(ctx, from("new", msg("ev-2", pos, payload("acct_1", 100))), b.handle)
		require.ErrorIs(t, err, inbox.ErrSourceChanged, "at %d: %+v", pos, out)
		assert.EqualValues(t, 3, v.position(c))
	}

	// A payload its handler would reject is refused before the handler
	// runs, and leaves no mark.
	_, err = c.Process(ctx, from("new", msg("ev-bad", 5, []byte("not json"))), b.handle)
	require.ErrorIs(t, err, inbox.ErrSourceChanged)
	_, err = v.mark("id/ev-bad")
	require.ErrorIs(t, err, idemkv.ErrNotFound)

	// The old source goes on, and a message that names none, or has no
	// position, is not checked.
	_, err = c.Process(ctx, from("new", inbox.Message{ID: "ev-nopos", Subject: "payments.created", Data: payload("acct_2", 1)}), b.handle)
	require.NoError(t, err)
	_, err = c.Process(ctx, from("old", msg("ev-4", 4, payload("acct_1", 100))), b.handle)
	require.NoError(t, err)
	_, err = c.Process(ctx, msg("ev-5", 5, payload("acct_1", 100)), b.handle)
	require.NoError(t, err)
	assert.EqualValues(t, 5, v.position(c))
	assert.Equal(t, "500", v.data("total/acct_1"))
}

// TestSourceAfterAReset: a position reset to 0 by hand counts in no
// source, so the next message's source is recorded; and a position
// recorded without a source (a consumer whose messages named none) takes
// the first source it is given, there being nothing to tell otherwise.
func TestSourceAfterAReset(t *testing.T) {
	v := newEnv(t)
	c := v.consumer()
	b := &book{}
	_, err := c.Process(ctx, from("old", msg("ev-1", 1, payload("acct_1", 100))), b.handle)
	require.NoError(t, err)
	require.NoError(t, v.e.Update(ctx, func(fx idemkv.Effects) error { return fx.Set(c.PositionKey(), []byte("0")) }))
	_, err = c.Process(ctx, from("new", msg("ev-n1", 1, payload("acct_1", 10))), b.handle)
	require.NoError(t, err)
	src, err := c.Source(ctx)
	require.NoError(t, err)
	assert.Equal(t, "new", src)
	assert.EqualValues(t, 1, v.position(c))

	other, err := inbox.New("audit", v.e, &inbox.Options{Retention: "inbox"})
	require.NoError(t, err)
	_, err = other.Process(ctx, msg("ev-1", 1, payload("acct_2", 1)), b.handle)
	require.NoError(t, err)
	_, err = other.Process(ctx, from("s", msg("ev-2", 2, payload("acct_2", 1))), b.handle)
	require.NoError(t, err)
	src, err = other.Source(ctx)
	require.NoError(t, err)
	assert.Equal(t, "s", src)
}
