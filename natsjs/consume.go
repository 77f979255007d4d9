package natsjs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/inbox"
	"github.com/idemkv/idemkv/outbox"
)

// Log messages of Consume, stable so that alerts and searches can match
// them. They are the consumer's records, as inbox's own are, so they
// keep its prefix; docs/operations.md lists them beside those.
const (
	msgReadFailed = "inbox: reading the stream failed; retrying"
	msgReadAgain  = "inbox: reading the stream again"
)

// ConsumeOptions configure Consume. A nil *ConsumeOptions means defaults.
type ConsumeOptions struct {
	// FilterSubjects, if set, reads only the stream's messages on these
	// subjects (wildcards allowed). Default: all of them. The position is
	// still the stream sequence, so a consumer's filter may be widened or
	// narrowed later and it resumes where it stopped (a message it did
	// not read then is not read later).
	FilterSubjects []string
	// MinBackoff and MaxBackoff bound the wait before reading again after
	// a failure (a Process error, a lost consumer), doubled after each
	// failure in a row. Defaults 50 ms and 5 s.
	MinBackoff, MaxBackoff time.Duration
	// After waits for a backoff. Default: time.After. Tests inject one.
	After func(time.Duration) <-chan time.Time
	// Logger receives a record of each failure to read or settle
	// (Warn, with the failures in a row so far) and of the recovery that
	// follows (Info), naming the consumer (endpoint) and the stream, and a
	// failed message by position and key hash, never by its id. Default:
	// the consumer's inbox.Options.Logger; with neither, nothing is
	// logged.
	Logger *slog.Logger
	// Processed, if set, is called after each message is settled, from
	// Consume's goroutine, before the next is read: for metrics, logs of
	// rejections and mismatches, and tests.
	Processed func(inbox.Message, inbox.Outcome)
}

func (o *ConsumeOptions) withDefaults() (ConsumeOptions, error) {
	var c ConsumeOptions
	if o != nil {
		c = *o
	}
	if c.MinBackoff < 0 || c.MaxBackoff < 0 {
		return c, fmt.Errorf("%w: natsjs: negative backoff", idemkv.ErrInvalidArgument)
	}
	c.MinBackoff = cmp.Or(c.MinBackoff, 50*time.Millisecond)
	c.MaxBackoff = max(cmp.Or(c.MaxBackoff, 5*time.Second), c.MinBackoff)
	if c.After == nil {
		c.After = time.After
	}
	if c.Processed == nil {
		c.Processed = func(inbox.Message, inbox.Outcome) {}
	}
	return c, nil
}

// Consume feeds inbox consumer c the messages of stream, in stream order,
// from the consumer's committed position on (Position()+1), settling each
// with c.Process and handler h before it reads the next, until ctx ends;
// it then returns ctx's error.
//
// It reads with an ordered consumer: ephemeral, without acknowledgements,
// created from c's position. The broker keeps no state for it: where
// to resume is the store's position, committed with the effects, so a
// consumer stopped at any point (a cancelled ctx, a crash, a restart on
// another machine with the store) resumes exactly after the last message
// whose effects committed. When Process fails (h's error, a conflict, the
// store), it waits (MinBackoff, doubling up to MaxBackoff) and reads again
// from the position, so the failed message comes first again and none
// after it is settled before it: a handler that fails for good blocks
// the consumer, and should inbox.Reject the event instead. A lost
// connection or consumer is retried the same way. Invalid options are
// returned at once, and so is an error no retry can pass: the store's
// idemkv.ErrClosed, idemkv.ErrInvalidArgument (a retention class the
// store lacks, writes past its bounds, or a handler's error wrapping it),
// or ErrStreamReplaced.
//
// Each message's inbox.Message comes from InboxMessage, with the stream's
// name and creation time as its Source, so that the consumer's store
// records which stream its position counts in. The stream must
// keep its messages until they are read (limits retention, or an
// interest or work-queue stream with another consumer holding them):
// messages deleted before the consumer reaches them are skipped.
func Consume(ctx context.Context, js jetstream.JetStream, stream string, c *inbox.Consumer, h inbox.Handler, opts *ConsumeOptions) error {
	o, err := opts.withDefaults()
	if err != nil {
		return err
	}
	if js == nil || c == nil || h == nil {
		return fmt.Errorf("%w: natsjs: Consume needs a JetStream, a consumer and a handler", idemkv.ErrInvalidArgument)
	}
	if o.Logger == nil {
		o.Logger = c.Logger()
	}
	failures := 0
	// recovered runs when a read settles its first message: the stream
	// is read again, and the failures before it are told and forgotten.
	recovered := func() {
		if failures > 0 && o.Logger != nil {
			o.Logger.LogAttrs(ctx, slog.LevelInfo, msgReadAgain, slog.String("tenant", inbox.Tenant), slog.String("endpoint", c.Name()),
				slog.String("stream", stream), slog.Int("failures", failures))
		}
		failures = 0
	}
	for {
		err := consumeFrom(ctx, js, stream, c, h, &o, recovered)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, idemkv.ErrClosed) || errors.Is(err, idemkv.ErrInvalidArgument) || errors.Is(err, ErrStreamReplaced) {
			return err // no retry can pass: a closed store, a class it lacks, another stream
		}
		failures++
		if o.Logger != nil {
			o.Logger.LogAttrs(ctx, slog.LevelWarn, msgReadFailed, slog.String("tenant", inbox.Tenant), slog.String("endpoint", c.Name()),
				slog.String("stream", stream), slog.Int("failures", failures), slog.String("err", err.Error()))
		}
		select {
		case <-o.After(backoff(&o, failures)):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// backoff returns the wait after the given number of failures in a row.
func backoff(o *ConsumeOptions, failures int) time.Duration {
	d := o.MinBackoff
	for i := 1; i < failures && d < o.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, o.MaxBackoff)
}

// consumeFrom reads stream from c's position and settles each message
// until an error or ctx's end, and returns the error (never nil). It
// calls first once the first message is settled.
func consumeFrom(ctx context.Context, js jetstream.JetStream, stream string, c *inbox.Consumer, h inbox.Handler, o *ConsumeOptions,
	first func()) error {
	pos, err := c.Position(ctx)
	if err != nil {
		return err
	}
	info, err := streamInfo(ctx, js, stream)
	if err != nil {
		return err
	}
	source := streamSource(stream, info.Created)
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: o.FilterSubjects, DeliverPolicy: jetstream.DeliverAllPolicy}
	if pos > 0 {
		if last := info.State.LastSeq; last < pos {
			return fmt.Errorf("%w: stream %q ends at %d, the consumer has read through %d", ErrStreamReplaced, stream, last, pos)
		}
		read, err := c.Source(ctx)
		if err != nil {
			return err
		}
		if read != "" && read != source {
			return fmt.Errorf("%w: the consumer has read through %d of %q, the stream is %q", ErrStreamReplaced, pos, read, source)
		}
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, pos+1
	}
	cons, err := js.OrderedConsumer(ctx, stream, cfg)
	if err != nil {
		return fmt.Errorf("reading stream %q from %d: %w", stream, pos+1, err)
	}
	defer deleteConsumer(ctx, js, stream, cons)
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("reading stream %q from %d: %w", stream, pos+1, err)
	}
	defer it.Stop()
	var delivered uint64 // the ordered consumer's sequence of the last message
	for n := 0; ; n++ {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return fmt.Errorf("reading stream %q: %w", stream, err)
		}
		md, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("natsjs: not a JetStream message: %w", err)
		}
		if delivered == 0 || md.Sequence.Consumer <= delivered {
			// The first message, which must be of the stream source
			// names (it may have been replaced since it was read), or
			// the ordered consumer was made anew (a missed heartbeat, a
			// server restart, or the stream deleted): it goes on from the
			// next stream sequence, which must still be this stream's.
			if err := sameStream(ctx, js, stream, info.Created); err != nil {
				return err
			}
		}
		delivered = md.Sequence.Consumer
		msg, err := InboxMessage(m)
		if err != nil {
			return err
		}
		msg.Source = source
		out, err := c.Process(ctx, msg, h)
		if errors.Is(err, inbox.ErrSourceChanged) {
			err = fmt.Errorf("%w: %w", ErrStreamReplaced, err)
		}
		if err != nil {
			return c.MessageError(stream, msg, err)
		}
		if n == 0 {
			first()
		}
		o.Processed(msg, out)
	}
}

// ErrStreamReplaced is returned by Consume when the stream is not the
// one the consumer read (deleted and created again, or a broker restored
// without it): it ends before the consumer's position, it was created
// after the stream the position counts in (inbox.Message.Source, which
// Consume records with the position), or after Consume began reading
// it. Reading on from the position would skip the new stream's messages
// up to it. The consumer's position must be reset by hand (its store
// restored with the stream, started anew, or its position set to 0 to
// read the new stream from its start). A stream restored from a snapshot
// into a cluster gets a new creation time, so even a consumer whose store
// was restored with it is refused: once you know the two match, remove
// the recorded source (inbox.Consumer.SourceKey), and the next message
// records the restored stream's.
var ErrStreamReplaced = errors.New("natsjs: the stream is not the one the consumer read")

// streamSource is the inbox.Message.Source of stream's messages: its name
// and creation time, which the server keeps for the stream's life and
// which a stream created again under the name does not share.
func streamSource(stream string, created time.Time) string {
	return stream + "@" + created.UTC().Format(time.RFC3339Nano)
}

// streamInfo reads stream's information.
func streamInfo(ctx context.Context, js jetstream.JetStream, stream string) (*jetstream.StreamInfo, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("reading stream %q: %w", stream, err)
	}
	return s.CachedInfo(), nil
}

// sameStream checks that stream is still the one created at created.
func sameStream(ctx context.Context, js jetstream.JetStream, stream string, created time.Time) error {
	info, err := streamInfo(ctx, js, stream)
	if err != nil {
		return err
	}
	if !info.Created.Equal(created) {
		return fmt.Errorf("%w: stream %q was created again at %v", ErrStreamReplaced, stream, info.Created.UTC())
	}
	return nil
}

// InboxMessage returns m as an inbox.Message: its stream sequence as the
// Position, and as the ID the header outbox.HeaderEventID
// (Idemkv-Event-Id, set by the outbox relay), else Nats-Msg-Id (the id a
// producer had the stream deduplicate on), else none. It fails only if m
// is not a JetStream message (it has no metadata). For callers that read
// JetStream their own way (a durable consumer with acknowledgements):
// acknowledge m once inbox.Consumer.Process returns without an error.
func InboxMessage(m jetstream.Msg) (inbox.Message, error) {
	md, err := m.Metadata()
	if err != nil {
		return inbox.Message{}, fmt.Errorf("natsjs: not a JetStream message: %w", err)
	}
	hdr := m.Headers()
	id := hdr.Get(outbox.HeaderEventID)
	if id == "" {
		id = hdr.Get(jetstream.MsgIDHeader)
	}
	return inbox.Message{
		ID:       id,
		Position: md.Sequence.Stream,
		Subject:  m.Subject(),
		Header:   hdr,
		Data:     m.Data(),
	}, nil
}
