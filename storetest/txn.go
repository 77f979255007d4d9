package storetest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/idemkv/idemkv"
)

// Transactions and events, through the contract: Effects.Get, the
// commit-time check of what an apply function read, Effects.Emit and the
// idemkv.Outbox. A store whose Effects do not read (Get fails with
// ErrInvalidArgument) skips the first; one that is not an idemkv.Outbox
// skips the second.

// counter reads a big-endian uint64 through fx; absent is 0. ok is false
// if the store's Effects do not read.
func counter(fx idemkv.Effects, key string) (n uint64, ok bool, err error) {
	v, err := fx.Get([]byte(key))
	switch {
	case errors.Is(err, idemkv.ErrNotFound):
		return 0, true, nil
	case errors.Is(err, idemkv.ErrInvalidArgument):
		return 0, false, nil
	case err != nil:
		return 0, true, err
	case len(v) != 8:
		return 0, true, fmt.Errorf("%q holds %d bytes", key, len(v))
	}
	return binary.BigEndian.Uint64(v), true, nil
}

var errNoReads = errors.New("the store's Effects do not read")

// transactions: concurrent operations that read-modify-write shared keys
// (a counter, and a balance they may not take below zero) end as if they
// had run one at a time: the counter counts every commit, and exactly as
// many debits commit as the balance allowed.
func transactions(t *testing.T, newHarness NewHarness) {
	h := newHarness(t, nil)
	defer h.Close()
	const workers, balance = 12, 5
	var wg sync.WaitGroup
	results := make([]error, workers)
	for w := range workers {
		wg.Go(func() {
			id := idemkv.ID{Tenant: "t", Endpoint: "POST /debit", Key: fmt.Sprint("w", w)}
			c, err := h.Store().Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: []byte("fp")})
			if err != nil || c.Outcome != idemkv.Acquired {
				results[w] = fmt.Errorf("claim: %v %v", c.Outcome, err)
				return
			}
			for {
				err = h.Store().Complete(ctx, c.Lease, idemkv.Result{Status: 200}, func(fx idemkv.Effects) error {
					spent, ok, err := counter(fx, "spent")
					if !ok {
						return errNoReads
					}
					if err != nil {
						return err
					}
					if spent == balance {
						return errInsufficient
					}
					n, _, err := counter(fx, "count")
					if err != nil {
						return err
					}
					if err := fx.Set([]byte("spent"), binary.BigEndian.AppendUint64(nil, spent+1)); err != nil {
						return err
					}
					return fx.Set([]byte("count"), binary.BigEndian.AppendUint64(nil, n+1))
				})
				if !errors.Is(err, idemkv.ErrConflict) { // the lease is still held: try again
					break
				}
			}
			results[w] = err
		})
	}
	wg.Wait()
	committed := 0
	for w, err := range results {
		switch {
		case errors.Is(err, errNoReads):
			t.Skip(err)
		case err == nil:
			committed++
		case !errors.Is(err, errInsufficient):
			t.Fatalf("worker %d: %v", w, err)
		}
	}
	if committed != balance {
		t.Fatalf("%d debits committed against a balance of %d", committed, balance)
	}
	for _, k := range []string{"spent", "count"} {
		v, err := h.ReadEffect([]byte(k))
		must(t, err)
		if got := binary.BigEndian.Uint64(v); got != balance {
			t.Fatalf("%s = %d after %d commits: an update was lost", k, got, balance)
		}
	}
}

var errInsufficient = errors.New("insufficient balance")

// events: an operation's events exist exactly when its outcome commits,
// numbered in commit order, and leave the outbox only when acknowledged;
// the numbering survives a restart.
func events(t *testing.T, newHarness NewHarness) {
	h := newHarness(t, nil)
	defer h.Close()
	if _, ok := h.Store().(idemkv.Outbox); !ok {
		t.Skip("the store keeps no outbox")
	}
	emit := func(key string, fail bool) error {
		id := idemkv.ID{Tenant: "t", Endpoint: "POST /e", Key: key}
		c, err := h.Store().Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: []byte("fp")})
		must(t, err)
		return h.Store().Complete(ctx, c.Lease, idemkv.Result{Status: 201}, func(fx idemkv.Effects) error {
			if err := fx.Emit(idemkv.Event{Topic: "things.created", Key: "entity", Payload: []byte(key)}); err != nil {
				return err
			}
			if fail {
				return errInsufficient
			}
			return nil
		})
	}
	must(t, emit("a", false))
	if err := emit("b", true); !errors.Is(err, errInsufficient) {
		t.Fatalf("a failing apply: %v", err)
	}
	must(t, emit("c", false))
	if err := emit("d", false); err != nil {
		t.Fatal(err)
	}
	ob := h.Store().(idemkv.Outbox)
	evs, err := ob.ReadOutbox(ctx, 0, 10)
	must(t, err)
	if len(evs) != 3 || string(evs[0].Payload) != "a" || string(evs[1].Payload) != "c" || string(evs[2].Payload) != "d" {
		t.Fatalf("outbox holds %+v, want the events of a, c and d", evs)
	}
	for i, ev := range evs {
		if ev.Seq <= 0 || (i > 0 && ev.Seq != evs[i-1].Seq+1) || ev.EntitySeq != uint64(i+1) || ev.ID == "" {
			t.Fatalf("event %d: seq %d, entity seq %d, id %q", i, ev.Seq, ev.EntitySeq, ev.ID)
		}
	}
	// An acknowledgement that names another event under the number (a
	// relay that read a store since restored) removes nothing.
	if err := ob.AckOutbox(ctx, evs[1].Seq, evs[0].ID); !errors.Is(err, idemkv.ErrConflict) {
		t.Fatalf("ack through %d naming event %d's id: %v, want ErrConflict", evs[1].Seq, evs[0].Seq, err)
	}
	if err := ob.AckOutbox(ctx, evs[2].Seq+1, evs[2].ID); !errors.Is(err, idemkv.ErrConflict) {
		t.Fatalf("ack through %d, past the last event: %v, want ErrConflict", evs[2].Seq+1, err)
	}
	if again, err := ob.ReadOutbox(ctx, 0, 10); err != nil || len(again) != 3 {
		t.Fatalf("after a refused ack the outbox holds %d events (%v), want 3", len(again), err)
	}
	must(t, ob.AckOutbox(ctx, evs[1].Seq, evs[1].ID))
	h.Reopen()
	ob = h.Store().(idemkv.Outbox)
	rest, err := ob.ReadOutbox(ctx, 0, 10)
	must(t, err)
	if len(rest) != 1 || rest[0].ID != evs[2].ID || rest[0].Seq != evs[2].Seq {
		t.Fatalf("after an ack through %d and a restart: %+v", evs[1].Seq, rest)
	}
	must(t, emit("e", false))
	next, err := ob.ReadOutbox(ctx, evs[2].Seq, 10)
	must(t, err)
	if len(next) != 1 || next[0].Seq != evs[2].Seq+1 || next[0].EntitySeq != 4 {
		t.Fatalf("numbering after a restart: %+v", next)
	}
}
