package httpidem

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"log/slog"
	"math/rand/v2"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/redact"
)

// The structured records the middleware logs: one per state change of a
// key, one per failure, and Debug records for answers that change
// nothing. Each carries the request's tenant, endpoint, key_hash and
// request_id; docs/operations.md lists them for operators.

// HeaderRequestID is the request header whose value is logged as a
// request's request_id, so that its records can be found by the id a
// proxy or the client gave it.
const HeaderRequestID = "X-Request-Id"

// MaxRequestIDLen is the longest X-Request-Id logged as it came, in bytes.
const MaxRequestIDLen = 128

// Log messages of the state changes, stable so that alerts and searches
// can match them.
const (
	msgClaimed     = "httpidem: key claimed"
	msgTakenOver   = "httpidem: key taken over"
	msgStored      = "httpidem: outcome stored"
	msgReleased    = "httpidem: key released"
	msgUncertain   = "httpidem: key marked uncertain"
	msgLeaseLost   = "httpidem: lease lost"
	msgReplayed    = "httpidem: outcome replayed"
	msgMismatch    = "httpidem: key reused with a different request"
	msgInProgress  = "httpidem: key in progress"
	msgReconciling = "httpidem: key awaiting reconciliation"
)

// logEnabled reports whether the logger takes records at level: callers
// that would build attributes check it first, so that a request logged
// at a disabled level costs one call and no allocation.
func (p *protected) logEnabled(ctx context.Context, level slog.Level) bool {
	return p.m.log.Enabled(ctx, level)
}

// logEvent logs one record about q's key, with the attributes that
// identify it followed by attrs. The raw key goes in only when
// Options.LogRawKeys says so; bodies never do. The "err" and "note"
// attributes have the key taken out of them (the stores name it in
// their errors). ctx is the request's: a handler that knows tracing
// finds the span in it.
func (p *protected) logEvent(ctx context.Context, q *request, level slog.Level, msg string, attrs ...slog.Attr) {
	if !p.logEnabled(ctx, level) {
		return
	}
	var buf [12]slog.Attr
	all := append(buf[:0],
		slog.String("tenant", q.id.Tenant),
		slog.String("endpoint", q.id.Endpoint),
		slog.String("key_hash", q.keyHash()),
		slog.String("request_id", q.requestID()),
	)
	if p.m.rawKeys {
		all = append(all, slog.String("key", q.id.Key))
	}
	for _, a := range attrs {
		if (a.Key == "err" || a.Key == "note") && !p.m.rawKeys {
			a.Value = slog.StringValue(q.redact(a.Value.String()))
		}
		all = append(all, a)
	}
	p.m.log.LogAttrs(ctx, level, msg, all...)
}

// redact returns s with q's key replaced by its hash.
func (q *request) redact(s string) string {
	return redact.Key(s, q.id.Key, q.keyHash())
}

// logClaimed logs the acquisition of l: a first claim, or a takeover of
// an earlier attempt that outlived its lease.
func (p *protected) logClaimed(ctx context.Context, q *request, l idemkv.Lease) {
	if !p.logEnabled(ctx, slog.LevelInfo) {
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
	p.logEvent(ctx, q, slog.LevelInfo, msg, attrs...)
}

// disposition is the attribute naming what became of the request.
func disposition(q *request) slog.Attr {
	return slog.String("disposition", string(q.report.Disposition))
}

// keyHash returns q's idemkv.ID.Hash, computed once.
func (q *request) keyHash() string {
	if q.hash == "" && q.id.Key != "" {
		q.hash = q.id.Hash()
	}
	return q.hash
}

// requestID returns the id that ties q's records and span together,
// chosen once: the request's X-Request-Id if it is 1 to MaxRequestIDLen
// bytes of visible ASCII, or else 16 random hex digits. A value outside
// that (too long, or with spaces or control characters that could forge
// a line of a text log) is replaced, not cleaned: what is logged is
// either what came in or plainly not.
func (q *request) requestID() string {
	if q.rid == "" {
		q.rid = q.header.Get(HeaderRequestID)
		if !saneRequestID(q.rid) {
			var b [8]byte
			binary.BigEndian.PutUint64(b[:], rand.Uint64())
			q.rid = hex.EncodeToString(b[:])
		}
	}
	return q.rid
}

func saneRequestID(s string) bool {
	if s == "" || len(s) > MaxRequestIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c > '~' {
			return false
		}
	}
	return true
}
