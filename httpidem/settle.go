package httpidem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/idemkv/idemkv"
)

// How a protected request ends: its outcome stored, released or marked
// uncertain, or the key given up after a panic or a failed commit.

// settle commits the outcome of the response in c: stored, released or
// uncertain. What the handler declared decides first (Op.Uncertain, then
// Op.Release and Op.Invalid), then the status: a validation failure
// (Route.ValidationFailure) is released, a final one (Route.Storable)
// stored, any other released in a local route and marked uncertain in a
// remote one. The heartbeat is stopped before settle is called. final
// says the handler has returned and the whole body is in the buffer;
// otherwise the response is about to stream and its body is not stored.
func (p *protected) settle(ctx context.Context, q *request, op *Op, c *capture, final bool) error {
	d := op.settle()
	status := c.status
	if status == 0 {
		status = http.StatusOK
		c.status = status
	}
	store := p.m.store
	invalid := !d.uncertain && (d.invalid || p.route.ValidationFailure(status))
	switch {
	case d.uncertain:
		q.report.Disposition = Uncertain
		note := idemkv.Note(d.note)
		err := store.MarkUncertain(ctx, op.lease, note)
		if err == nil {
			p.logEvent(ctx, q, slog.LevelInfo, msgUncertain, disposition(q), slog.Int("status", status), slog.String("note", note))
		}
		return err
	case d.released || invalid || (!p.route.Storable(status) && op.lease.Mode != idemkv.ModeRemote):
		// A validation failure is released in a remote route too: the
		// handler refused the input before it called anything.
		q.report.Disposition = Released
		err := store.Release(ctx, op.lease, op.compensate())
		if err == nil {
			attrs := []slog.Attr{disposition(q), slog.Int("status", status)}
			if invalid {
				attrs = append(attrs, slog.Bool("invalid", true))
			}
			p.logEvent(ctx, q, slog.LevelInfo, msgReleased, attrs...)
		}
		return err
	case !p.route.Storable(status):
		// A remote route's 5xx proves nothing about the downstream: only
		// the handler can say it had no effect (Op.Release).
		q.report.Disposition = Uncertain
		note := fmt.Sprintf("status %d without Op.Release: the downstream may have acted", status)
		err := store.MarkUncertain(ctx, op.lease, note)
		if err == nil {
			p.logEvent(ctx, q, slog.LevelInfo, msgUncertain, disposition(q), slog.Int("status", status), slog.String("note", note))
		}
		return err
	}
	q.report.Disposition = Stored
	pointer := d.pointer
	if pointer == "" {
		pointer = c.header.Get("Location")
	}
	if len(pointer) > idemkv.MaxPointerLen {
		p.logEvent(ctx, q, slog.LevelWarn, "httpidem: pointer too long to store; dropped", slog.Int("bytes", len(pointer)))
		pointer = ""
	}
	env := envelope{header: replayableHeaders(c.header, p.route.ReplayHeaders), diag: q.diag}
	if final && (!p.route.PointerOnly || pointer == "") {
		env.haveBody, env.body = true, c.buf.Bytes()
	}
	var apply func(idemkv.Effects) error
	var applyErr error
	if len(op.applies) > 0 {
		apply = func(fx idemkv.Effects) error {
			applyErr = op.apply(fx)
			return applyErr
		}
	}
	res := idemkv.Result{Status: status, Pointer: pointer, Body: env.encode(pointer)}
	err := store.Complete(ctx, op.lease, res, apply)
	for errors.Is(err, idemkv.ErrInvalidResult) {
		// The store bounds what it keeps more tightly than this package
		// does (MaxStoredBody; a request with many members has long
		// diagnostics; a header may echo the client): keep the outcome
		// with less rather than store none, and run the handler again on
		// every retry.
		dropped := env.shrink()
		if dropped == "" {
			break
		}
		p.logEvent(ctx, q, slog.LevelWarn, "httpidem: response refused by the store; stored without its "+dropped, slog.Any("err", err))
		res.Body = env.encode(pointer)
		err = store.Complete(ctx, op.lease, res, apply)
	}
	if err != nil && applyErr != nil {
		// Apply failed: nothing was written and the lease is still ours.
		p.abandon(ctx, q, op, "storing the outcome failed: "+err.Error())
	}
	if err == nil {
		p.logEvent(ctx, q, slog.LevelInfo, msgStored, disposition(q), slog.Int("status", status))
	}
	return err
}

// abandon gives up a held key after a panic or a failed commit: a local
// operation's effects were not committed, so its key is released; a
// remote one may have reached the downstream, so its key becomes
// uncertain.
func (p *protected) abandon(ctx context.Context, q *request, op *Op, why string) {
	op.settle()
	var err error
	msg, why := msgReleased, idemkv.Note(why)
	if op.lease.Mode == idemkv.ModeRemote {
		msg = msgUncertain
		err = p.m.store.MarkUncertain(ctx, op.lease, why)
	} else {
		err = p.m.store.Release(ctx, op.lease, nil)
	}
	if err != nil {
		p.logEvent(ctx, q, slog.LevelError, "httpidem: could not give up the key; its lease bounds the wait", slog.Any("err", err))
		return
	}
	p.logEvent(ctx, q, slog.LevelInfo, msg, slog.String("note", why))
}

func (p *protected) settleFailed(ctx context.Context, w http.ResponseWriter, q *request, err error) {
	q.report.Err = err
	if errors.Is(err, idemkv.ErrFenced) {
		q.report.Disposition = LeaseLost
		p.logEvent(ctx, q, slog.LevelWarn, msgLeaseLost, disposition(q), slog.Any("err", err))
		p.problem(w, q, ProblemLeaseLost, http.StatusConflict,
			"the request outlived its lease and another attempt took the key over; retry with the same key to get the outcome", time.Second)
		return
	}
	q.report.Disposition = StoreError
	p.logEvent(ctx, q, slog.LevelError, "httpidem: storing the outcome failed", disposition(q), slog.Any("err", err))
	p.problem(w, q, ProblemStoreUnavailable, http.StatusServiceUnavailable,
		"the outcome could not be stored; retry with the same key", StoreRetryAfter)
}

func (p *protected) storeFailed(w http.ResponseWriter, r *http.Request, q *request, err error) {
	if r.Context().Err() != nil {
		q.report.Disposition = Rejected // the client left before its claim
		return
	}
	q.report.Err = err
	for _, bad := range []error{idemkv.ErrInvalidScope, idemkv.ErrInvalidKey, idemkv.ErrInvalidFingerprint, idemkv.ErrInvalidArgument} {
		if errors.Is(err, bad) {
			p.reject(w, q, ProblemInvalidKey, http.StatusBadRequest, err.Error())
			return
		}
	}
	p.logEvent(r.Context(), q, slog.LevelError, "httpidem: claim failed", slog.Any("err", err), slog.Bool("fail_open", p.route.FailOpen))
	if p.route.FailOpen {
		q.report.Disposition = Unprotected
		p.next.ServeHTTP(w, r)
		return
	}
	q.report.Disposition = StoreError
	p.problem(w, q, ProblemStoreUnavailable, http.StatusServiceUnavailable,
		"the idempotency store is unavailable; the request was not run", StoreRetryAfter)
}
