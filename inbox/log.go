package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/redact"
	"github.com/idemkv/idemkv/once"
)

// The structured records a Consumer logs to Options.Logger, one per
// message settled or failed. They name the event's dedup mark as the
// HTTP middleware names a key: tenant ("inbox"), endpoint (the consumer's
// name) and key_hash (idemkv.ID.Hash of the mark), with the message's
// position and subject; never its id (the mark's key) or its payload.
// docs/operations.md lists them for operators.

// Log messages, stable so that alerts and searches can match them.
const (
	msgApplied    = "inbox: event applied"
	msgRejected   = "inbox: event rejected"
	msgDuplicate  = "inbox: duplicate skipped"
	msgMismatch   = "inbox: event id reused with other content"
	msgInProgress = "inbox: event in progress"
	msgHandler    = "inbox: handler failed; the message is to be redelivered"
	msgStore      = "inbox: store error; the message is to be redelivered"
	msgSource     = "inbox: message from another stream than the position's; refused"
)

// logProcessed logs what Process did with msg, whose mark's key is key
// ("" if it could not be identified): out, or err (handlerErr: h's own).
func (c *Consumer) logProcessed(ctx context.Context, msg *Message, key string, out Outcome, err error, handlerErr bool) {
	level, what := slog.LevelInfo, msgApplied
	var attrs []slog.Attr
	switch {
	case err != nil && errors.Is(err, once.ErrInProgress):
		level, what = slog.LevelDebug, msgInProgress
	case err != nil && errors.Is(err, ErrSourceChanged):
		level, what = slog.LevelError, msgSource
		attrs = append(attrs, slog.Any("err", err))
	case err != nil && handlerErr:
		level, what = slog.LevelWarn, msgHandler
		attrs = append(attrs, slog.Any("err", err))
	case err != nil:
		level, what = slog.LevelError, msgStore
		attrs = append(attrs, slog.Any("err", err))
	case out.Mismatch:
		level, what = slog.LevelWarn, msgMismatch
	case out.Duplicate:
		level, what = slog.LevelDebug, msgDuplicate
		attrs = append(attrs, slog.Bool("rejected", out.Rejected))
	case out.Rejected:
		level, what = slog.LevelWarn, msgRejected
		attrs = append(attrs, slog.String("reason", out.Reason))
	}
	c.log(ctx, level, what, msg, key, attrs...)
}

// log logs one record about msg: the consumer, the mark's key_hash (key
// "": none), the message's position and subject, then attrs. The "err"
// and "reason" attributes have the event's id and the mark's key taken
// out, unless Options.LogRawKeys, which also adds the mark's key as "key".
func (c *Consumer) log(ctx context.Context, level slog.Level, what string, msg *Message, key string, attrs ...slog.Attr) {
	l := c.opts.Logger
	if l == nil || !l.Enabled(ctx, level) {
		return
	}
	all := make([]slog.Attr, 0, 6+len(attrs))
	all = append(all, slog.String("tenant", Tenant), slog.String("endpoint", c.name))
	hash := ""
	if key != "" {
		hash = c.markID(key).Hash()
		all = append(all, slog.String("key_hash", hash))
		if c.opts.LogRawKeys {
			all = append(all, slog.String("key", key))
		}
	}
	all = append(all, slog.Uint64("position", msg.Position), slog.String("subject", msg.Subject))
	for _, a := range attrs {
		if (a.Key == "err" || a.Key == "reason") && !c.opts.LogRawKeys {
			a.Value = slog.StringValue(c.redact(a.Value.String(), msg, key, hash))
		}
		all = append(all, a)
	}
	l.LogAttrs(ctx, level, what, all...)
}

// redact returns s with msg's id and its mark's key replaced by the
// mark's hash.
func (c *Consumer) redact(s string, msg *Message, key, hash string) string {
	if hash == "" {
		hash = "unidentified"
	}
	s = redact.Key(s, key, hash)
	return redact.Key(s, msg.ID, hash)
}

// markID is the idemkv.ID of the dedup mark whose key is key.
func (c *Consumer) markID(key string) idemkv.ID {
	return idemkv.ID{Tenant: Tenant, Endpoint: c.name, Key: key}
}

// MessageError returns err, c's failure to process msg read from stream
// (a Process error), as a reader that feeds c in stream order (such as
// natsjs.Consume) returns and logs it: its text names the message by its
// position and its mark's key hash, and has the event's id taken out
// (unless Options.LogRawKeys), because ids can carry customer data, as
// keys can. errors.Is and errors.As see err through it. A nil err gives
// nil.
func (c *Consumer) MessageError(stream string, msg Message, err error) error {
	if err == nil {
		return nil
	}
	return &eventError{c: c, stream: stream, msg: msg, err: err}
}

// eventError is MessageError's error.
type eventError struct {
	c      *Consumer
	stream string
	msg    Message
	err    error
}

func (e *eventError) Error() string {
	key := ""
	if m, err := identify(&e.msg); err == nil {
		key = m.key
	}
	if e.c.opts.LogRawKeys {
		return fmt.Sprintf("message %d of stream %q (event %q): %v", e.msg.Position, e.stream, e.msg.ID, e.err)
	}
	hash := ""
	if key != "" {
		hash = e.c.markID(key).Hash()
	}
	s := fmt.Sprintf("message %d of stream %q (event key_hash %s): %v", e.msg.Position, e.stream, hash, e.err)
	return e.c.redact(s, &e.msg, key, hash)
}

func (e *eventError) Unwrap() error { return e.err }
