package admin

import (
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/httpidem"
)

// Problem types of the admin API, appended to httpidem.ProblemBase
// (docs/http.md describes each).
const (
	ProblemInvalidRequest = "admin-invalid-request" // 400, 405, 413: a malformed parameter or body, another method
	ProblemNotFound       = "admin-not-found"       // 404: no such record, endpoint or capability
	ProblemConflict       = "admin-conflict"        // 409: the record is not in a state the call takes, or the backup's dir exists
	ProblemUnavailable    = "admin-unavailable"     // 503: the store is closed or failed
	ProblemInternal       = "admin-internal"        // 500
	ProblemThrottled      = "admin-throttled"       // 429: too many wrong tokens from the client's address

	// Refusals of a resolve through the application (ResolveOptions);
	// each wrote nothing.
	ProblemDownstreamDisagrees = "admin-downstream-disagrees" // 409: a verified resolve the downstream contradicts
	ProblemDownstreamUnknown   = "admin-downstream-unknown"   // 502: a verified resolve the downstream could not answer
	ProblemServiceRefused      = "admin-service-refused"      // 409: the service's Settler refused the resolution, or its writes failed
)

// writeError answers a store's error, or an operator's write's, as
// problemFor says.
func (a *api) writeError(w http.ResponseWriter, r *http.Request, err error) {
	p := problemFor(err)
	if p.log {
		a.o.Logger.Error("admin call failed", "path", r.URL.Path, "err", err)
	}
	writeProblem(w, p.status, p.kind, p.detail)
}

// problem is what the API answers to an error (and the console shows).
type problem struct {
	status       int
	kind, detail string
	log          bool // the error is the service's or the store's: log it
}

// problemFor maps an error to its answer: the contract's errors and an
// operator's write's by what they mean, anything else as a 500 whose
// detail is generic (the log has it). A change made without its audit
// entry is a 500 that says it was made, so that the operator does not
// retry it.
func problemFor(err error) problem {
	switch {
	case errors.Is(err, ErrAudit):
		return problem{http.StatusInternalServerError, ProblemInternal, ErrAudit.Error(), true}
	case errors.Is(err, ErrAuditUnavailable):
		return problem{http.StatusServiceUnavailable, ProblemUnavailable, ErrAuditUnavailable.Error(), true}
	case errors.Is(err, idemkv.ErrConflict):
		return problem{http.StatusConflict, ProblemConflict, err.Error(), false}
	case errors.Is(err, ErrNoReconciler):
		return problem{http.StatusNotFound, ProblemNotFound, err.Error() + ": resolve without verify, on your own word", false}
	case errors.Is(err, idemkv.ErrClosed), errors.Is(err, idemkv.ErrFailed):
		// The store, not the application, failed, whatever wraps it.
		return problem{http.StatusServiceUnavailable, ProblemUnavailable, "the store is not serving", true}
	case errors.As(err, new(*PanicError)): // a bug in the application, logged where it was caught
		return problem{http.StatusInternalServerError, ProblemInternal,
			"the service panicked settling the record; nothing was changed (its log has the panic)", false}
	case errors.Is(err, ErrDownstreamDisagrees):
		return problem{http.StatusConflict, ProblemDownstreamDisagrees, err.Error(), false}
	case errors.Is(err, ErrDownstreamUnknown):
		return problem{http.StatusBadGateway, ProblemDownstreamUnknown, err.Error(), false}
	case errors.Is(err, ErrServiceRefused):
		return problem{http.StatusConflict, ProblemServiceRefused, err.Error(), false}
	case errors.Is(err, idemkv.ErrNotFound):
		return problem{http.StatusNotFound, ProblemNotFound, "no such record", false}
	case errors.Is(err, idemkv.ErrInvalidKey), errors.Is(err, idemkv.ErrInvalidScope),
		errors.Is(err, idemkv.ErrInvalidArgument), errors.Is(err, idemkv.ErrInvalidResult):
		return problem{http.StatusBadRequest, ProblemInvalidRequest, err.Error(), false}
	case errors.Is(err, os.ErrExist):
		return problem{http.StatusConflict, ProblemConflict, "the backup's directory exists", false}
	case errors.Is(err, idemkv.ErrWrongState), errors.Is(err, idemkv.ErrFenced):
		return problem{http.StatusConflict, ProblemConflict, err.Error(), false}
	}
	return problem{http.StatusInternalServerError, ProblemInternal, "the store failed the call", true}
}

func writeProblem(w http.ResponseWriter, status int, kind, detail string) {
	httpidem.WriteProblem(w, kind, status, detail, 0)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		writeProblem(w, http.StatusInternalServerError, ProblemInternal, "encoding the answer failed")
		return
	}
	body = append(body, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// RecordView is a record as the admin API shows it (and "idemkv inspect"
// prints it): its response body only as a size.
type RecordView struct {
	Tenant   string `json:"tenant"`
	Endpoint string `json:"endpoint"`
	Key      string `json:"key"`
	// KeyHash names the record in the service's logs (idemkv.ID.Hash).
	KeyHash      string     `json:"key_hash"`
	State        string     `json:"state"`
	Escalated    bool       `json:"escalated,omitempty"`
	Mode         string     `json:"mode"`
	Token        uint64     `json:"token"`
	Attempt      uint32     `json:"attempt"`
	OperationID  string     `json:"operation_id,omitempty"`
	Created      time.Time  `json:"created"`
	LeaseExpires *time.Time `json:"lease_expires,omitempty"`
	// Marked is when an uncertain record was marked so, if its store
	// keeps it: with LeaseExpires, the moment a resolution is judged from
	// (ResolveRequest.Since).
	Marked    *time.Time `json:"marked,omitempty"`
	Expires   time.Time  `json:"expires"`
	Class     string     `json:"class,omitempty"`
	Status    int        `json:"status,omitempty"`
	Pointer   string     `json:"pointer,omitempty"`
	BodyBytes int        `json:"body_bytes,omitempty"`
	Effects   int        `json:"effects,omitempty"`
	Note      string     `json:"note,omitempty"`
	// History is what operators did to the key, from the audit log
	// (GET /admin/v1/record only).
	History []AuditEntry `json:"history,omitempty"`
}

type listView struct {
	Records []RecordView `json:"records"`
	Next    string       `json:"next,omitempty"`
}

func listViewOf(recs []idemkv.Record, next string) listView {
	out := listView{Records: make([]RecordView, len(recs)), Next: next}
	for i := range recs {
		out.Records[i] = ViewOf(&recs[i])
	}
	return out
}

// ViewOf returns r's view.
func ViewOf(r *idemkv.Record) RecordView {
	v := RecordView{Tenant: r.ID.Tenant, Endpoint: r.ID.Endpoint, Key: r.ID.Key, KeyHash: r.ID.Hash(), State: r.State.String(),
		Escalated: r.Escalated, Mode: r.Mode.String(), Token: r.Token, Attempt: r.Attempt,
		Created: r.Created, Expires: r.Expires, Class: r.Class, Status: r.Result.Status,
		Pointer: r.Result.Pointer, BodyBytes: len(r.Result.Body), Effects: r.Effects, Note: r.Note}
	if r.Mode == idemkv.ModeRemote {
		v.OperationID = r.OperationID.String()
	}
	if !r.LeaseExpires.IsZero() {
		le := r.LeaseExpires
		v.LeaseExpires = &le
	}
	if !r.Marked.IsZero() {
		m := r.Marked
		v.Marked = &m
	}
	return v
}
