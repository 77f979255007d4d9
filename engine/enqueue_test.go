package engine

import (
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine/internal/record"
)

// TestFailedNumberingWritesNothing: a write whose second event's entity
// sequence cannot be read (a corrupt counter here, an I/O error in life)
// under the committer's mutex fails before joining a commit group: none
// of its data and none of its events are committed with the group.
func TestFailedNumberingWritesNothing(t *testing.T) {
	v := newEnv(t)
	e := v.e
	require.NoError(t, e.db.Set(record.OutboxEntityKey("t", "B"), []byte{1, 2, 3}, pebble.Sync))
	fx := e.newEffects()
	require.NoError(t, fx.Set([]byte("data"), []byte("v")))
	require.NoError(t, fx.Emit(idemkv.Event{Topic: "t", Key: "A"}))
	require.NoError(t, fx.Emit(idemkv.Event{Topic: "t", Key: "B"}))
	token, err := e.nextToken()
	require.NoError(t, err)
	b := e.db.NewBatch()
	fx.writeTo(b, token, time.Time{})
	// No prefetch, as when the epoch moved since it: the counters are
	// read under the committer's mutex.
	g, first, err := e.commits.enqueue(b, true, fx.txn(token, time.Now()))
	require.Error(t, err)
	if first {
		_ = e.commits.wait(g, first)
	}
	// Another writer's group commits after it.
	require.NoError(t, e.Update(ctx, func(fx idemkv.Effects) error { return fx.Set([]byte("other"), []byte("w")) }))
	_, err = e.GetData(ctx, []byte("data"))
	require.ErrorIs(t, err, idemkv.ErrNotFound, "a write told it failed leaves nothing")
	evs, err := e.ReadOutbox(ctx, 0, 10)
	require.NoError(t, err)
	require.Empty(t, evs)
}

// TestNumberingOfManyEventsInOneCommit: one commit emitting more events
// than are numbered without a map, three entities' interleaved, numbers
// each entity's events one after the other from its last sequence.
func TestNumberingOfManyEventsInOneCommit(t *testing.T) {
	v := newEnv(t)
	emit := func(n int) {
		require.NoError(t, v.e.Update(ctx, func(fx idemkv.Effects) error {
			for i := range n {
				if err := fx.Emit(idemkv.Event{Topic: "t", Key: fmt.Sprint("e", i%3)}); err != nil {
					return err
				}
			}
			return nil
		}))
	}
	emit(2)                   // e0#1, e1#1
	emit(smallEventCount * 3) // past the map's threshold
	evs, err := v.e.ReadOutbox(ctx, 0, 100)
	require.NoError(t, err)
	next := map[string]uint64{}
	for _, ev := range evs {
		next[ev.Key]++
		require.Equal(t, next[ev.Key], ev.EntitySeq, "event %d of %s", ev.Seq, ev.Key)
	}
	require.Equal(t, map[string]uint64{"e0": 9, "e1": 9, "e2": 8}, next)
}
