package outbox

import (
	"context"

	"github.com/idemkv/idemkv"
)

// A Publisher sends events to a broker. The relay calls it from one
// goroutine, one event at a time, in outbox order.
type Publisher interface {
	// Publish sends ev and returns nil only once the broker has
	// acknowledged it (durably, by the broker's own standard). An error
	// means it may or may not have been published: the relay publishes it
	// again, with the same ev.ID, so a broker that deduplicates on the id
	// keeps one copy. A Publisher must not retry on its own past ctx.
	Publish(ctx context.Context, ev idemkv.StoredEvent) error
}

// Headers the relay's publishers set on every message, beside the event's
// own.
const (
	// HeaderEventID carries StoredEvent.ID.
	HeaderEventID = "Idemkv-Event-Id"
	// HeaderEntityKey carries Event.Key.
	HeaderEntityKey = "Idemkv-Entity-Key"
	// HeaderEntitySeq carries StoredEvent.EntitySeq, in decimal.
	HeaderEntitySeq = "Idemkv-Entity-Seq"
	// HeaderOutboxSeq carries StoredEvent.Seq, in decimal.
	HeaderOutboxSeq = "Idemkv-Outbox-Seq"
	// HeaderCreated carries StoredEvent.Created, RFC 3339 with nanoseconds.
	HeaderCreated = "Idemkv-Created"
)
