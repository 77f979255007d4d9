package events

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/bench"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/inbox"
	"github.com/idemkv/idemkv/natsjs"
)

// Consume is one reading of the stream's first Options.Backlog messages:
// by an inbox consumer that applies each, or by a bare ordered consumer.
type Consume struct {
	// Name says which: "inbox, applying each event" or "ordered consumer,
	// reading only".
	Name         string  `json:"name"`
	Events       int     `json:"events"`         // the number of messages read (and applied)
	Seconds      float64 `json:"seconds"`        // the time from the start to the last one, in seconds
	EventsPerSec float64 `json:"events_per_sec"` // Events / Seconds
	// CommitsPerEvent is the store's commits (engine.Stats.CommitGroups)
	// per event applied, each a synced write; 0 for the bare reader.
	CommitsPerEvent float64 `json:"commits_per_event"`
	// CommitFigures are the inbox store's committer's work over the
	// reading; zero for the bare reader.
	bench.CommitFigures
}

// The names of the consumers, in run order.
const (
	consumeRaw   = "ordered consumer, reading only"
	consumeInbox = "inbox, applying each event"
)

// errEnough stops a read once it has what it came for.
var errEnough = errors.New("bench: events: enough messages read")

// consumers reads the first Options.Backlog messages of b's stream with a
// bare ordered consumer (natsjs.Read), then applies them through an inbox
// consumer (natsjs.Consume) on a fresh store whose handler adds each
// payment's amount to its account's total.
func (r *runner) consumers(ctx context.Context, b *broker) ([]Consume, error) {
	n := r.o.Backlog
	held, err := b.messages(ctx)
	if err != nil {
		return nil, err
	}
	if held < uint64(n) {
		return nil, fmt.Errorf("bench: events: the stream holds %d messages, fewer than the %d to consume", held, n)
	}
	raw, err := r.readRaw(ctx, b, n)
	if err != nil {
		return nil, err
	}
	r.run.Step(consumeRaw)
	in, err := r.applyInbox(ctx, b, n)
	if err != nil {
		return nil, err
	}
	r.run.Step(consumeInbox)
	return []Consume{raw, in}, nil
}

// readRaw reads the stream's first n messages with an ordered consumer.
func (r *runner) readRaw(ctx context.Context, b *broker, n int) (Consume, error) {
	got := 0
	t0 := time.Now()
	err := natsjs.Read(ctx, b.pub.JetStream(), streamName, 1, func(natsjs.Message) error {
		if got++; got == n {
			return errEnough
		}
		return nil
	})
	d := time.Since(t0)
	if err != nil && !errors.Is(err, errEnough) {
		return Consume{}, fmt.Errorf("bench: events: %s: %w", consumeRaw, err)
	}
	if got != n {
		return Consume{}, fmt.Errorf("bench: events: %s: read %d messages of %d", consumeRaw, got, n)
	}
	return Consume{Name: consumeRaw, Events: n, Seconds: d.Seconds(), EventsPerSec: float64(n) / d.Seconds()}, nil
}

// applyInbox applies the stream's first n messages through an inbox
// consumer on a fresh store, in order, each in its own durable commit.
func (r *runner) applyInbox(ctx context.Context, b *broker, n int) (c Consume, err error) {
	dir := r.run.Dir("inbox")
	e, err := engine.Open(dir, r.o.Engine)
	if err != nil {
		return Consume{}, err
	}
	defer func() {
		err = errors.Join(err, e.Close(), os.RemoveAll(dir))
	}()
	cons, err := inbox.New("bench", e, nil)
	if err != nil {
		return Consume{}, err
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	var (
		applied, other int
		last           uint64
		end            time.Time
	)
	opts := &natsjs.ConsumeOptions{Processed: func(m inbox.Message, out inbox.Outcome) {
		if out.Applied() {
			applied++
		} else {
			other++
		}
		if last = m.Position; applied+other == n {
			end = time.Now()
			stop()
		}
	}}
	st0, err := e.Stats()
	if err != nil {
		return Consume{}, err
	}
	t0 := time.Now()
	err = natsjs.Consume(ctx, b.pub.JetStream(), streamName, cons, credit, opts)
	if end.IsZero() {
		return Consume{}, fmt.Errorf("bench: events: %s: %d messages settled of %d: %w", consumeInbox, applied+other, n, err)
	}
	if applied != n {
		return Consume{}, bench.Violation("%s: %d events applied of %d distinct ones (%d duplicates or rejections)", consumeInbox, applied, n, other)
	}
	if pos, err := cons.Position(context.WithoutCancel(ctx)); err != nil || pos != last {
		return Consume{}, bench.Violation("%s: position %d (%v) after settling message %d", consumeInbox, pos, err, last)
	}
	st1, err := e.Stats()
	if err != nil {
		return Consume{}, err
	}
	d := end.Sub(t0)
	var cd bench.CommitDelta
	cd.Add(st0, st1, d)
	return Consume{Name: consumeInbox, Events: n, Seconds: d.Seconds(), EventsPerSec: float64(n) / d.Seconds(),
		CommitsPerEvent: float64(st1.CommitGroups-st0.CommitGroups) / float64(n), CommitFigures: cd.Figures()}, nil
}

// credit is the inbox's handler: it adds the payment's amount to its
// account's total, a read and a write through fx.
func credit(_ context.Context, fx idemkv.Effects, msg inbox.Message) error {
	var p struct {
		Account string `json:"account"`
		Amount  int64  `json:"amount"`
	}
	if err := json.Unmarshal(msg.Data, &p); err != nil || p.Account == "" {
		return inbox.Reject(fmt.Errorf("not a payment: %v", err))
	}
	key := []byte("ledger/" + p.Account)
	var total int64
	switch v, err := fx.Get(key); {
	case errors.Is(err, idemkv.ErrNotFound):
	case err != nil:
		return err
	case len(v) == 8:
		total = int64(binary.BigEndian.Uint64(v))
	default:
		return fmt.Errorf("total of %s: %d bytes", p.Account, len(v))
	}
	return fx.Set(key, binary.BigEndian.AppendUint64(nil, uint64(total+p.Amount)))
}
