package admin

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/httpidem"
	"github.com/idemkv/idemkv/reconcile"
	"github.com/idemkv/idemkv/saga"
)

// MinTokenLen is the shortest bearer token New accepts, in bytes.
const MinTokenLen = 16

// maxBody bounds a request body: the API takes small JSON objects,
// except a resolve's, which may carry a response body to store
// (maxResolveBody: base64 of the engine's largest, 16 MiB, and room).
const (
	maxBody        = 64 << 10
	maxResolveBody = 24 << 20
)

// Options configure the admin API. Token is required; each function that
// is nil leaves its endpoint answering 404 (a store that cannot do it).
type Options struct {
	// Token is the bearer token every call must carry
	// (Authorization: Bearer TOKEN), at least MinTokenLen bytes.
	Token string
	// Check runs the store's consistency check and returns its report
	// and the number of problems it found.
	Check func(ctx context.Context) (report any, problems int, err error)
	// Sweep runs one pass of the expiry sweeper and returns its figures.
	Sweep func(ctx context.Context) (pass any, err error)
	// Backup writes a consistent copy of the store into dir, a path on
	// the service's machine that must not exist (engine.Engine.Backup).
	// With Audit, POST /admin/v1/backup runs it through AuditLog.Backup,
	// so the copy also holds the audit log (dir/audit.log) as of the
	// store's copy.
	Backup func(ctx context.Context, dir string) error
	// Stats returns the store's figures.
	Stats func(ctx context.Context) (any, error)
	// Audit, if set, records every resolve and evict; without it those
	// endpoints answer 404: an operator's write is never made
	// unrecorded.
	Audit *AuditLog
	// Settler, if set, is the application's side of a resolve that is
	// not verified: the writes it gives go with the resolution (see
	// ResolveOptions.Settler). Default: none, a resolve writes the record
	// alone.
	Settler reconcile.Settler
	// Reconciler, if set, answers a resolve with "verify" (see
	// ResolveOptions.Reconciler); without it such a resolve answers 404.
	Reconciler reconcile.Reconciler
	// ResolveTimeout bounds each call a resolve makes to the Settler or
	// the Reconciler. Default: DefaultResolveTimeout.
	ResolveTimeout time.Duration
	// Now is the time listings measure age and lapsed leases against,
	// and console sessions their lifetime. Default: the store's clock,
	// when it is an idemkv.Clock (both stores are), else time.Now. Audit
	// entries take the store's own Now.
	Now func() time.Time
	// Logger, if set, is told of every call the store failed (answered
	// 500 or 503): the answer says only that it failed. Keys are not
	// logged.
	Logger *slog.Logger

	// NoConsole turns the console (/console/, console.go) off: the
	// handler then serves the API alone.
	NoConsole bool
	// NextQuestion, if set, says when the service's reconciler next asks
	// about an unsettled record, and its Unknown answers in a row, or
	// that it does not ask (reconcile.Worker.Due): the console's
	// unsettled queue shows it.
	NextQuestion func(idemkv.Record) (at time.Time, unknowns int, asks bool)
	// Steps names the downstream steps of the service's remote
	// operations ("charge"): a remote record's page in the console shows
	// each one's downstream idempotency key (idemkv.OperationID.StepKey).
	Steps []string
	// Positions, if set, returns the positions the service's inbox
	// consumers have committed, for the console's outbox page.
	Positions func(ctx context.Context) ([]ConsumerPosition, error)
	// Sagas are the service's saga runners, whose sagas the console shows
	// step by step.
	Sagas []*saga.Runner
}

// ConsumerPosition is an inbox consumer's committed position
// (inbox.Consumer.Position).
type ConsumerPosition struct {
	Name     string
	Position uint64
}

// New returns the admin API on store, to be served on a listener of its
// own (the service's, loopback by default: see package doc).
func New(store idemkv.Store, o *Options) (http.Handler, error) {
	if o == nil || len(o.Token) < MinTokenLen {
		return nil, fmt.Errorf("%w: admin: a bearer token of at least %d bytes is required", idemkv.ErrInvalidArgument, MinTokenLen)
	}
	a := &api{store: store, o: *o, token: sha256.Sum256([]byte(o.Token))}
	if a.o.Now == nil {
		a.o.Now = time.Now
		if c, ok := store.(idemkv.Clock); ok {
			a.o.Now = c.Now
		}
	}
	a.guard = newThrottle(a.o.Now)
	if a.o.Logger == nil {
		a.o.Logger = slog.New(slog.DiscardHandler)
	}
	mux := http.NewServeMux()
	mux.Handle("/admin/v1/record", only("GET", a.record))
	mux.Handle("/admin/v1/records", only("GET", a.records))
	mux.Handle("/admin/v1/pending", only("GET", a.pending))
	mux.Handle("/admin/v1/export", only("GET", a.export))
	mux.Handle("/admin/v1/resolve", only("POST", a.resolve))
	mux.Handle("/admin/v1/evict", only("POST", a.evict))
	mux.Handle("/admin/v1/stats", only("GET", a.stats))
	mux.Handle("/admin/v1/check", only("POST", a.check))
	mux.Handle("/admin/v1/sweep", only("POST", a.sweep))
	mux.Handle("/admin/v1/backup", only("POST", a.backup))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, http.StatusNotFound, ProblemNotFound, "no such admin endpoint")
	})
	if o.NoConsole {
		return a.authenticate(mux), nil
	}
	c, err := newConsole(a)
	if err != nil {
		return nil, err
	}
	top := http.NewServeMux()
	top.Handle(consolePath, c) // its own sign-in (console_auth.go)
	top.Handle("/", a.authenticate(mux))
	return top, nil
}

// only answers other methods than method with a problem+json 405.
func only(method string, h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != method {
			w.Header().Set("Allow", method)
			writeProblem(w, http.StatusMethodNotAllowed, ProblemInvalidRequest, "this endpoint takes "+method)
			return
		}
		h(w, r)
	})
}

type api struct {
	store idemkv.Store
	o     Options
	token [sha256.Size]byte
	guard *throttle // wrong tokens, by client address
}

// authenticate lets through only requests with the bearer token. The
// digests are compared in constant time, so the comparison's time says
// nothing of the token; an address that sent too many wrong tokens has
// its next ones refused uncompared (throttle.go).
func (a *api) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if ok {
			right, wait := a.checkToken(r, got)
			if wait > 0 {
				w.Header().Set("Retry-After", retryAfter(wait))
				writeProblem(w, http.StatusTooManyRequests, ProblemThrottled, throttledDetail(wait))
				return
			}
			ok = right
		}
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="idemkv admin"`)
			writeProblem(w, http.StatusUnauthorized, httpidem.ProblemUnauthenticated, "a valid admin bearer token is required")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// record answers GET /admin/v1/record?tenant=T&endpoint=E&key=K with the
// record and its history in the audit log. A key without a record but
// with a history (evicted, say) is a 404 whose detail says what the
// last operator did.
func (a *api) record(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	id := idemkv.ID{Tenant: q.Get("tenant"), Endpoint: q.Get("endpoint"), Key: q.Get("key")}
	rec, err := a.store.Get(r.Context(), id)
	if err != nil && !errors.Is(err, idemkv.ErrNotFound) {
		a.writeError(w, r, err)
		return
	}
	var history []AuditEntry
	if a.o.Audit != nil && id.Validate() == nil {
		if history, err = a.o.Audit.History(id); err != nil {
			a.writeError(w, r, err)
			return
		}
	}
	if rec.State == 0 {
		detail := "no such record"
		if n := len(history); n > 0 {
			last := history[n-1]
			detail = fmt.Sprintf("no such record; the audit log's last entry for its key: %s %s %s (%s): %s",
				last.Time.Format(time.RFC3339), last.Action, last.Phase, last.Outcome, last.Note)
		}
		writeProblem(w, http.StatusNotFound, ProblemNotFound, detail)
		return
	}
	v := ViewOf(&rec)
	v.History = history
	writeJSON(w, http.StatusOK, v)
}

// pending answers GET /admin/v1/pending?escalated=B&tenant=T&after=C&limit=N.
func (a *api) pending(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if !knownParams(w, q, "escalated", "tenant", "after", "limit") {
		return
	}
	req := idemkv.ListRequest{Tenant: q.Get("tenant"), After: q.Get("after")}
	if v := q.Get("escalated"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			writeProblem(w, http.StatusBadRequest, ProblemInvalidRequest, "escalated: want true or false")
			return
		}
		req.Escalated = b
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			writeProblem(w, http.StatusBadRequest, ProblemInvalidRequest, "limit: want 1 to 1000")
			return
		}
		req.Limit = n
	}
	page, err := a.store.List(r.Context(), req)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, listViewOf(page.Records, page.Next))
}

func (a *api) stats(w http.ResponseWriter, r *http.Request) {
	if a.o.Stats == nil {
		writeProblem(w, http.StatusNotFound, ProblemNotFound, "this store has no figures")
		return
	}
	st, err := a.o.Stats(r.Context())
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

func (a *api) check(w http.ResponseWriter, r *http.Request) {
	if a.o.Check == nil {
		writeProblem(w, http.StatusNotFound, ProblemNotFound, "this store has no check")
		return
	}
	if !emptyBody(w, r) {
		return
	}
	rep, problems, err := a.o.Check(r.Context())
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"problems": problems, "report": rep})
}

func (a *api) sweep(w http.ResponseWriter, r *http.Request) {
	if a.o.Sweep == nil {
		writeProblem(w, http.StatusNotFound, ProblemNotFound, "this store has no sweeper")
		return
	}
	if !emptyBody(w, r) {
		return
	}
	pass, err := a.o.Sweep(r.Context())
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, pass)
}

// BackupRequest is the body of POST /admin/v1/backup.
type BackupRequest struct {
	// Dir is where the copy goes, on the service's machine: an absolute
	// path that must not exist.
	Dir string `json:"dir"`
}

func (a *api) backup(w http.ResponseWriter, r *http.Request) {
	if a.o.Backup == nil {
		writeProblem(w, http.StatusNotFound, ProblemNotFound, "this store is backed up with the database's own tools")
		return
	}
	var req BackupRequest
	if !decode(w, r, &req) {
		return
	}
	if !filepath.IsAbs(req.Dir) || filepath.Clean(req.Dir) != req.Dir {
		writeProblem(w, http.StatusBadRequest, ProblemInvalidRequest, "dir: want a clean absolute path")
		return
	}
	if fi, err := os.Stat(filepath.Dir(req.Dir)); err != nil || !fi.IsDir() {
		// A mistyped path, answered as such rather than as the store's
		// failure; nor is a tree of directories made for it.
		writeProblem(w, http.StatusBadRequest, ProblemInvalidRequest, "dir: its parent is not a directory on the service's machine")
		return
	}
	start := time.Now()
	backup := func() error { return a.o.Backup(r.Context(), req.Dir) }
	var err error
	if a.o.Audit != nil {
		err = a.o.Audit.Backup(req.Dir, backup)
	} else {
		err = backup()
	}
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{"dir": req.Dir, "seconds": time.Since(start).Seconds()})
}

// emptyBody refuses a request with a body where none is taken.
func emptyBody(w http.ResponseWriter, r *http.Request) bool {
	n, _ := io.Copy(io.Discard, io.LimitReader(r.Body, 1))
	if n > 0 {
		writeProblem(w, http.StatusBadRequest, ProblemInvalidRequest, "this endpoint takes no body")
		return false
	}
	return true
}

// knownParams refuses a query with a parameter not in names: a misspelt
// filter must not be ignored.
func knownParams(w http.ResponseWriter, q url.Values, names ...string) bool {
	for name := range q {
		if !slices.Contains(names, name) {
			writeProblem(w, http.StatusBadRequest, ProblemInvalidRequest, fmt.Sprintf("unknown parameter %q", name))
			return false
		}
	}
	return true
}

// decode reads one JSON object of known fields into v, within maxBody.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	return decodeWithin(w, r, v, maxBody)
}

// decodeWithin is decode within limit bytes.
func decodeWithin(w http.ResponseWriter, r *http.Request, v any, limit int64) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil && dec.More() {
		err = errors.New("more than one JSON value")
	}
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		writeProblem(w, http.StatusRequestEntityTooLarge, ProblemInvalidRequest, fmt.Sprintf("body over %d bytes", limit))
		return false
	case err != nil:
		writeProblem(w, http.StatusBadRequest, ProblemInvalidRequest, "body: "+err.Error())
		return false
	}
	return true
}
