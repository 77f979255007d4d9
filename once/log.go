package once

import (
	"context"
	"log/slog"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/redact"
)

// The structured records Do logs to Call.Logger: one per state change of
// the key, one per failure, and Debug records for answers that change
// nothing. They follow the HTTP middleware's (package httpidem): the same
// messages with "once: " for "httpidem: ", the same attributes (tenant,
// endpoint, key_hash, token, attempt, mode, operation_id), the same
// levels. docs/operations.md lists them for operators.

// Log messages, stable so that alerts and searches can match them.
const (
	msgClaimed     = "once: key claimed"
	msgTakenOver   = "once: key taken over"
	msgStored      = "once: outcome stored"
	msgReleased    = "once: key released"
	msgUncertain   = "once: key marked uncertain"
	msgLeaseLost   = "once: lease lost"
	msgReplayed    = "once: outcome replayed"
	msgMismatch    = "once: key reused with a different fingerprint"
	msgInProgress  = "once: key in progress"
	msgReconciling = "once: key awaiting reconciliation"
	msgClaimFailed = "once: claim failed"
	msgStoreFailed = "once: storing the outcome failed"
	msgGiveUpFail  = "once: could not give up the key; its lease bounds the wait"
)

// callLog logs the records of one Do. The zero value (no Logger) logs
// nothing and costs one nil check a record.
type callLog struct {
	l    *slog.Logger
	id   idemkv.ID
	raw  bool   // Call.LogRawKeys
	hash string // id.Hash(), computed at the first record
}

func newCallLog(c *Call) *callLog {
	return &callLog{l: c.Logger, id: c.ID, raw: c.LogRawKeys}
}

// enabled reports whether a record at level would be kept: callers that
// build attributes check it first, so that a disabled level costs no
// allocation.
func (g *callLog) enabled(ctx context.Context, level slog.Level) bool {
	return g != nil && g.l != nil && g.l.Enabled(ctx, level)
}

// log logs one record about the key: tenant, endpoint and key_hash, then
// attrs. The raw key goes in only with Call.LogRawKeys; the "err" and
// "note" attributes have the key taken out of them unless it does (the
// errors of Do, and some of the stores', quote it).
func (g *callLog) log(ctx context.Context, level slog.Level, msg string, attrs ...slog.Attr) {
	if !g.enabled(ctx, level) {
		return
	}
	if g.hash == "" {
		g.hash = g.id.Hash()
	}
	all := make([]slog.Attr, 0, 4+len(attrs))
	all = append(all,
		slog.String("tenant", g.id.Tenant),
		slog.String("endpoint", g.id.Endpoint),
		slog.String("key_hash", g.hash),
	)
	if g.raw {
		all = append(all, slog.String("key", g.id.Key))
	}
	for _, a := range attrs {
		if (a.Key == "err" || a.Key == "note") && !g.raw {
			a.Value = slog.StringValue(redact.Key(a.Value.String(), g.id.Key, g.hash))
		}
		all = append(all, a)
	}
	g.l.LogAttrs(ctx, level, msg, all...)
}

// claimed logs the acquisition of l: a first claim, or a takeover of an
// attempt that outlived its lease.
func (g *callLog) claimed(ctx context.Context, l idemkv.Lease) {
	if !g.enabled(ctx, slog.LevelInfo) {
		return
	}
	msg := msgClaimed
	if l.Takeover() {
		msg = msgTakenOver
	}
	attrs := []slog.Attr{
		slog.Uint64("attempt", uint64(l.Attempt)),
		slog.Uint64("token", l.Token),
		slog.String("mode", l.Mode.String()),
	}
	if !l.OperationID.IsZero() {
		attrs = append(attrs, slog.String("operation_id", l.OperationID.String()))
	}
	g.log(ctx, slog.LevelInfo, msg, attrs...)
}

// token is the attribute naming the lease a record is about.
func token(l idemkv.Lease) slog.Attr { return slog.Uint64("token", l.Token) }

// errAttr is the attribute of an error; its text is redacted by log.
func errAttr(err error) slog.Attr { return slog.Any("err", err) }
