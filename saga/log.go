package saga

import (
	"context"
	"errors"
	"log/slog"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/redact"
)

// The structured records a Runner logs to Options.Logger: one per state
// change of a saga, one per failure. They name the saga as the HTTP
// middleware and the reconciler name a key: tenant, endpoint (the saga
// record's, "saga/NAME"), key_hash (idemkv.ID.Hash of the saga record)
// and the runner's token; a step by its name. Inputs and outputs are
// never logged. docs/operations.md lists them for operators.

// Log messages, stable so that alerts and searches can match them.
const (
	msgStarted      = "saga: started"
	msgTakenOver    = "saga: taken over"
	msgWoken        = "saga: woken; its step was settled"
	msgStepDone     = "saga: step done"
	msgStepUndone   = "saga: step undone"
	msgStepRetrying = "saga: step failed; retrying"
	msgStepUnknown  = "saga: step outcome unknown; waiting for reconciliation"
	msgCompensating = "saga: compensating"
	msgCompensated  = "saga: compensated"
	msgCompleted    = "saga: completed"
	msgEscalated    = "saga: escalated; it waits for an operator"
	msgLeaseLost    = "saga: lease lost"
	msgStoreFailed  = "saga: store error"
	msgPanicked     = "saga: step panicked; left for a later pass"
)

// log logs one record about the saga id of tenant (token: the runner's
// lease of it, 0 if none): its names, then attrs. The raw id goes in only
// with Options.LogRawKeys; the "err", "note", "failure" and "panic"
// attributes have it taken out unless it does (errors, the stores' and this
// package's, may quote it).
func (r *Runner) log(ctx context.Context, level slog.Level, msg, tenant, id string, token uint64, attrs ...slog.Attr) {
	if r.o.Logger == nil || !r.o.Logger.Enabled(ctx, level) {
		return
	}
	sid := r.id(tenant, id, "")
	hash := sid.Hash()
	all := make([]slog.Attr, 0, 5+len(attrs))
	all = append(all,
		slog.String("tenant", sid.Tenant),
		slog.String("endpoint", sid.Endpoint),
		slog.String("key_hash", hash),
	)
	if r.o.LogRawKeys {
		all = append(all, slog.String("key", id))
	}
	if token != 0 {
		all = append(all, slog.Uint64("token", token))
	}
	for _, a := range attrs {
		if (a.Key == "err" || a.Key == "note" || a.Key == "failure" || a.Key == "panic") && !r.o.LogRawKeys {
			a.Value = slog.StringValue(redact.Key(a.Value.String(), id, hash))
		}
		all = append(all, a)
	}
	r.o.Logger.LogAttrs(ctx, level, msg, all...)
}

// log logs one record about d's saga.
func (d *driver) log(ctx context.Context, level slog.Level, msg string, attrs ...slog.Attr) {
	d.r.log(ctx, level, msg, d.tenant, d.id, d.saga.Token, attrs...)
}

// storeErr logs a store's error on the way out: a lost lease (another
// runner has the saga or the action) at Warn, anything else at Error.
// It returns err.
func (d *driver) storeErr(ctx context.Context, err error, attrs ...slog.Attr) error {
	if err == nil {
		return nil
	}
	level, msg := slog.LevelError, msgStoreFailed
	if errors.Is(err, idemkv.ErrFenced) {
		level, msg = slog.LevelWarn, msgLeaseLost
	}
	d.log(ctx, level, msg, append(attrs, slog.Any("err", err))...)
	return err
}

// stepAttrs names an action: its step and its kind, "do" or "undo".
func stepAttrs(kind string, s Step) []slog.Attr {
	return []slog.Attr{slog.String("step", s.Name), slog.String("action", kind)}
}
