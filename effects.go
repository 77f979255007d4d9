package idemkv

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// What an operation writes besides its outcome: business data (Effects),
// and events for the transactional outbox (Event, Outbox).

// Effects collects a local operation's business writes so that they commit
// atomically with its outcome, and lets it read the business data those
// writes depend on. Keys live in a namespace of their own, apart from the
// store's records. Writes are not visible to other readers until the
// commit.
//
// Reads are checked at commit: if a key the apply function read (present
// or absent) was written by another commit since, nothing is written and
// the store runs the apply function again, with the lease still held; after
// a bounded number of such conflicts the call fails with ErrConflict. So an
// apply function may run more than once, and must do nothing but read and
// write through Effects (no calls outside the store). Only point reads are
// checked: there is no range read.
//
// Keys are the caller's namespace, shared by every tenant: the store does
// not scope them, so put the tenant in the key of a value that belongs to
// one (AppendTenantKey). A store bounds the size of keys, of one
// operation's writes and of its events; a write past a bound fails with
// ErrInvalidArgument, and the apply function should return that error,
// which then writes nothing.
type Effects interface {
	// Get returns the value of key as this operation sees it: its own
	// writes so far, else the committed value. It returns ErrNotFound if
	// key is absent. The returned slice is the caller's.
	Get(key []byte) ([]byte, error)
	// Set writes key=value. The store copies both.
	Set(key, value []byte) error
	// Delete removes key.
	Delete(key []byte) error
	// Emit adds ev to the store's outbox, in the same commit as the
	// outcome and the writes: it is published if and only if they commit.
	// The store copies it.
	Emit(ev Event) error
}

// A ResultSetter is the Effects a store passes to the apply function of
// Complete (or of Resolve) when it lets that function decide the stored
// result: SetResult replaces the result given to Complete, in the same
// commit as the writes. A function whose result depends on what it reads
// sets it here, so that the stored result is the one of the run whose
// reads were checked. The engine's Effects implement it; a layer above
// (package once) falls back to running the function again where a store's
// do not.
type ResultSetter interface {
	// SetResult sets the result to store. It fails with ErrInvalidResult
	// if the store would refuse r.
	SetResult(r Result) error
}

// Limits on events (Effects.Emit).
const (
	// MaxTopicLen is the longest Event.Topic, in bytes.
	MaxTopicLen = 255
	// MaxEventKeyLen is the longest Event.Key, in bytes.
	MaxEventKeyLen = 1024
)

// An Event is a message an operation publishes when, and only when, its
// outcome commits (the transactional outbox).
type Event struct {
	// Topic names the stream of events, for example "payments.created":
	// the subject it is published on. 1 to MaxTopicLen bytes of printable
	// ASCII, dot-separated non-empty tokens, no space and no wildcard ('*',
	// '>').
	Topic string
	// Key names the entity the event is about ("pay_42"): events of one
	// (Topic, Key) are published in the order they committed, and each
	// carries its place in that order (StoredEvent.EntitySeq). May be
	// empty: all such events of a topic are one entity. No CR or LF, and
	// no space or tab at either end (a relay sends it as a header). A
	// store keeps each entity's last sequence for its whole life, so name
	// long-lived entities (an account, an order), not one per request.
	Key string
	// Payload is the message body.
	Payload []byte
	// Headers are published with the event: names of printable ASCII
	// without spaces or separators, values without CR or LF or a space
	// or tab at either end (a broker would trim it). Nats-* and
	// Idemkv-* names are reserved: the broker's, and the relay's own (the
	// event id and sequences; see StoredEvent).
	Headers map[string]string
}

// A StoredEvent is an event as the outbox keeps and a relay publishes it.
type StoredEvent struct {
	Event
	// ID identifies the event on every publish attempt: a broker that
	// deduplicates on it (JetStream's Nats-Msg-Id) keeps one copy of an
	// event the relay published twice. Unique across stores.
	ID string
	// Seq is the event's place in the outbox: events are numbered in
	// commit order, from 1, without gaps.
	Seq uint64
	// EntitySeq is the event's place among the events of its (Topic,
	// Key), from 1.
	EntitySeq uint64
	// Created is when the event's commit was made.
	Created time.Time
}

// An Outbox is the store's side of the transactional outbox: what a relay
// reads and acknowledges. Events are added by Effects.Emit in the commit of
// their operation; they leave the outbox only when a relay acknowledges
// them. A Store that keeps events implements it.
type Outbox interface {
	// ReadOutbox returns up to limit events with Seq greater than after,
	// in Seq order.
	ReadOutbox(ctx context.Context, after uint64, limit int) ([]StoredEvent, error)
	// AckOutbox records that every event up to and including Seq through
	// has been published, and removes them, if the event numbered through
	// has id (StoredEvent.ID): the check and the removal are one atomic
	// step. A store that holds another event under through, or none
	// (restored from a backup, or failed over to a copy that lacked the
	// events the relay read, and numbered its own), acknowledges nothing
	// and returns ErrConflict: the relay reads it again from its cursor. A
	// store need not make the acknowledgement durable before it returns:
	// after a crash, events acknowledged just before it may be read again,
	// and published again (delivery is at least once). An ack behind the
	// cursor changes nothing.
	AckOutbox(ctx context.Context, through uint64, id string) error
	// OutboxCursor returns the Seq of the last acknowledged event (0 if
	// none) and of the last event committed.
	OutboxCursor(ctx context.Context) (acked, last uint64, err error)
	// OutboxNotify returns a channel that receives a value after a commit
	// adds events (at most one value waits: a reader drains it and reads
	// everything new).
	OutboxNotify() <-chan struct{}
}

// A SharedOutbox is an Outbox that several relays, in several processes,
// can publish together: each claims events no other relay holds, so that
// no event is published by two relays at once, and each entity's events
// are still published in their order (events of different entities may be
// published out of Seq order). A store that a fleet of processes shares
// implements it. All the relays of one store must then claim: a relay
// reading with ReadOutbox does not see what the others hold.
type SharedOutbox interface {
	Outbox
	// ClaimOutbox takes up to limit events that no other claim holds, in
	// Seq order: the earliest unpublished event of some entities, and
	// the events that follow each in its entity. An empty claim holds
	// nothing. The events are held until the claim is finished.
	ClaimOutbox(ctx context.Context, limit int) (OutboxClaim, error)
}

// An OutboxHolder is an Outbox that holds what its relay read or claimed
// for a while only: pgstore keeps the outbox with one process's relay by
// a lease that ReadOutbox renews, and a claim (SharedOutbox) by a
// transaction the database ends once it has idled too long. Once
// OutboxHold has passed since a ReadOutbox or ClaimOutbox returned, by
// the store's clock, another relay may publish the same events, so a
// relay publishes no more of them and reads or claims again. A store
// without it holds them until the relay is done with them.
type OutboxHolder interface {
	OutboxHold() time.Duration
}

// An OutboxClaim is a relay's hold on some events (SharedOutbox).
type OutboxClaim interface {
	// Events are the events held, in Seq order.
	Events() []StoredEvent
	// Finish marks the first published of Events as published and gives
	// the rest back to be claimed again. It must be called once, even
	// after ctx ended (it then only gives the events back). A claim
	// whose process dies is given back by the store.
	Finish(ctx context.Context, published int) error
}

// Validate reports whether ev is an event every store keeps and every
// relay can publish unchanged: a topic and key within their limits and
// rules (see Event), and headers a broker would neither refuse nor change,
// under names not reserved. It does not bound the event's size, which is
// each store's own limit. Its errors wrap ErrInvalidArgument.
func (ev *Event) Validate() error {
	switch {
	case ev.Topic == "":
		return fmt.Errorf("%w: event has no topic", ErrInvalidArgument)
	case len(ev.Topic) > MaxTopicLen:
		return fmt.Errorf("%w: event topic is %d bytes, limit %d", ErrInvalidArgument, len(ev.Topic), MaxTopicLen)
	case len(ev.Key) > MaxEventKeyLen:
		return fmt.Errorf("%w: event key is %d bytes, limit %d", ErrInvalidArgument, len(ev.Key), MaxEventKeyLen)
	}
	for i := 0; i < len(ev.Topic); i++ {
		if c := ev.Topic[i]; c <= ' ' || c > '~' || c == '*' || c == '>' {
			return fmt.Errorf("%w: event topic %q: byte %q is not allowed (printable ASCII, no space, no wildcard)", ErrInvalidArgument, ev.Topic, c)
		}
	}
	if strings.HasPrefix(ev.Topic, ".") || strings.HasSuffix(ev.Topic, ".") || strings.Contains(ev.Topic, "..") {
		return fmt.Errorf("%w: event topic %q has an empty token (leading, trailing or double dot)", ErrInvalidArgument, ev.Topic)
	}
	if strings.ContainsAny(ev.Key, "\r\n") {
		return fmt.Errorf("%w: event key contains CR or LF", ErrInvalidArgument)
	}
	if padded(ev.Key) {
		return fmt.Errorf("%w: event key %q begins or ends with a space or tab (a relay sends it as a header, which a broker trims)", ErrInvalidArgument, ev.Key)
	}
	for name, v := range ev.Headers {
		if err := validateEventHeader(name, v); err != nil {
			return err
		}
	}
	return nil
}

// validateEventHeader refuses a header a broker would refuse or change
// (a relay never drops an event, so one it cannot publish must not be
// committed) and the names brokers and the relay reserve.
func validateEventHeader(name, value string) error {
	if name == "" {
		return fmt.Errorf("%w: event header with an empty name", ErrInvalidArgument)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c > '~' || strings.IndexByte(`"()/,:;<=>?@[\]{}`, c) >= 0 {
			return fmt.Errorf("%w: event header name %q: byte %q is not allowed (printable ASCII, no space or separator)", ErrInvalidArgument, name, c)
		}
	}
	if l := strings.ToLower(name); strings.HasPrefix(l, "nats-") || strings.HasPrefix(l, "idemkv-") {
		return fmt.Errorf("%w: event header %q: Nats-* and Idemkv-* headers are reserved", ErrInvalidArgument, name)
	}
	if strings.ContainsAny(value, "\r\n") {
		return fmt.Errorf("%w: event header %q: value contains CR or LF", ErrInvalidArgument, name)
	}
	if padded(value) {
		return fmt.Errorf("%w: event header %q: value begins or ends with a space or tab, which a broker trims", ErrInvalidArgument, name)
	}
	return nil
}

// padded reports whether s begins or ends with a space or a tab: a
// header value a broker would send trimmed (nats.go does).
func padded(s string) bool {
	return s != "" && (s[0] == ' ' || s[0] == '\t' || s[len(s)-1] == ' ' || s[len(s)-1] == '\t')
}
