package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/once"
)

// Tenant is the idemkv.ID tenant of every consumer's dedup marks; the
// consumer's name is their endpoint.
const Tenant = "inbox"

// A Store keeps a Consumer's dedup marks, its position and its handler's
// effects: an idemkv.Store whose business data can also be read outside
// an operation, to learn the position. *engine.Engine and *pgstore.Store
// are Stores.
type Store interface {
	idemkv.Store
	idemkv.DataReader
}

// A Message is one delivery of an event to a consumer.
type Message struct {
	// ID identifies the event: every copy of one event carries the same
	// id, and two events never share one. Copies published by the outbox
	// relay carry outbox.HeaderEventID; natsjs.InboxMessage takes it
	// from there, or from Nats-Msg-Id. Empty: the event is identified by
	// its content (Subject and Data; see the package doc).
	ID string
	// Position is the message's place in the stream it was read from
	// (JetStream's stream sequence): increasing, from 1. The consumer's
	// position is advanced to it in the commit that settles the message.
	// 0: the message has no position, and settling it leaves the
	// position as it is.
	Position uint64
	// Source names the sequence Position counts in: one stream, and one
	// life of it, since a stream deleted and created again numbers its
	// messages from 1 again. The consumer records it with its position;
	// once the position is past 0, a message from another source is
	// refused (ErrSourceChanged) and nothing is written, since reading
	// on would skip the new source's messages up to the position.
	// natsjs.Consume sets it to the stream's name and creation time.
	// Empty, or a message without a Position: not checked, and not
	// recorded.
	Source string
	// Subject is the subject (topic) it was published on.
	Subject string
	// Header holds its headers, as nats.Header does. The handler may read
	// them; they are not part of the event's identity.
	Header map[string][]string
	// Data is the payload.
	Data []byte
}

// A Handler applies one event: it reads and writes business data through
// fx, whose writes commit atomically with the event's dedup mark and the
// consumer's position. It runs inside that commit, and runs again if a
// key it read was changed by another commit before its own could commit:
// it must act only through fx, and change nothing else that a second run
// would repeat. The keys under "inbox/" are the consumers' own: a handler
// must not write them. Its ctx is Process's.
//
// It returns nil to apply the event; Reject(err) to refuse it for good
// (its writes are dropped, the refusal is recorded, and the event is
// never handled again); any other error to fail this delivery (nothing is
// written, and Process returns the error for the caller to redeliver).
type Handler func(ctx context.Context, fx idemkv.Effects, msg Message) error

// Outcome says what Process did with a message. A message applied now
// has neither Duplicate nor Rejected set.
type Outcome struct {
	// Key is the key of the event's dedup mark (idemkv.ID.Key, under
	// Tenant and the consumer's name).
	Key string
	// Duplicate: the event had been settled before (applied or rejected),
	// and nothing the handler wrote now was kept (settled in one step,
	// Options.WritesOnly, it runs before the claim; otherwise it did not
	// run).
	Duplicate bool
	// Rejected: the handler rejected the event (Reject), now or, if
	// Duplicate, when it was first handled; nothing of it was applied.
	// Reason is the rejection's message, clipped to maxReason bytes.
	Rejected bool
	Reason   string
	// Mismatch (with Duplicate): the event's id was settled before with
	// other content (subject or payload). The id says it is the same
	// event, so it is not applied again; the producer reused an id or
	// changed a copy, which is worth an alert.
	Mismatch bool
}

// Applied reports whether the handler's writes for the event committed
// in this call.
func (o Outcome) Applied() bool { return !o.Duplicate && !o.Rejected }

// Options configure a Consumer. A nil *Options means defaults.
type Options struct {
	// Retention names the store's retention class of the dedup marks:
	// how long after an event is settled a copy of it is still
	// recognized. Default "": the store's default class (the engine's is
	// 24 hours). The class must be configured in the store
	// (engine.Options.RetentionClasses); a class it lacks makes every
	// Process fail with idemkv.ErrInvalidArgument. Its window must cover
	// the longest time between two copies of one event: see the package
	// doc, "Retention". A longer window costs one small record per event
	// for that long.
	Retention string
	// Logger receives a structured record of what Process does with each
	// message: applied (Info: one record per event, the state change of
	// its mark, as the HTTP middleware logs each request's), rejected or
	// an id reused with other content (Warn: worth an alert), a handler's
	// failure (Warn: redelivered), a store failure (Error), and at Debug a
	// duplicate skipped or a delivery already in progress. Each names the
	// event by tenant ("inbox"), endpoint (the consumer's name), key_hash
	// (idemkv.ID.Hash of its mark), position and subject; never by its id,
	// which can carry customer data, and never with its payload. A
	// consumer at a rate where a record per event is too many sets the
	// Logger's level to Warn: a disabled level costs nothing. Default
	// (nil): no records, as reconcile.Options.Logger.
	Logger *slog.Logger
	// LogRawKeys adds the mark's key (which holds the event's id) to every
	// record, as "key", and keeps the id in errors. Only for logs guarded
	// like the data itself. Default: off.
	LogRawKeys bool
	// WritesOnly declares that the handlers only write through Effects
	// (no Get). A message without a position (Message.Position 0) is then
	// settled in one step on a store that can (idemkv.LocalRunner:
	// pgstore; once.Call.WritesOnly): its mark, its writes and its
	// outcome in one round trip and one commit. A message with a position
	// reads the consumer's position, and is settled by a claim and a
	// commit. A handler that reads after all still gets checked reads.
	// Default: off.
	WritesOnly bool
}

// A Consumer applies each event exactly once to its store: Process
// commits the handler's writes, the event's dedup mark and the
// consumer's position together. It is safe for concurrent use, but meant
// for one message at a time in stream order: concurrent calls all read
// and write the position, so they conflict and run their handlers again
// (see Process), and only an in-order consumer can resume from Position.
type Consumer struct {
	name        string
	store       Store
	opts        Options
	positionKey []byte
	sourceKey   []byte
}

// ErrSourceChanged is returned by Process for a message whose
// Message.Source is not the one recorded with the consumer's position
// (the stream was replaced: deleted and created again, or a broker
// restored without it). Nothing is written. The consumer's position
// belongs to the old source: restore the consumer's store with the
// stream, or reset its position to 0 (PositionKey) to read the new
// source from its start.
var ErrSourceChanged = errors.New("inbox: the message is from another source than the consumer's position")

// MaxNameLen is the longest consumer name, in bytes.
const MaxNameLen = 200

// New returns the consumer name on store. The name identifies the
// consumer's marks and position in the store: a consumer opened again
// under the same name resumes where it stopped. It is 1 to MaxNameLen
// bytes of a-z, A-Z, 0-9, '.', '_' and '-'. Errors wrap
// idemkv.ErrInvalidArgument.
func New(name string, store Store, opts *Options) (*Consumer, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	if store == nil {
		return nil, fmt.Errorf("%w: inbox: nil store", idemkv.ErrInvalidArgument)
	}
	c := &Consumer{name: name, store: store, positionKey: []byte("inbox/" + name + "/position"),
		sourceKey: []byte("inbox/" + name + "/source")}
	if opts != nil {
		c.opts = *opts
	}
	if len(c.opts.Retention) > idemkv.MaxClassLen {
		return nil, fmt.Errorf("%w: inbox: retention class name is %d bytes, limit %d",
			idemkv.ErrInvalidArgument, len(c.opts.Retention), idemkv.MaxClassLen)
	}
	return c, nil
}

// ValidateName reports whether name can be a consumer's name: 1 to
// MaxNameLen bytes of [a-zA-Z0-9._-]. So a record of Tenant whose endpoint
// is not such a name (an HTTP route's, "POST /v1/...") is not a
// consumer's.
func ValidateName(name string) error {
	if name == "" || len(name) > MaxNameLen {
		return fmt.Errorf("%w: inbox: consumer name %q: want 1 to %d bytes", idemkv.ErrInvalidArgument, name, MaxNameLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("%w: inbox: consumer name %q: byte %q not in [a-zA-Z0-9._-]", idemkv.ErrInvalidArgument, name, c)
		}
	}
	return nil
}

// Name returns the consumer's name.
func (c *Consumer) Name() string { return c.name }

// Logger returns the consumer's Options.Logger (nil if none), for a
// reader that feeds the consumer (natsjs.Consume) and logs its own
// failures to the same Logger, naming the consumer as its records do
// (tenant Tenant, endpoint Name).
func (c *Consumer) Logger() *slog.Logger { return c.opts.Logger }

// PositionKey returns the business-data key under which the consumer's
// position is stored ("inbox/<name>/position", in decimal), for tools
// that read or reset it.
func (c *Consumer) PositionKey() []byte { return append([]byte(nil), c.positionKey...) }

// SourceKey returns the business-data key under which the source of the
// consumer's position is stored ("inbox/<name>/source"), for tools that
// read it or remove it: a position recorded without a source takes the
// next message's.
func (c *Consumer) SourceKey() []byte { return append([]byte(nil), c.sourceKey...) }

// Position returns the consumer's committed position: the highest
// Message.Position settled (0 if none). A consumer that reads its stream
// in order and settles each message before the next resumes at
// Position()+1. It reads only what is committed, so it is never ahead of
// the effects it covers. Errors: the store's (idemkv.ErrClosed, an I/O
// error), or a malformed stored value.
func (c *Consumer) Position(ctx context.Context) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	v, err := c.store.GetData(ctx, c.positionKey)
	if errors.Is(err, idemkv.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("inbox: %s: reading the position: %w", c.name, err)
	}
	return parsePosition(c.name, v)
}

// Source returns the Message.Source recorded with the consumer's position
// ("" if none was: no message with a source settled yet). Errors: the
// store's.
func (c *Consumer) Source(ctx context.Context) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	v, err := c.store.GetData(ctx, c.sourceKey)
	if errors.Is(err, idemkv.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("inbox: %s: reading the source: %w", c.name, err)
	}
	return string(v), nil
}

// sameSource returns ErrSourceChanged if the position cur counts in
// another source than source (checkSource, read outside a commit).
func (c *Consumer) sameSource(ctx context.Context, cur uint64, source string) error {
	if source == "" || cur == 0 {
		return nil
	}
	recorded, err := c.Source(ctx)
	if err != nil {
		return err
	}
	return c.sourceChanged(cur, recorded, source)
}

// parsePosition decodes a stored position: decimal, without sign or
// leading zeros.
func parsePosition(name string, v []byte) (uint64, error) {
	p, err := strconv.ParseUint(string(v), 10, 64)
	if err != nil || strconv.FormatUint(p, 10) != string(v) {
		return 0, fmt.Errorf("inbox: %s: stored position %q is not a decimal number", name, v)
	}
	return p, nil
}

// advance sets the position to pos, within fx's commit, if it is behind,
// after checking source against the recorded one (checkSource). The
// reads are checked at the commit, so two commits never both move it.
func (c *Consumer) advance(fx idemkv.Effects, pos uint64, source string) error {
	if pos == 0 {
		return nil
	}
	cur := uint64(0)
	v, err := fx.Get(c.positionKey)
	switch {
	case errors.Is(err, idemkv.ErrNotFound):
	case err != nil:
		return err
	default:
		if cur, err = parsePosition(c.name, v); err != nil {
			return err
		}
	}
	if err := c.checkSource(fx, cur, source); err != nil {
		return err
	}
	if pos <= cur {
		return nil
	}
	return fx.Set(c.positionKey, strconv.AppendUint(nil, pos, 10))
}

// checkSource, within fx's commit, refuses a message from source when
// the position cur counts in another one, and records source when none
// is. A position of 0 counts in no source (a new consumer, or one reset
// by hand), and one recorded without a source (before sources were
// recorded, or by a caller that sets none) is taken to be source's:
// nothing tells otherwise.
func (c *Consumer) checkSource(fx idemkv.Effects, cur uint64, source string) error {
	if source == "" {
		return nil
	}
	v, err := fx.Get(c.sourceKey)
	switch {
	case errors.Is(err, idemkv.ErrNotFound):
	case err != nil:
		return err
	case string(v) == source:
		return nil
	default:
		if err := c.sourceChanged(cur, string(v), source); err != nil {
			return err
		}
	}
	return fx.Set(c.sourceKey, []byte(source))
}

// sourceChanged returns ErrSourceChanged if a message from source may not
// move position cur, recorded in source recorded ("": none).
func (c *Consumer) sourceChanged(cur uint64, recorded, source string) error {
	if source == "" || cur == 0 || recorded == "" || recorded == source {
		return nil
	}
	return fmt.Errorf("%w: %s: position %d is in %q, the message is from %q", ErrSourceChanged, c.name, cur, recorded, source)
}

// Results stored in the dedup marks.
const (
	statusApplied  = 200
	statusRejected = 422
	// maxReason bounds a stored rejection's reason, in bytes.
	maxReason = 1024
)

// Process settles msg: it applies it with h unless the event was settled
// before, and commits, in one atomic commit, h's writes, the event's
// dedup mark and the consumer's position (advanced to msg.Position if it
// is behind).
//
//   - A new event: h runs (once per commit attempt; see Handler), and its
//     writes commit with the mark and the position. Outcome is zero but
//     for Key.
//   - An event settled before: h does not run; Outcome.Duplicate (and
//     Rejected, with the reason, if it was rejected). If msg.Position is
//     ahead of the consumer's (a copy stored again further on in the
//     stream), the position is advanced in a commit of its own.
//   - h returns Reject(err): nothing h wrote commits; the rejection is
//     recorded as the event's outcome, with the position, and
//     Outcome.Rejected. A copy of it is a Duplicate, Rejected.
//   - h returns another error, or panics: nothing is written, and the
//     error is returned as it is (the panic raised again). Acknowledge
//     nothing: redeliver the message, and, if the consumer resumes from
//     Position, process nothing after it until it settles.
//
// Errors beside h's: those of the store (idemkv.ErrConflict if the data
// h read kept changing, idemkv.ErrInvalidArgument for a retention class
// the store lacks or writes past its bounds, idemkv.ErrClosed, an I/O
// error), ErrSourceChanged for a message from another source than the
// position's (see Message.Source), and once.ErrInProgress if another
// Process of the same event is running in this process; after any of
// them but an I/O error nothing was
// written, and the message may be processed again. After an I/O error
// the commit may have been made (a connection lost as it went out):
// processing the message again settles it, as a duplicate or anew.
func (c *Consumer) Process(ctx context.Context, msg Message, h Handler) (Outcome, error) {
	if h == nil {
		return Outcome{}, fmt.Errorf("%w: inbox: nil handler", idemkv.ErrInvalidArgument)
	}
	ev, err := identify(&msg)
	if err != nil {
		err = fmt.Errorf("inbox: %s: %w", c.name, err)
		c.logProcessed(ctx, &msg, "", Outcome{}, err, false)
		return Outcome{}, err
	}
	call := c.call(ev.key, ev.fp)
	call.WritesOnly = c.opts.WritesOnly && msg.Position == 0
	var hErr error // h's own error, told apart from the store's
	out, err := c.settle(ctx, call, &msg, func(ctx context.Context, x *once.Exec) (idemkv.Result, error) {
		// The position first: a message from another source is refused
		// before its handler runs.
		if err := c.advance(x.Effects, msg.Position, msg.Source); err != nil {
			return idemkv.Result{}, err
		}
		if hErr = h(ctx, x.Effects, msg); hErr != nil {
			return idemkv.Result{}, hErr
		}
		return idemkv.Result{Status: statusApplied}, nil
	})
	if errors.Is(err, ErrRejected) {
		// h's writes were dropped with the key's release; record the
		// rejection in a commit of its own. If another delivery settled
		// the event meanwhile, this answers as a duplicate.
		reason := clip(err.Error())
		hErr = nil
		out, err = c.settle(ctx, call, &msg, func(_ context.Context, x *once.Exec) (idemkv.Result, error) {
			return idemkv.Result{Status: statusRejected, Body: []byte(reason)}, c.advance(x.Effects, msg.Position, msg.Source)
		})
	}
	c.logProcessed(ctx, &msg, ev.key, out, err, hErr != nil && errors.Is(err, hErr))
	return out, err
}

// call is the once.Call of the dedup mark key.
func (c *Consumer) call(key string, fp []byte) once.Call {
	return once.Call{
		ID:          idemkv.ID{Tenant: Tenant, Endpoint: c.name, Key: key},
		Fingerprint: fp,
		Retention:   c.opts.Retention,
		// Two deliveries of one event at once: the second is told to
		// come back, rather than poll here.
		NoWait: true,
	}
}

// settle runs fn under call's key and says what happened. A key settled
// before (or used with another fingerprint) advances the position, if
// msg's is ahead of it, through catchUp.
func (c *Consumer) settle(ctx context.Context, call once.Call, msg *Message, fn once.Func) (Outcome, error) {
	out := Outcome{Key: call.ID.Key}
	res, err := once.Do(ctx, c.store, call, fn)
	switch {
	case errors.Is(err, once.ErrMismatch):
		out.Duplicate, out.Mismatch = true, true
	case err != nil:
		return Outcome{}, err
	default:
		out.Duplicate = res.Replayed
		if res.Result.Status == statusRejected {
			out.Rejected, out.Reason = true, string(res.Result.Body)
		}
	}
	if out.Duplicate {
		if err := c.catchUp(ctx, msg.Position, msg.Source); err != nil {
			return Outcome{}, err
		}
	}
	return out, nil
}

// positionFP is the fingerprint of every position mark: they carry no
// input beside their key.
var positionFP = []byte("inbox/position")

// catchUp advances the position to pos, for a copy of a settled event
// found further on in the stream. The commit is an operation of its own,
// under a mark keyed by pos, so that a redelivery after a crash takes the
// same one over. The mark is found again after the position was reset by
// hand (the position went back, and the commit it stands for is undone):
// the commit is then made under a mark never used before.
func (c *Consumer) catchUp(ctx context.Context, pos uint64, source string) error {
	if pos == 0 {
		return nil
	}
	cur, err := c.Position(ctx)
	if err != nil {
		return err
	}
	if cur >= pos {
		// Nothing to write, but a copy from another source is refused as
		// any message from it is.
		return c.sameSource(ctx, cur, source)
	}
	advance := func(_ context.Context, x *once.Exec) (idemkv.Result, error) {
		return idemkv.Result{Status: statusApplied}, c.advance(x.Effects, pos, source)
	}
	out, err := once.Do(ctx, c.store, c.call(positionMarkKey(pos, false), positionFP), advance)
	if err == nil && out.Replayed {
		if cur, err = c.Position(ctx); err == nil && cur < pos {
			_, err = once.Do(ctx, c.store, c.call(positionMarkKey(pos, true), positionFP), advance)
		}
	}
	if err != nil {
		return fmt.Errorf("inbox: %s: advancing the position past a duplicate to %d: %w", c.name, pos, err)
	}
	return nil
}
