package reconcile

import (
	"context"
	"log/slog"
	"strings"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/redact"
)

// Log messages, stable so that alerts and searches can match them.
const (
	msgResolved  = "reconcile: resolved"
	msgUnknown   = "reconcile: outcome unknown; asking again later"
	msgEscalated = "reconcile: escalated; it waits for an operator"
	msgLost      = "reconcile: settled by another"
	msgStore     = "reconcile: store error; retrying at a later pass"
	msgPanicked  = "reconcile: the application's code panicked"
)

// log logs one record about rec (nil: about no record in particular) to
// Options.Logger, or as a line of text to Options.Logf. rec is named by
// its tenant, endpoint, key hash and token; the "err", "note", "reason"
// and "panic" attributes have its key taken out, since the stores name
// the key in their errors (and a panic's value may quote it).
func (w *Worker) log(ctx context.Context, level slog.Level, msg string, rec *idemkv.Record, attrs ...slog.Attr) {
	switch {
	case w.o.Logger != nil && !w.o.Logger.Enabled(ctx, level), w.o.Logger == nil && w.o.Logf == nil:
		return
	}
	var all []slog.Attr
	if rec != nil {
		hash := rec.ID.Hash()
		all = append(all,
			slog.String("tenant", rec.ID.Tenant),
			slog.String("endpoint", rec.ID.Endpoint),
			slog.String("key_hash", hash),
			slog.Uint64("token", rec.Token),
		)
		for i, a := range attrs {
			if a.Key == "err" || a.Key == "note" || a.Key == "reason" || a.Key == "panic" {
				attrs[i].Value = slog.StringValue(redact.Key(a.Value.String(), rec.ID.Key, hash))
			}
		}
	}
	all = append(all, attrs...)
	if w.o.Logger != nil {
		w.o.Logger.LogAttrs(ctx, level, msg, all...)
		return
	}
	var b strings.Builder
	b.WriteString(msg)
	for _, a := range all {
		b.WriteByte(' ')
		b.WriteString(a.String())
	}
	w.o.Logf("%s", b.String())
}
