package events

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/bench"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/outbox"
)

// Drain is one measurement of how fast events leave: the relay draining a
// backlog, or JetStream taking the same number of messages with no store.
type Drain struct {
	// Name says what was timed: "relay, no broker", "relay to JetStream",
	// "JetStream alone, one at a time", "JetStream alone, N at a time".
	Name         string  `json:"name"`
	Events       int     `json:"events"`         // the number of events (messages) it moved
	Seconds      float64 `json:"seconds"`        // the time it took, in seconds
	EventsPerSec float64 `json:"events_per_sec"` // Events / Seconds
}

// The names of the drains, in run order.
const (
	drainDiscard   = "relay, no broker"
	drainJetStream = "relay to JetStream"
	aloneOne       = "JetStream alone, one at a time"
	alonePipelined = "JetStream alone, %d at a time"
)

// fillBatch is how many events one Update of the backlog fill emits.
const fillBatch = 256

// drains measures the relay draining a backlog of Options.Backlog events
// into the discarding publisher and into b, then b alone.
func (r *runner) drains(ctx context.Context, b *broker) (ds []Drain, err error) {
	dir := r.run.Dir("drain")
	e, err := engine.Open(dir, r.o.Engine)
	if err != nil {
		return nil, err
	}
	defer func() {
		err = errors.Join(err, e.Close(), os.RemoveAll(dir))
	}()
	n := r.o.Backlog
	for _, to := range []struct {
		name string
		pub  outbox.Publisher
	}{{drainDiscard, &discard{}}, {drainJetStream, b.pub}} {
		if err := r.fill(ctx, e, n); err != nil {
			return nil, err
		}
		rl, err := outbox.New(e, to.pub, &outbox.Options{Clock: e})
		if err != nil {
			return nil, err
		}
		msgs0, err := b.messages(ctx)
		if err != nil {
			return nil, err
		}
		t0 := time.Now()
		got, err := rl.Drain(ctx)
		d := newDrain(to.name, got, time.Since(t0))
		if err != nil {
			return nil, fmt.Errorf("bench: events: %s: %w", to.name, err)
		}
		msgs1, err := b.messages(ctx)
		if err != nil {
			return nil, err
		}
		var stored uint64 // the discarding publisher stores nothing
		if to.name == drainJetStream {
			stored = uint64(n)
		}
		if got != n || msgs1-msgs0 != stored {
			return nil, bench.Violation("%s: %d events published of %d, %d messages stored", to.name, got, n, msgs1-msgs0)
		}
		ds = append(ds, d)
		r.run.Step(to.name)
	}
	one, err := r.alone(ctx, b, n)
	if err != nil {
		return nil, err
	}
	r.run.Step(aloneOne)
	pipe, err := r.pipelined(ctx, b, n)
	if err != nil {
		return nil, err
	}
	r.run.Step("JetStream alone, pipelined")
	return append(ds, one, pipe), nil
}

func newDrain(name string, n int, d time.Duration) Drain {
	return Drain{Name: name, Events: n, Seconds: d.Seconds(), EventsPerSec: float64(n) / d.Seconds()}
}

// fill commits n events to e's outbox, fillBatch per transaction (the
// layout in the outbox is the same as one a completion).
func (r *runner) fill(ctx context.Context, e *engine.Engine, n int) error {
	stream := r.newStream()
	for i := 0; i < n; i += fillBatch {
		err := e.Update(ctx, func(fx idemkv.Effects) error {
			for j := i; j < min(n, i+fillBatch); j++ {
				if err := fx.Emit(r.event(stream, uint64(j), uint64(j))); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("bench: events: fill the outbox: %w", err)
		}
	}
	return nil
}

// alone publishes n events through b's publisher, one at a time, each
// waiting for its PubAck, as the relay does, with no store.
func (r *runner) alone(ctx context.Context, b *broker, n int) (Drain, error) {
	stream := r.newStream()
	evs := make([]idemkv.StoredEvent, n)
	for i := range evs {
		evs[i] = idemkv.StoredEvent{Event: event(stream, uint64(i), uint64(i), r.o.Tenants),
			ID: "alone-" + strconv.FormatUint(stream, 16) + "-" + strconv.Itoa(i), Seq: uint64(i + 1), EntitySeq: 1, Created: time.Now()}
	}
	msgs0, err := b.messages(ctx)
	if err != nil {
		return Drain{}, err
	}
	t0 := time.Now()
	for i := range evs {
		if err := b.pub.Publish(ctx, evs[i]); err != nil {
			return Drain{}, fmt.Errorf("bench: events: %s: %w", aloneOne, err)
		}
	}
	d := newDrain(aloneOne, n, time.Since(t0))
	return d, r.checkStored(ctx, b, msgs0, n)
}

// pipelined publishes n messages like the publisher's (the same subject,
// payload, headers and message id) straight to JetStream, Options.Pipeline
// at a time: a window is sent, then every PubAck of it awaited.
func (r *runner) pipelined(ctx context.Context, b *broker, n int) (Drain, error) {
	stream := r.newStream()
	js := b.pub.JetStream()
	msgs := make([]*nats.Msg, n)
	ids := make([]string, n)
	for i := range msgs {
		ev := event(stream, uint64(i), uint64(i), r.o.Tenants)
		ids[i] = "pipe-" + strconv.FormatUint(stream, 16) + "-" + strconv.Itoa(i)
		h := nats.Header{}
		for k, v := range ev.Headers {
			h.Set(k, v)
		}
		h.Set(outbox.HeaderEventID, ids[i])
		h.Set(outbox.HeaderEntityKey, ev.Key)
		h.Set(outbox.HeaderEntitySeq, "1")
		h.Set(outbox.HeaderOutboxSeq, strconv.Itoa(i+1))
		h.Set(outbox.HeaderCreated, time.Now().UTC().Format(time.RFC3339Nano))
		msgs[i] = &nats.Msg{Subject: ev.Topic, Header: h, Data: ev.Payload}
	}
	msgs0, err := b.messages(ctx)
	if err != nil {
		return Drain{}, err
	}
	name := fmt.Sprintf(alonePipelined, r.o.Pipeline)
	t0 := time.Now()
	futures := make([]jetstream.PubAckFuture, 0, r.o.Pipeline)
	for i := 0; i < n; i += r.o.Pipeline {
		futures = futures[:0]
		for j := i; j < min(n, i+r.o.Pipeline); j++ {
			f, err := js.PublishMsgAsync(msgs[j], jetstream.WithMsgID(ids[j]))
			if err != nil {
				return Drain{}, fmt.Errorf("bench: events: %s: %w", name, err)
			}
			futures = append(futures, f)
		}
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				return Drain{}, fmt.Errorf("bench: events: %s: %w", name, err)
			case <-ctx.Done():
				return Drain{}, ctx.Err()
			}
		}
	}
	d := newDrain(name, n, time.Since(t0))
	return d, r.checkStored(ctx, b, msgs0, n)
}

// checkStored checks that the stream holds n messages more than msgs0.
func (r *runner) checkStored(ctx context.Context, b *broker, msgs0 uint64, n int) error {
	msgs1, err := b.messages(ctx)
	if err != nil {
		return err
	}
	if msgs1-msgs0 != uint64(n) {
		return bench.Violation("%d messages published, %d stored", n, msgs1-msgs0)
	}
	return nil
}
