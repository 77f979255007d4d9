package httpidem

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// ProblemBase is the prefix of every problem type URI the middleware
// answers with; the fragment names the problem and docs/http.md describes
// each under that anchor. The URIs are stable: clients may switch on them.
const ProblemBase = "https://github.com/idemkv/idemkv/blob/main/docs/http.md#"

// Problem types, appended to ProblemBase.
const (
	ProblemMissingKey       = "missing-key"        // 400
	ProblemInvalidKey       = "invalid-key"        // 400
	ProblemInvalidBody      = "invalid-body"       // 400
	ProblemBodyTooLarge     = "body-too-large"     // 413
	ProblemUnauthenticated  = "unauthenticated"    // 401
	ProblemKeyMismatch      = "key-mismatch"       // 422
	ProblemInProgress       = "in-progress"        // 409
	ProblemReconciling      = "reconciling"        // 409
	ProblemLeaseLost        = "lease-lost"         // 409
	ProblemStoreUnavailable = "store-unavailable"  // 503
	ProblemHandlerPanic     = "handler-panic"      // 500
	ProblemMisconfigured    = "misconfigured"      // 500
	ProblemStoredResponse   = "unreadable-outcome" // 500
)

// Problem is an RFC 9457 problem details object, the body of every error
// response the middleware writes itself (Content-Type
// application/problem+json).
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Fields names the parts of the request that differ from the one that
	// first used the key (key-mismatch, when the route stores fingerprint
	// diagnostics). Names only, never values.
	Fields []string `json:"fields,omitempty"`
}

var titles = map[string]string{
	ProblemMissingKey:       "Idempotency-Key header required",
	ProblemInvalidKey:       "Invalid Idempotency-Key header",
	ProblemInvalidBody:      "Request body cannot be fingerprinted",
	ProblemBodyTooLarge:     "Request body too large",
	ProblemUnauthenticated:  "Authentication required",
	ProblemKeyMismatch:      "Idempotency key reused with a different request",
	ProblemInProgress:       "A request with this idempotency key is in progress",
	ProblemReconciling:      "The outcome of an earlier attempt is being reconciled",
	ProblemLeaseLost:        "The request took longer than its lease",
	ProblemStoreUnavailable: "Idempotency store unavailable",
	ProblemHandlerPanic:     "Internal error",
	ProblemMisconfigured:    "Internal error",
	ProblemStoredResponse:   "Internal error",
}

// WriteProblem writes an application/problem+json response of the given
// problem type (one of the Problem* names) and status. A positive
// retryAfter sets Retry-After, rounded up to whole seconds. Services may
// use it for their own errors so that clients see one error format.
func WriteProblem(w http.ResponseWriter, kind string, status int, detail string, retryAfter time.Duration) {
	writeProblem(w, Problem{Type: ProblemBase + kind, Title: titleOf(kind), Status: status, Detail: detail}, retryAfter)
}

func titleOf(kind string) string { return titles[kind] }

func writeProblem(w http.ResponseWriter, p Problem, retryAfter time.Duration) {
	if p.Title == "" {
		p.Title = http.StatusText(p.Status)
	}
	body, _ := json.Marshal(p) // strings and ints only: cannot fail
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Cache-Control", "no-store")
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(int64((retryAfter+time.Second-1)/time.Second), 10))
	}
	w.WriteHeader(p.Status)
	w.Write(body)
}
