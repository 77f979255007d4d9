package natsjs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/outbox"
)

// Errors returned by Publish, beside the broker's and the connection's own
// (wrapped, so errors.Is sees jetstream.ErrNoStreamResponse,
// context.DeadlineExceeded and the like).
var (
	// ErrInvalidEvent: the event cannot be published as it is: its topic
	// does not make a valid literal subject, its id is empty, a header is
	// malformed or reserved, or it is larger than the server's maximum
	// payload. Nothing was sent, and publishing it again fails the same
	// way.
	ErrInvalidEvent = errors.New("natsjs: invalid event")
	// ErrNotConnected: the connection to the server is down (reconnecting
	// or closed) when Publish starts. Nothing was sent; publish again once
	// it reconnects.
	ErrNotConnected = errors.New("natsjs: not connected to the server")
)

// DefaultPublishTimeout is Options.PublishTimeout's default.
const DefaultPublishTimeout = 5 * time.Second

// Options configure a Publisher. A nil *Options means defaults.
type Options struct {
	// SubjectPrefix, if not empty, is put before each event's topic, with
	// a dot between: with prefix "idemkv", topic "payments.created" is
	// published on "idemkv.payments.created". It must itself be a literal
	// subject (dot-separated tokens of printable ASCII, no spaces, no
	// wildcards, no empty token). Default "": the topic is the subject.
	SubjectPrefix string

	// PublishTimeout bounds each Publish, within its ctx: an attempt with
	// no PubAck by then fails, and the relay publishes the event again
	// (the duplicate window absorbs the copy if the first attempt did
	// land). Default DefaultPublishTimeout (5s). Too short a timeout turns
	// a slow broker into republishes; too long holds the relay on a dead
	// one.
	PublishTimeout time.Duration
}

// EnsureDefaults returns a copy of o (which may be nil) with zero fields
// set to their defaults.
func (o *Options) EnsureDefaults() *Options {
	var c Options
	if o != nil {
		c = *o
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = DefaultPublishTimeout
	}
	return &c
}

// Validate reports whether o is usable.
func (o *Options) Validate() error {
	var errs []error
	if o.SubjectPrefix != "" {
		if err := validateSubject(o.SubjectPrefix); err != nil {
			errs = append(errs, fmt.Errorf("SubjectPrefix: %w", err))
		}
	}
	if o.PublishTimeout < 0 {
		errs = append(errs, fmt.Errorf("PublishTimeout %v is negative", o.PublishTimeout))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("natsjs: invalid options: %w", err)
	}
	return nil
}

// A Publisher publishes outbox events to JetStream. It implements
// outbox.Publisher, and is safe for concurrent use (the relay uses it
// from one goroutine).
type Publisher struct {
	opts    Options
	nc      *nats.Conn
	js      jetstream.JetStream
	ownConn bool // Close closes nc: Connect made it
}

var _ outbox.Publisher = (*Publisher)(nil)

// New returns a Publisher on nc. The caller keeps ownership of nc: Close
// does not close it, and the caller closes it after the Publisher's last
// use. Configure nc to reconnect for ever (nats.MaxReconnects(-1)): nats.go
// gives up after 60 attempts by default, and a closed connection makes
// every later Publish fail with ErrNotConnected.
func New(nc *nats.Conn, opts *Options) (*Publisher, error) {
	if nc == nil {
		return nil, fmt.Errorf("natsjs: nil connection")
	}
	o := opts.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("natsjs: %w", err)
	}
	return &Publisher{opts: *o, nc: nc, js: js}, nil
}

// Connect dials url (a NATS URL, or a comma-separated list of them) and
// returns a Publisher that owns the connection: Close closes it. The
// connection reconnects for ever and keeps no reconnect buffer, so a
// publish during an outage fails at once rather than waiting in a buffer
// that is sent on reconnect. natsOpts (credentials, TLS, a name) are
// applied after those defaults. If the server is unreachable, Connect
// fails.
func Connect(url string, opts *Options, natsOpts ...nats.Option) (*Publisher, error) {
	o := opts.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	all := append([]nats.Option{
		nats.Name("idemkv-outbox"),
		nats.MaxReconnects(-1),
		nats.ReconnectBufSize(-1),
	}, natsOpts...)
	nc, err := nats.Connect(url, all...)
	if err != nil {
		return nil, fmt.Errorf("natsjs: connect %s: %w", url, err)
	}
	p, err := New(nc, o)
	if err != nil {
		nc.Close()
		return nil, err
	}
	p.ownConn = true
	return p, nil
}

// JetStream returns the Publisher's JetStream context, on its connection
// (for EnsureStream and Read). It is valid until Close.
func (p *Publisher) JetStream() jetstream.JetStream { return p.js }

// Close closes the connection if Connect made it, and otherwise does
// nothing. Publish after Close fails if the connection is closed.
func (p *Publisher) Close() error {
	if p.ownConn {
		p.nc.Close()
	}
	return nil
}

// Publish publishes ev.Payload on the subject SubjectPrefix.ev.Topic, with
// ev.Headers, the outbox headers (outbox.HeaderEventID and the rest;
// they replace event headers of the same name) and Nats-Msg-Id set to
// ev.ID, and returns nil once the stream has acknowledged it: stored it,
// or recognized it as a duplicate of a message stored within the stream's
// duplicate window. It makes one attempt, bounded by ctx and
// PublishTimeout.
//
// Errors: ErrInvalidEvent (nothing sent; it will never succeed),
// ErrNotConnected (nothing sent), jetstream.ErrNoStreamResponse (no stream
// captures the subject), or a timeout, context or broker error, after
// which the event may or may not be stored.
func (p *Publisher) Publish(ctx context.Context, ev idemkv.StoredEvent) error {
	msg, err := p.message(ev)
	if err != nil {
		return err
	}
	if !p.nc.IsConnected() {
		return fmt.Errorf("natsjs: publish event %s: %w (connection %v)", ev.ID, ErrNotConnected, p.nc.Status())
	}
	ctx, cancel := context.WithTimeout(ctx, p.opts.PublishTimeout)
	defer cancel()
	// No retries of our own: the relay is the retry loop, and must see
	// each failure to back off.
	//
	// A PubAck with Duplicate set is a success too: a copy with this id
	// is already stored, from an earlier attempt whose ack was lost, and
	// that copy is what the relay republished to make sure of.
	if _, err := p.js.PublishMsg(ctx, msg, jetstream.WithMsgID(ev.ID), jetstream.WithRetryAttempts(0)); err != nil {
		if errors.Is(err, nats.ErrMaxPayload) {
			// nats.go refuses it before sending, and always will.
			return fmt.Errorf("%w: event %s: %d bytes of payload and headers, over the server's limit of %d: %w",
				ErrInvalidEvent, ev.ID, len(msg.Data)+headerSize(msg.Header), p.nc.MaxPayload(), err)
		}
		return fmt.Errorf("natsjs: publish event %s on %q: %w", ev.ID, msg.Subject, err)
	}
	return nil
}

// message builds the NATS message for ev, or says why it cannot.
func (p *Publisher) message(ev idemkv.StoredEvent) (*nats.Msg, error) {
	if ev.ID == "" {
		return nil, fmt.Errorf("%w: empty event id (the broker deduplicates on it)", ErrInvalidEvent)
	}
	// The id and the key travel as header values too.
	if err := validateHeader(outbox.HeaderEventID, ev.ID); err != nil {
		return nil, fmt.Errorf("%w: event id %q: %w", ErrInvalidEvent, ev.ID, err)
	}
	if err := validateHeader(outbox.HeaderEntityKey, ev.Key); err != nil {
		return nil, fmt.Errorf("%w: event %s: key: %w", ErrInvalidEvent, ev.ID, err)
	}
	subj, err := p.subject(ev.Topic)
	if err != nil {
		return nil, fmt.Errorf("%w: event %s: %w", ErrInvalidEvent, ev.ID, err)
	}
	h := make(nats.Header, len(ev.Headers)+6)
	for k, v := range ev.Headers {
		if err := validateHeader(k, v); err != nil {
			return nil, fmt.Errorf("%w: event %s: %w", ErrInvalidEvent, ev.ID, err)
		}
		h.Set(k, v)
	}
	h.Set(outbox.HeaderEventID, ev.ID)
	h.Set(outbox.HeaderEntityKey, ev.Key)
	h.Set(outbox.HeaderEntitySeq, strconv.FormatUint(ev.EntitySeq, 10))
	h.Set(outbox.HeaderOutboxSeq, strconv.FormatUint(ev.Seq, 10))
	h.Set(outbox.HeaderCreated, ev.Created.UTC().Format(time.RFC3339Nano))
	return &nats.Msg{Subject: subj, Header: h, Data: ev.Payload}, nil
}

// headerSize approximates h's encoded size, for an error message.
func headerSize(h nats.Header) int {
	n := len("NATS/1.0\r\n\r\n")
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v) + len(": \r\n")
		}
	}
	return n
}

// subject returns the subject topic is published on.
func (p *Publisher) subject(topic string) (string, error) {
	if topic == "" {
		return "", fmt.Errorf("empty topic")
	}
	subj := topic
	if p.opts.SubjectPrefix != "" {
		subj = p.opts.SubjectPrefix + "." + topic
	}
	if err := validateSubject(subj); err != nil {
		return "", fmt.Errorf("topic %q: %w", topic, err)
	}
	return subj, nil
}
