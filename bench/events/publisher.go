package events

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/bench"
	"github.com/idemkv/idemkv/outbox"
)

// topic is the topic of every event the run emits; the JetStream stream
// captures subjects.
const topic = "payments.created"

// subjects are the subjects of the run's JetStream stream.
var subjects = []string{"payments.>"}

// payloadBytes is the size of every event's payload.
const payloadBytes = 200

// numberPrefix starts every payload; the event's number follows it, in
// numberDigits decimal digits, so that a publisher can tell which request
// committed the event without a map.
const (
	numberPrefix = `{"n":"`
	numberDigits = 20
)

// event returns the event request (stream, i) emits, numbered n: on
// topic, the payment's id as its key (each request its own entity), a
// Content-Type header, and a JSON payload of exactly payloadBytes bytes
// that starts with n.
func event(stream, i, n uint64, tenants int) idemkv.Event {
	id := bench.Key(stream, i, tenants)
	ptr := bench.Result(stream, i, nil).Pointer
	pay := ptr[strings.LastIndexByte(ptr, '/')+1:]
	p := fmt.Appendf(make([]byte, 0, payloadBytes), `%s%0*d","payment":%q,"account":%q,"amount":%d,"currency":"USD","status":"created","memo":"`,
		numberPrefix, numberDigits, n, pay, id.Tenant, 100+i%99_900)
	for len(p) < payloadBytes-2 {
		p = append(p, 'x')
	}
	p = append(p[:payloadBytes-2], '"', '}')
	return idemkv.Event{Topic: topic, Key: pay, Payload: p, Headers: map[string]string{"Content-Type": "application/json"}}
}

// eventNumber returns the number event wrote into payload.
func eventNumber(payload []byte) (uint64, bool) {
	if len(payload) < len(numberPrefix)+numberDigits || string(payload[:len(numberPrefix)]) != numberPrefix {
		return 0, false
	}
	n, err := strconv.ParseUint(string(payload[len(numberPrefix):len(numberPrefix)+numberDigits]), 10, 64)
	return n, err == nil
}

// discard is a publisher with no broker: it acknowledges every event at
// once, and counts them.
type discard struct{ n atomic.Int64 }

var _ outbox.Publisher = (*discard)(nil)

func (d *discard) Publish(context.Context, idemkv.StoredEvent) error {
	d.n.Add(1)
	return nil
}

// timing wraps a publisher and records when each event's publish was
// acknowledged, by the number event wrote into its payload. The relay
// calls Publish from one goroutine; the arrays are read once it has
// stopped.
type timing struct {
	pub  outbox.Publisher
	base time.Time
	// acked[n] is event n's first acknowledgement, in ns since base (0:
	// none yet).
	acked     []atomic.Int64
	published atomic.Int64 // distinct events acknowledged
	repeats   atomic.Int64 // acknowledgements of an event already acknowledged
	strangers atomic.Int64 // events without a number of this load
	mu        struct {
		sync.Mutex
		// fromCreated is the time from each event's Created to its
		// acknowledgement.
		fromCreated *bench.Histogram
	}
}

func newTiming(pub outbox.Publisher, base time.Time, events int) *timing {
	t := &timing{pub: pub, base: base, acked: make([]atomic.Int64, events)}
	t.mu.fromCreated = bench.NewHistogram()
	return t
}

// Publish implements outbox.Publisher.
func (t *timing) Publish(ctx context.Context, ev idemkv.StoredEvent) error {
	if err := t.pub.Publish(ctx, ev); err != nil {
		return err
	}
	now := time.Now()
	n, ok := eventNumber(ev.Payload)
	if !ok || n >= uint64(len(t.acked)) {
		// Not an error for the relay: it would publish it for ever.
		t.strangers.Add(1)
		return nil
	}
	if t.acked[n].CompareAndSwap(0, max(1, int64(now.Sub(t.base)))) {
		t.published.Add(1)
	} else {
		t.repeats.Add(1)
	}
	t.mu.Lock()
	t.mu.fromCreated.Record(now.Sub(ev.Created))
	t.mu.Unlock()
	return nil
}
