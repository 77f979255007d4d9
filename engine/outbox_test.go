package engine

import (
	"encoding/binary"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine/internal/record"
	"github.com/stretchr/testify/require"
)

func (v *env) completeWithEvents(key string, evs ...idemkv.Event) error {
	c := v.claim(id(key), fpA, idemkv.ModeLocal)
	require.Equal(v.t, idemkv.Acquired, c.Outcome)
	return v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, func(fx idemkv.Effects) error {
		if err := fx.Set([]byte("payment/"+key), []byte("1")); err != nil {
			return err
		}
		for _, ev := range evs {
			if err := fx.Emit(ev); err != nil {
				return err
			}
		}
		return nil
	})
}

func created(key string) idemkv.Event {
	return idemkv.Event{Topic: "payments.created", Key: key, Payload: []byte(`{"id":"` + key + `"}`), Headers: map[string]string{"Tenant": "acct_1"}}
}

func TestEventsCommitWithTheOutcomeInOrder(t *testing.T) {
	v := newEnv(t)
	select {
	case <-v.e.OutboxNotify():
		t.Fatal("no commit with events yet")
	default:
	}
	require.NoError(t, v.completeWithEvents("p1", created("p1")))
	<-v.e.OutboxNotify() // a commit with events signals the relay
	require.NoError(t, v.completeWithEvents("p2", created("p2"), idemkv.Event{Topic: "payments.captured", Key: "p2"}))
	require.NoError(t, v.e.Update(ctx, func(fx idemkv.Effects) error {
		return fx.Emit(idemkv.Event{Topic: "payments.created", Key: "p1", Payload: []byte("again")})
	}))

	evs, err := v.e.ReadOutbox(ctx, 0, 10)
	require.NoError(t, err)
	require.Len(t, evs, 4)
	ids := map[string]bool{}
	for i, ev := range evs {
		require.Equal(t, uint64(i+1), ev.Seq, "numbered in commit order, without gaps")
		require.Len(t, ev.ID, 32)
		ids[ev.ID] = true
		require.Equal(t, t0, ev.Created.UTC())
	}
	require.Len(t, ids, 4, "ids are unique")
	require.Equal(t, []byte(`{"id":"p1"}`), evs[0].Payload)
	require.Equal(t, "acct_1", evs[0].Headers["Tenant"])
	require.Equal(t, []uint64{1, 1, 1, 2}, []uint64{evs[0].EntitySeq, evs[1].EntitySeq, evs[2].EntitySeq, evs[3].EntitySeq},
		"each (topic, key) counts its own events")

	page, err := v.e.ReadOutbox(ctx, 2, 1)
	require.NoError(t, err)
	require.Equal(t, evs[2:3], page, "reads resume after a sequence")

	acked, last, err := v.e.OutboxCursor(ctx)
	require.NoError(t, err)
	require.Equal(t, [2]uint64{0, 4}, [2]uint64{acked, last})
	require.ErrorIs(t, v.e.AckOutbox(ctx, 2, evs[2].ID), idemkv.ErrConflict, "another event's id")
	require.NoError(t, v.e.AckOutbox(ctx, 2, evs[1].ID))
	require.NoError(t, v.e.AckOutbox(ctx, 1, evs[0].ID), "an ack behind the cursor changes nothing")
	require.ErrorIs(t, v.e.AckOutbox(ctx, 5, "x"), idemkv.ErrConflict, "past the last event")
	rest, err := v.e.ReadOutbox(ctx, 0, 10)
	require.NoError(t, err)
	require.Equal(t, evs[2:], rest, "acknowledged events are gone")

	r, err := v.e.Check(ctx)
	require.NoError(t, err)
	require.Empty(t, r.Problems)
	require.Equal(t, 2, r.Events)
	require.Equal(t, uint64(2), r.OutboxAcked)

	// Numbering and entity sequences carry on across a restart, also once
	// the outbox is empty.
	v.reopen()
	require.NoError(t, v.e.AckOutbox(ctx, 4, evs[3].ID))
	v.reopen()
	require.NoError(t, v.completeWithEvents("p3", created("p1")))
	evs, err = v.e.ReadOutbox(ctx, 0, 10)
	require.NoError(t, err)
	require.Len(t, evs, 1)
	require.Equal(t, uint64(5), evs[0].Seq)
	require.Equal(t, uint64(3), evs[0].EntitySeq)
	r, err = v.e.Check(ctx)
	require.NoError(t, err)
	require.Empty(t, r.Problems)
}

func TestBadEventsWriteNothing(t *testing.T) {
	v := newEnv(t)
	big := idemkv.Event{Topic: "t", Payload: make([]byte, idemkv.DefaultMaxEventSize)}
	for name, ev := range map[string]idemkv.Event{
		"empty topic":    {Key: "k"},
		"space in topic": {Topic: "payments created"},
		"wildcard":       {Topic: "payments.*"},
		"long topic":     {Topic: strings.Repeat("t", idemkv.MaxTopicLen+1)},
		"long key":       {Topic: "t", Key: strings.Repeat("k", idemkv.MaxEventKeyLen+1)},
		"too large":      big,
		"empty token":    {Topic: "payments..created"},
		"trailing dot":   {Topic: "payments."},
		"newline in key": {Topic: "t", Key: "a\nb"},
		"reserved":       {Topic: "t", Headers: map[string]string{"Nats-Msg-Id": "x"}},
		"ours":           {Topic: "t", Headers: map[string]string{"idemkv-event-id": "x"}},
		"header name":    {Topic: "t", Headers: map[string]string{"a:b": "x"}},
		"header value":   {Topic: "t", Headers: map[string]string{"A": "x\r\ny"}},
		"padded key":     {Topic: "t", Key: " pay_42\t"},
		"key, trailing":  {Topic: "t", Key: "pay_42 "},
		"padded value":   {Topic: "t", Headers: map[string]string{"A": "  two spaces  "}},
	} {
		err := v.completeWithEvents("bad-"+name, ev)
		require.ErrorIs(t, err, idemkv.ErrInvalidArgument, name)
		require.Equal(t, idemkv.InProgress, v.claim(id("bad-"+name), fpA, idemkv.ModeLocal).Outcome, "%s: nothing committed", name)
	}
	_, err := v.e.GetData(ctx, []byte("payment/bad-empty topic"))
	require.ErrorIs(t, err, idemkv.ErrNotFound)
	evs, err := v.e.ReadOutbox(ctx, 0, 10)
	require.NoError(t, err)
	require.Empty(t, evs)
	_, err = v.e.ReadOutbox(ctx, 0, 0)
	require.ErrorIs(t, err, idemkv.ErrInvalidArgument)
}

// An apply function that fails, or whose reads conflict, emits nothing:
// an event exists exactly when its operation's outcome commits.
func TestEventsOnlyWithTheirCommit(t *testing.T) {
	v := newEnv(t)
	c := v.claim(id("p1"), fpA, idemkv.ModeLocal)
	runs := 0
	require.NoError(t, v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, func(fx idemkv.Effects) error {
		runs++
		n := readU64(t, fx, "n")
		if runs == 1 {
			require.NoError(t, v.e.Update(ctx, func(fx idemkv.Effects) error { return fx.Set([]byte("n"), u64(7)) }))
		}
		return fx.Emit(idemkv.Event{Topic: "n.read", Payload: []byte(fmt.Sprint(n))})
	}))
	evs, err := v.e.ReadOutbox(ctx, 0, 10)
	require.NoError(t, err)
	require.Len(t, evs, 1, "the conflicting run's event was not written")
	require.Equal(t, "7", string(evs[0].Payload))
}

// Check finds an outbox the engine would never leave: an event emitted by
// an outcome that is not committed, a gap, an event behind the cursor, an
// entity's last sequence behind its events or missing.
func TestCheckFindsABrokenOutbox(t *testing.T) {
	v := newEnv(t)
	c := v.claim(id("remote"), fpA, idemkv.ModeRemote) // a durable record in progress
	enc := func(token, entitySeq uint64, key ...string) []byte {
		ev := idemkv.Event{Topic: "t", Key: "k"}
		if len(key) > 0 {
			ev.Key = key[0]
		}
		b := record.AppendEvent(nil, &ev, token, t0, [16]byte{1})
		binary.BigEndian.PutUint64(b[record.EventEntitySeqOffset:], entitySeq)
		return b
	}
	b := v.e.db.NewBatch()
	require.NoError(t, b.Set(record.OutboxCursorKey, binary.BigEndian.AppendUint64(nil, 1), nil))
	require.NoError(t, b.Set(record.OutboxEventKey(1), enc(c.Lease.Token, 1), nil))
	require.NoError(t, b.Set(record.OutboxEventKey(2), enc(c.Lease.Token, 2), nil))
	require.NoError(t, b.Set(record.OutboxEventKey(4), enc(c.Lease.Token, 3), nil))
	require.NoError(t, b.Set(record.OutboxEventKey(5), enc(c.Lease.Token, 4, "lost"), nil)) // its entity's key is not stored
	require.NoError(t, b.Set(record.OutboxEntityKey("t", "k"), binary.BigEndian.AppendUint64(nil, 2), nil))
	require.NoError(t, b.Commit(pebble.Sync))
	r, err := v.e.Check(ctx)
	require.NoError(t, err)
	var all string
	for _, p := range r.Problems {
		all += p.What + "\n"
	}
	for _, want := range []string{
		"outbox event 1 is still stored, but the cursor has acknowledged through 1",
		"events 3 to 3 are missing",
		"whose record " + recordName(id("remote")) + " is in-progress",
		"last sequence is 2, but an event carries 3",
		"outbox events carry this entity's sequences up to 4, but its last sequence is not stored",
	} {
		require.Contains(t, all, want)
	}
}

// Concurrent completions emitting on a few entities: every entity's
// events carry 1, 2, ... n, each once, in outbox order, whichever path
// found the last sequence (pending writes, the cache, Pebble).
func TestEntitySequencesUnderConcurrency(t *testing.T) {
	v := newEnv(t)
	const workers, each, entities = 8, 40, 3
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				key := fmt.Sprintf("w%d-%d", w, i)
				c, err := v.e.Claim(ctx, idemkv.ClaimRequest{ID: id(key), Fingerprint: fpA})
				if err != nil {
					t.Error(err)
					return
				}
				err = v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, func(fx idemkv.Effects) error {
					return fx.Emit(idemkv.Event{Topic: "t", Key: fmt.Sprint("e", (w+i)%entities)})
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
		if w == workers/2 {
			wg.Wait() // a restart halfway: the sequences carry on
			v.reopen()
		}
	}
	wg.Wait()
	evs, err := v.e.ReadOutbox(ctx, 0, workers*each+1)
	require.NoError(t, err)
	require.Len(t, evs, workers*each)
	next := map[string]uint64{}
	for _, ev := range evs {
		next[ev.Key]++
		require.Equal(t, next[ev.Key], ev.EntitySeq, "event %d of %s", ev.Seq, ev.Key)
	}
	r, err := v.e.Check(ctx)
	require.NoError(t, err)
	require.Empty(t, r.Problems)
}

// The entity filter answers "none yet" for new entities, and after a
// restart knows every entity the store holds: sequences carry on.
func TestEntityFilterAfterRestart(t *testing.T) {
	v := newEnv(t)
	require.NoError(t, v.completeWithEvents("p1", created("acct_a"), created("acct_b")))
	require.False(t, v.e.commits.entityFilter.mayExist(record.OutboxEntityKey("payments.created", "acct_new")))
	require.True(t, v.e.commits.entityFilter.mayExist(record.OutboxEntityKey("payments.created", "acct_a")))
	v.reopen()
	require.True(t, v.e.commits.entityFilter.mayExist(record.OutboxEntityKey("payments.created", "acct_b")), "loaded at Open")
	require.NoError(t, v.completeWithEvents("p2", created("acct_b"), created("acct_c")))
	evs, err := v.e.ReadOutbox(ctx, 2, 10)
	require.NoError(t, err)
	require.Equal(t, []uint64{2, 1}, []uint64{evs[0].EntitySeq, evs[1].EntitySeq})

	full := newEntityFilter(2)
	for _, k := range []string{"a", "b", "c"} {
		full.add([]byte(k))
	}
	require.True(t, full.mayExist([]byte("never added")), "past capacity, every entity may exist")
}
