package admin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/httpidem"
	"github.com/idemkv/idemkv/internal/redact"
	"github.com/idemkv/idemkv/saga"
)

// An operator's writes: settling a record by hand (Resolve) and evicting
// one (Evict). Each is a compare-and-set on the record's token and is
// kept in the audit log. "idemkv resolve|evict" run the same functions on
// a store no process holds, or call the API.

// ResolveRequest is the body of POST /admin/v1/resolve: what an operator
// learned of an uncertain, abandoned or escalated record.
type ResolveRequest struct {
	Tenant   string `json:"tenant"`
	Endpoint string `json:"endpoint"`
	Key      string `json:"key"`
	// Token, if not zero, must be the record's current token (as inspect
	// or list showed it); zero settles whatever attempt holds it now.
	Token uint64 `json:"token,omitempty"`
	// NoEffect: the operation provably did not happen; the record goes
	// and a retry runs anew. Otherwise it happened, and Status (default
	// 200), Pointer and Body are stored as its outcome.
	NoEffect bool   `json:"no_effect,omitempty"`
	Status   int    `json:"status,omitempty"`
	Pointer  string `json:"pointer,omitempty"`
	Body     []byte `json:"body,omitempty"`
	// ContentType is the body's, replayed with it (default
	// application/json).
	ContentType string `json:"content_type,omitempty"`
	// Raw stores Status, Pointer and Body as they are rather than as an
	// HTTP response: for records no HTTP route wrote (a saga step's,
	// whose output is the body).
	Raw bool `json:"raw,omitempty"`
	// Verify asks the reconciler first (ResolveOptions.Reconciler): the
	// resolution is made only if the downstream agrees with it, and an
	// applied one then stores the downstream's answer (the real charge)
	// instead of Status, Pointer and Body. A record the downstream says
	// happened is never released this way.
	Verify bool `json:"verify,omitempty"`
	// Since, if set, is the moment the record was judged from, as it was
	// shown (Record.LeaseExpires of an abandoned record, Marked of an
	// uncertain one): a record whose attempt renewed it or marked it
	// later is refused (idemkv.ErrFenced), for its call may have gone out
	// after the operator looked. Resolve always refuses one that moved
	// after its own read.
	Since time.Time `json:"since,omitzero"`
	// Note says who settles the record and why (required).
	Note string `json:"note"`
}

// ID is the record the request names.
func (req *ResolveRequest) ID() idemkv.ID {
	return idemkv.ID{Tenant: req.Tenant, Endpoint: req.Endpoint, Key: req.Key}
}

// Validate reports what is wrong with req, if anything; it sets the
// default status of an applied outcome. Its errors wrap
// idemkv.ErrInvalidArgument (or the ID's).
func (req *ResolveRequest) Validate() error {
	if req.Status == 0 && !req.NoEffect {
		req.Status = http.StatusOK
	}
	if err := req.ID().Validate(); err != nil {
		return err
	}
	switch {
	case req.NoEffect && (req.Status != 0 || req.Pointer != "" || req.Body != nil || req.Raw):
		return fmt.Errorf("%w: status, pointer, body and raw go with an applied outcome, not no_effect", idemkv.ErrInvalidArgument)
	case !req.NoEffect && (req.Status < 100 || req.Status > 599):
		return fmt.Errorf("%w: status %d is not an HTTP status", idemkv.ErrInvalidArgument, req.Status)
	}
	return validateNote("note", req.Note)
}

// EvictRequest is the body of POST /admin/v1/evict.
type EvictRequest struct {
	Tenant   string `json:"tenant"`
	Endpoint string `json:"endpoint"`
	Key      string `json:"key"`
	// Token, if not zero, must be the record's current token.
	Token uint64 `json:"token,omitempty"`
	// Since, if set, refuses a record that moved after it, as
	// ResolveRequest.Since, or that has completed since: it is the
	// moment an unsettled record was judged (idemkv.EvictRequest.Since).
	Since time.Time `json:"since,omitzero"`
	// Reason says who evicts the record and why (required); it goes to
	// the audit log.
	Reason string `json:"reason"`
}

// ID is the record the request names.
func (req *EvictRequest) ID() idemkv.ID {
	return idemkv.ID{Tenant: req.Tenant, Endpoint: req.Endpoint, Key: req.Key}
}

// Validate reports what is wrong with req, if anything.
func (req *EvictRequest) Validate() error {
	if err := req.ID().Validate(); err != nil {
		return err
	}
	return validateNote("reason", req.Reason)
}

func validateNote(name, s string) error {
	switch {
	case strings.TrimSpace(s) == "":
		return fmt.Errorf("%w: %s is required: say who does it and why", idemkv.ErrInvalidArgument, name)
	case len(s) > idemkv.MaxNoteLen:
		return fmt.Errorf("%w: %s is %d bytes, limit %d", idemkv.ErrInvalidArgument, name, len(s), idemkv.MaxNoteLen)
	}
	return nil
}

// ErrNoAudit is returned by Resolve and Evict without an audit log: an
// operator's write is never made unrecorded.
var ErrNoAudit = errors.New("admin: no audit log to record the change in")

// Resolve settles req's record in store, recorded in audit, which must
// not be nil (see audited), through the application o connects it to
// (nil: the record alone; see ResolveOptions). It returns the entry of
// the change. Besides the store's errors and the audit log's, it returns
// ErrNoReconciler, ErrDownstreamDisagrees, ErrDownstreamUnknown and
// ErrServiceRefused (a *PanicError among them): each a refusal that
// wrote nothing.
func Resolve(ctx context.Context, store idemkv.Store, audit *AuditLog, req ResolveRequest, o *ResolveOptions) (AuditEntry, error) {
	if err := req.Validate(); err != nil {
		return AuditEntry{}, err
	}
	o = o.orDefault()
	switch {
	case audit == nil:
		return AuditEntry{}, ErrNoAudit
	case req.Verify && o.Reconciler == nil:
		return AuditEntry{}, ErrNoReconciler
	}
	rec, err := store.Get(ctx, req.ID())
	if err != nil {
		return AuditEntry{}, err
	}
	if err := unmoved(&rec, req.Token, req.Since); err != nil {
		return AuditEntry{}, err
	}
	if !req.NoEffect && !req.Raw && !req.Verify && strings.HasPrefix(rec.ID.Endpoint, saga.EndpointPrefix) {
		return AuditEntry{}, fmt.Errorf("%w: a saga's record holds its output, not an HTTP response: resolve it raw, with the output as the body, or verified", idemkv.ErrInvalidArgument)
	}
	// The store refuses the resolution if the attempt moves after the
	// record was read here (or shown to the operator).
	sr := idemkv.ResolveRequest{ID: req.ID(), Token: rec.Token, NoEffect: req.NoEffect, Note: req.Note,
		Since: judgedSince(&rec, req.Since)}
	outcome := "removed: the operation did not happen, a retry runs anew"
	if !req.NoEffect {
		outcome = fmt.Sprintf("completed with status %d", req.Status)
		if req.Raw {
			sr.Result = idemkv.Result{Status: req.Status, Pointer: req.Pointer, Body: req.Body}
		} else {
			var h http.Header
			if req.Body != nil {
				h = http.Header{"Content-Type": {cmp.Or(req.ContentType, "application/json")}}
			}
			sr.Result = httpidem.Outcome(req.Status, req.Pointer, h, req.Body)
		}
	}
	if req.Verify {
		outcome = "completed with the downstream's answer, if it says the operation happened"
		if req.NoEffect {
			outcome = "removed, if the downstream says the operation did not happen"
		}
	}
	entry := newAuditEntry(store, "resolve", &rec, outcome, req.Note)
	entry.Verified = req.Verify
	return audited(audit, entry, func(entry *AuditEntry) error {
		if err := o.settlement(ctx, &rec, &req, &sr, entry); err != nil {
			return err
		}
		return store.Resolve(ctx, sr)
	})
}

// Evict removes req's record from store, which must be an
// idemkv.Evicter, recorded in audit, which must not be nil (see
// audited). The record is read first, for the audit entry, and evicted
// only if its token is still the one read. It returns the entry of the
// change.
func Evict(ctx context.Context, store idemkv.Store, audit *AuditLog, req EvictRequest) (AuditEntry, error) {
	if err := req.Validate(); err != nil {
		return AuditEntry{}, err
	}
	ev, ok := store.(idemkv.Evicter)
	switch {
	case !ok:
		return AuditEntry{}, fmt.Errorf("%w: this store cannot evict records", idemkv.ErrInvalidArgument)
	case audit == nil:
		return AuditEntry{}, ErrNoAudit
	}
	rec, err := store.Get(ctx, req.ID())
	if err != nil {
		return AuditEntry{}, err
	}
	if err := unmoved(&rec, req.Token, req.Since); err != nil {
		return AuditEntry{}, err
	}
	if !req.Since.IsZero() && rec.State == idemkv.StateCompleted {
		return AuditEntry{}, fmt.Errorf("%w: the record has completed since it was judged unsettled", idemkv.ErrFenced)
	}
	entry := newAuditEntry(store, "evict", &rec, "removed: the next request with its key runs anew", req.Reason)
	return audited(audit, entry, func(*AuditEntry) error {
		_, err := ev.Evict(ctx, idemkv.EvictRequest{ID: req.ID(), Token: rec.Token, Since: judgedSince(&rec, req.Since)})
		return err
	})
}

// judgedSince is the Since a change made from rec, as read now, passes to
// the store: the last call rec shows, which unmoved has checked is no
// later than since (the moment the operator judged from); since itself
// only for a record that shows none. A later since would let the store
// accept an attempt that moved after this read.
func judgedSince(rec *idemkv.Record, since time.Time) time.Time {
	return cmp.Or(rec.LastCall(), since)
}

// unmoved checks that rec, as read now, is the attempt the operator
// judged: under token (if not zero), and not renewed or marked after
// since (if set).
func unmoved(rec *idemkv.Record, token uint64, since time.Time) error {
	switch {
	case token != 0 && rec.Token != token:
		return fmt.Errorf("%w: the record's token is %d, not %d: it changed since it was read", idemkv.ErrFenced, rec.Token, token)
	case !since.IsZero() && rec.MovedSince(since):
		return fmt.Errorf("%w: the record's attempt renewed or marked it after %s, when it was read: its call may have gone out since",
			idemkv.ErrFenced, since.UTC().Format(time.RFC3339Nano))
	}
	return nil
}

// audited makes change between two synced entries of audit: entry as
// begun before it, so that no change is ever made unrecorded (if that
// entry cannot be written, nothing is changed), and entry as done, or
// as failed with the error that refused it, after it; change may add to
// entry what it learned on the way (what the downstream answered). A
// begun entry without its end is a change a crash interrupted: it may or
// may not have been made. It returns the done entry, and ErrAudit if the
// change was made but that entry could not be written.
func audited(audit *AuditLog, entry AuditEntry, change func(*AuditEntry) error) (AuditEntry, error) {
	audit.changes.RLock()
	defer audit.changes.RUnlock()
	entry.Phase = PhaseBegun
	if err := audit.record(entry); err != nil {
		return AuditEntry{}, errors.Join(ErrAuditUnavailable, err)
	}
	if err := change(&entry); err != nil {
		failed := entry
		failed.Phase, failed.Outcome = PhaseFailed, "not done: "+err.Error()
		_ = audit.record(failed) // the begun entry stands if this one fails
		return AuditEntry{}, err
	}
	entry.Phase = PhaseDone
	if err := audit.record(entry); err != nil {
		return entry, errors.Join(ErrAudit, err)
	}
	return entry, nil
}

// resolve answers POST /admin/v1/resolve with the audit entry.
func (a *api) resolve(w http.ResponseWriter, r *http.Request) {
	if a.o.Audit == nil {
		writeProblem(w, http.StatusNotFound, ProblemNotFound, "resolve needs an audit log (serve --admin-audit-log)")
		return
	}
	var req ResolveRequest
	if !decodeWithin(w, r, &req, maxResolveBody) {
		return
	}
	entry, err := Resolve(r.Context(), a.store, a.o.Audit, req,
		&ResolveOptions{Settler: a.o.Settler, Reconciler: a.o.Reconciler, Timeout: a.o.ResolveTimeout})
	a.logPanic(req.ID(), err)
	a.answerWrite(w, r, entry, err)
}

// logPanic logs err if it is a panic of the service's caught settling
// id (PanicError), without the key.
func (a *api) logPanic(id idemkv.ID, err error) {
	if pe := (*PanicError)(nil); errors.As(err, &pe) {
		a.o.Logger.Error("admin: the service panicked settling a record; nothing was changed", "tenant", id.Tenant,
			"endpoint", id.Endpoint, "key_hash", id.Hash(), "in", pe.In, "panic", redact.Key(fmt.Sprint(pe.Value), id.Key, id.Hash()))
	}
}

// evict answers POST /admin/v1/evict with the audit entry.
func (a *api) evict(w http.ResponseWriter, r *http.Request) {
	switch _, ok := a.store.(idemkv.Evicter); {
	case !ok:
		writeProblem(w, http.StatusNotFound, ProblemNotFound, "this store cannot evict records")
		return
	case a.o.Audit == nil:
		writeProblem(w, http.StatusNotFound, ProblemNotFound, "evict needs an audit log (serve --admin-audit-log)")
		return
	}
	var req EvictRequest
	if !decode(w, r, &req) {
		return
	}
	entry, err := Evict(r.Context(), a.store, a.o.Audit, req)
	a.answerWrite(w, r, entry, err)
}

// answerWrite answers an operator's write: its audit entry, or why not
// (problemFor).
func (a *api) answerWrite(w http.ResponseWriter, r *http.Request, entry AuditEntry, err error) {
	if err != nil {
		if errors.Is(err, ErrAudit) || errors.Is(err, ErrAuditUnavailable) {
			a.o.Logger.Error("admin: audit log failed", "path", r.URL.Path, "err", err)
			p := problemFor(err)
			writeProblem(w, p.status, p.kind, p.detail)
			return
		}
		a.writeError(w, r, err)
		return
	}
	a.logWrite(entry)
	writeJSON(w, http.StatusOK, entry)
}

// logWrite logs an operator's write that was made.
func (a *api) logWrite(entry AuditEntry) {
	id := idemkv.ID{Tenant: entry.Tenant, Endpoint: entry.Endpoint, Key: entry.Key}
	a.o.Logger.Info("admin: "+entry.Action, "tenant", entry.Tenant, "endpoint", entry.Endpoint, "key_hash", id.Hash(),
		"was", entry.Was, "token", entry.Token)
}
