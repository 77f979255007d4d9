package httpidem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fingerprint"
)

// Defaults of a Route.
const (
	// DefaultMaxStoredBody is the largest response body stored for
	// byte-exact replay. It must stay below the store's own bound
	// (engine.Options.MaxBodySize, 64 KiB by default) with room for the
	// replayable headers.
	DefaultMaxStoredBody = 32 << 10
	// ReconcilingRetryAfter is the Retry-After of a 409 reconciling answer.
	ReconcilingRetryAfter = 5 * time.Second
	// StoreRetryAfter is the Retry-After of a 503 store-unavailable answer.
	StoreRetryAfter = 1 * time.Second
)

// DefaultReplayHeaders are the response headers replayed when a route
// names none: what says how to read the body (a body the handler
// compressed is replayed compressed, so its Content-Encoding must go with
// it) and where the created object is.
var DefaultReplayHeaders = []string{"Content-Type", "Content-Encoding", "Location"}

// Options configure a Middleware.
type Options struct {
	// Store keeps the keys and outcomes. Required.
	Store idemkv.Store

	// Tenant returns the authenticated principal a request acts for: the
	// scope of its keys, so that two callers never share one. Required:
	// New refuses to build a middleware without it. A request for which it
	// returns "" or an error is answered 401 and never reaches the store
	// or the handler. It must come from authentication (a verified API
	// key, session or token), never from something the request merely
	// states: whoever can choose the tenant can read another caller's
	// replays and take its keys first.
	Tenant func(r *http.Request) (string, error)

	// Challenge is the WWW-Authenticate value a 401 carries (RFC 9110
	// §11.6.1 requires one), for example `Bearer realm="payments"`.
	// Default: none.
	Challenge string

	// Observer, if set, receives a Report for every request the
	// middleware protects or rejects. Passed-through requests (methods the
	// route does not protect) are not reported.
	Observer Observer

	// Logger receives a record of every state change a request causes
	// (a key claimed or taken over, an outcome stored, a key released or
	// marked uncertain) at Info; replays and 409s at Debug; a lost lease
	// at Warn; store errors and handler panics at Error. Each names the
	// request's tenant, endpoint, key_hash (idemkv.ID.Hash) and
	// request_id (HeaderRequestID). Default: slog.Default(). A logger
	// whose level leaves a record out costs the request nothing for it.
	Logger *slog.Logger

	// LogRawKeys adds the raw idempotency key to every log record, as
	// "key". Default: off, and records name a key only by its key_hash:
	// a key can carry customer data (an order number, an email). Turn it
	// on only where the logs are guarded like that data. Request and
	// response bodies are never logged.
	LogRawKeys bool

	// Clock times the heartbeats that keep a running handler's lease
	// (Route.Heartbeat), through idemkv.AfterFunc: a Clock that is an
	// idemkv.TimerClock (a simulation's) drives them, any other gets Go's
	// timers. It must tell the store's time: a route that leaves its
	// lease to the store's default derives the beat from the lease's
	// expiry as read on it. Default: the store, if it implements
	// idemkv.Clock (engine.Engine and pgstore.Store do), else the wall
	// clock.
	Clock idemkv.Clock

	// TracerProvider, if set, gives every request the middleware protects
	// or rejects a span (SpanName), a child of the span in the request's
	// context, under which the handler runs. The span carries the tenant,
	// endpoint, key hash, request id, disposition and attempt; a store
	// error is recorded on it, and a 5xx sets its status to Error. The raw
	// key is never put on a span. Default: nil, no spans: the global
	// provider (otel.GetTracerProvider) is never read.
	TracerProvider trace.TracerProvider
}

// Middleware protects HTTP handlers with idempotency keys. It is safe for
// concurrent use.
type Middleware struct {
	store     idemkv.Store
	tenant    func(*http.Request) (string, error)
	challenge string
	observer  Observer
	log       *slog.Logger
	rawKeys   bool
	tracer    trace.Tracer // nil: no spans
	clock     idemkv.Clock // times the heartbeats
	flights   flights
}

// New returns a Middleware. It fails if opts is nil or Store or Tenant
// is missing: neither has a default.
func New(opts *Options) (*Middleware, error) {
	if opts == nil {
		return nil, errors.New("httpidem: Options with a Store and a Tenant are required")
	}
	if opts.Store == nil {
		return nil, errors.New("httpidem: Options.Store is required")
	}
	if opts.Tenant == nil {
		return nil, errors.New("httpidem: Options.Tenant is required: keys must be scoped to an authenticated principal")
	}
	m := &Middleware{store: opts.Store, tenant: opts.Tenant, challenge: opts.Challenge, observer: opts.Observer,
		log: opts.Logger, rawKeys: opts.LogRawKeys}
	if m.log == nil {
		m.log = slog.Default()
	}
	if opts.TracerProvider != nil {
		m.tracer = opts.TracerProvider.Tracer(tracerName)
	}
	m.clock = opts.Clock
	if m.clock == nil {
		m.clock = idemkv.SystemClock{}
		if c, ok := opts.Store.(idemkv.Clock); ok {
			m.clock = c
		}
	}
	return m, nil
}

// retentionReporter is implemented by stores that can say how long a
// retention class keeps outcomes (the Pebble engine does).
type retentionReporter interface {
	Retention(class string) (time.Duration, error)
}

// Wrap returns h protected as route says. It reports a route the
// middleware cannot run (an unknown mode, bad fingerprint options, a
// retention class the store does not know) as an error, at start-up.
func (m *Middleware) Wrap(h http.Handler, route Route) (http.Handler, error) {
	rt := route
	if len(rt.Methods) == 0 {
		rt.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	for _, meth := range rt.Methods {
		if meth == "" || strings.ToUpper(meth) != meth {
			return nil, fmt.Errorf("httpidem: method %q: methods are upper case", meth)
		}
	}
	if rt.Mode != idemkv.ModeLocal && rt.Mode != idemkv.ModeRemote {
		return nil, fmt.Errorf("httpidem: unknown mode %d", rt.Mode)
	}
	if rt.Lease < 0 || rt.Wait < 0 || rt.MaxStoredBody < 0 {
		return nil, errors.New("httpidem: Lease, Wait and MaxStoredBody may not be negative")
	}
	if rt.Lease > 0 && rt.Heartbeat >= rt.Lease {
		return nil, fmt.Errorf("httpidem: Heartbeat %v must be shorter than Lease %v, or the lease runs out between beats", rt.Heartbeat, rt.Lease)
	}
	if rt.MaxStoredBody == 0 {
		rt.MaxStoredBody = DefaultMaxStoredBody
	}
	if rt.PointerOnly && rt.Rebuild == nil {
		return nil, errors.New("httpidem: a PointerOnly route needs Rebuild to answer its replays")
	}
	fp := rt.Fingerprint.EnsureDefaults()
	if err := fp.Validate(); err != nil {
		return nil, err
	}
	rt.Fingerprint = fp
	if rt.ReplayHeaders == nil {
		rt.ReplayHeaders = DefaultReplayHeaders
	}
	rt.ReplayHeaders = slices.Clone(rt.ReplayHeaders)
	for i, name := range rt.ReplayHeaders {
		rt.ReplayHeaders[i] = http.CanonicalHeaderKey(name)
	}
	if rt.Storable == nil {
		rt.Storable = DefaultStorable
	}
	if rt.ValidationFailure == nil {
		rt.ValidationFailure = DefaultValidationFailure
	}
	if len(rt.Retention) > idemkv.MaxClassLen {
		return nil, fmt.Errorf("httpidem: retention class name %q is too long", rt.Retention)
	}
	ph := &protected{m: m, next: h, route: rt}
	if rr, ok := m.store.(retentionReporter); ok {
		d, err := rr.Retention(rt.Retention)
		if err != nil {
			return nil, fmt.Errorf("httpidem: route retention: %w", err)
		}
		ph.retention = strconv.FormatInt(int64(d/time.Second), 10)
	}
	return ph, nil
}

// testHookWaiting, if set, runs when a request starts waiting for an
// in-process holder.
var testHookWaiting func()

// protected is one wrapped handler.
type protected struct {
	m         *Middleware
	next      http.Handler
	route     Route
	retention string // HeaderRetention value; "" if the store cannot say
}

// request is one protected request on its way through.
type request struct {
	start  time.Time
	header http.Header // the request's, for its request id
	id     idemkv.ID
	fpReq  fingerprint.Request
	diag   []byte
	// asIsFP is the fingerprint of the request with the path past the
	// pattern as it was spelled, if that is not its normal form: what an
	// outcome stored before the form was normal holds (pathParams).
	asIsFP   []byte
	report   Report
	reported bool
	attempt  uint32 // of the lease acquired, or of the record found
	hash     string // keyHash, once computed
	rid      string // requestID, once chosen
	span     trace.Span
}

func (p *protected) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !slices.Contains(p.route.Methods, r.Method) {
		p.next.ServeHTTP(w, r)
		return
	}
	q := &request{start: time.Now(), header: r.Header}
	if p.m.tracer != nil {
		r = p.startSpan(r, q)
	}
	defer p.finish(q)

	key, err := ParseKey(r.Header.Values(HeaderKey))
	switch {
	case errors.Is(err, ErrMissingKey) && !p.route.Require:
		q.report.Disposition = Unprotected
		p.next.ServeHTTP(w, r)
		return
	case errors.Is(err, ErrMissingKey):
		p.reject(w, q, ProblemMissingKey, http.StatusBadRequest, "this endpoint requires an Idempotency-Key header")
		return
	case err != nil:
		p.reject(w, q, ProblemInvalidKey, http.StatusBadRequest, strings.TrimPrefix(err.Error(), ErrInvalidKey.Error()+": "))
		return
	}
	tenant, err := p.m.tenant(r)
	if err != nil || tenant == "" {
		detail := "no authenticated principal"
		if err != nil {
			detail = err.Error()
		}
		if p.m.challenge != "" {
			w.Header().Set("WWW-Authenticate", p.m.challenge)
		}
		p.reject(w, q, ProblemUnauthenticated, http.StatusUnauthorized, detail)
		return
	}
	pattern := p.route.Pattern
	if pattern == "" {
		pattern = patternPath(r.Pattern)
	}
	if pattern == "" {
		p.m.log.Error("httpidem: no route pattern: set Route.Pattern or serve through http.ServeMux", "path", r.URL.Path)
		p.reject(w, q, ProblemMisconfigured, http.StatusInternalServerError, "")
		return
	}
	q.id = idemkv.ID{Tenant: tenant, Endpoint: r.Method + " " + pattern, Key: key}
	q.report.Endpoint = q.id.Endpoint

	limit := p.route.Fingerprint.MaxBodySize
	var body []byte
	if r.Body != nil {
		body, err = io.ReadAll(io.LimitReader(r.Body, int64(limit)+1))
	}
	if err != nil {
		p.reject(w, q, ProblemInvalidBody, http.StatusBadRequest, "reading the request body: "+err.Error())
		return
	}
	if len(body) > limit {
		p.reject(w, q, ProblemBodyTooLarge, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body exceeds %d bytes", limit))
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	params, asIs, err := pathParams(r, pattern)
	if err != nil {
		p.m.log.Error("httpidem: "+err.Error(), "pattern", pattern, "path", r.URL.Path)
		p.reject(w, q, ProblemMisconfigured, http.StatusInternalServerError, "")
		return
	}
	q.fpReq = fingerprint.Request{
		Tenant: tenant, Method: r.Method, Route: pattern, Params: params,
		Query: r.URL.Query(), Header: r.Header, Body: body,
	}
	fp, err := fingerprint.Compute(q.fpReq, p.route.Fingerprint)
	if err != nil {
		p.reject(w, q, ProblemInvalidBody, http.StatusBadRequest, err.Error())
		return
	}
	q.diag = fp.Diagnostics
	if asIs != "" {
		old := q.fpReq
		old.Params = maps.Clone(params)
		old.Params[restParam] = asIs
		if fp, err := fingerprint.Compute(old, p.route.Fingerprint); err == nil {
			q.asIsFP = fp.Bytes
		}
	}
	p.claim(w, r, q, idemkv.ClaimRequest{
		ID: q.id, Fingerprint: fp.Bytes, Mode: p.route.Mode, Lease: p.route.Lease,
		Resumable: p.route.Resumable, Retention: p.route.Retention,
	})
}

// claim claims the key and acts on the outcome. On a route that waits,
// requests of this process for one key claim one at a time: the first
// (the flight's owner) claims, the others wait for it to finish before
// they claim in turn, so a duplicate of an in-process request waits for
// its outcome instead of polling.
func (p *protected) claim(w http.ResponseWriter, r *http.Request, q *request, req idemkv.ClaimRequest) {
	ctx := r.Context()
	fk := q.id.Tenant + "\x00" + q.id.Endpoint + "\x00" + q.id.Key
	for waited := false; ; {
		var done chan struct{}
		owner := false
		if p.route.Wait > 0 && !waited {
			done, owner = p.m.flights.join(fk)
			if !owner {
				waited = !p.await(ctx, done, q.start.Add(p.route.Wait))
				if ctx.Err() != nil {
					q.report.Disposition = Conflict // the client left while waiting
					return
				}
				continue
			}
		}
		c, err := p.claimOnce(w, r, q, req, fk, done, owner)
		if err != nil {
			p.storeFailed(w, r, q, err)
			return
		}
		switch c.Outcome {
		case idemkv.Acquired:
		case idemkv.Replay:
			p.replay(w, r, q, c.Record.Result)
		case idemkv.Mismatch:
			if q.asIsFP != nil && bytes.Equal(c.Record.Fingerprint, q.asIsFP) {
				// Stored before the path's form was normal: the same
				// request, spelled as it was then.
				req.Fingerprint, q.asIsFP = q.asIsFP, nil
				continue
			}
			p.mismatch(w, r, q)
		case idemkv.Reconciling:
			q.report.Disposition = Reconciling
			p.logEvent(ctx, q, slog.LevelDebug, msgReconciling, disposition(q))
			p.problem(w, q, ProblemReconciling, http.StatusConflict,
				"an earlier attempt's outcome is unknown and is being reconciled; it will not be run again", ReconcilingRetryAfter)
		default: // InProgress: held by another process, or past our wait
			if p.awaitSettled(ctx, q, c) {
				continue
			}
			if ctx.Err() != nil {
				q.report.Disposition = Conflict // the client left while waiting
				return
			}
			q.report.Disposition = Conflict
			p.logEvent(ctx, q, slog.LevelDebug, msgInProgress, disposition(q))
			p.problem(w, q, ProblemInProgress, http.StatusConflict,
				"a request with this key is still running; retry with the same key to get its outcome", max(c.RetryAfter, time.Second))
		}
		return
	}
}

// claimOnce claims req and, if it acquires the key, runs the handler. The
// owner of a flight ends it however the handler returns.
func (p *protected) claimOnce(w http.ResponseWriter, r *http.Request, q *request, req idemkv.ClaimRequest,
	fk string, done chan struct{}, owner bool) (idemkv.Claim, error) {
	if owner {
		defer p.m.flights.end(fk, done)
	}
	c, err := p.m.store.Claim(r.Context(), req)
	switch {
	case err != nil:
	case c.Outcome == idemkv.Acquired:
		q.attempt = c.Lease.Attempt
		p.logClaimed(r.Context(), q, c.Lease)
		p.execute(w, r, q, c.Lease)
	default:
		q.attempt = c.Record.Attempt
	}
	return c, err
}

// await waits until done is closed (true), or until deadline or the
// client's departure (false).
func (p *protected) await(ctx context.Context, done chan struct{}, deadline time.Time) bool {
	wait := time.Until(deadline)
	if wait <= 0 {
		return false
	}
	if testHookWaiting != nil {
		testHookWaiting()
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// awaitSettled waits, on a store that can watch records (idemkv.Watcher),
// for the attempt of another process that holds the key (c answered
// InProgress) to settle: up to the route's Wait, and no longer than the
// holder's lease, after which a claim may take over. True means claim
// again.
func (p *protected) awaitSettled(ctx context.Context, q *request, c idemkv.Claim) bool {
	w, ok := p.m.store.(idemkv.Watcher)
	if !ok || p.route.Wait <= 0 {
		return false
	}
	wait := min(time.Until(q.start.Add(p.route.Wait)), c.RetryAfter)
	if wait <= 0 {
		return false
	}
	settled, stop, err := w.Watch(ctx, q.id, c.Record.Token)
	if err != nil {
		p.logEvent(ctx, q, slog.LevelDebug, "httpidem: cannot wait for another process's attempt", slog.Any("err", err))
		return false
	}
	defer stop()
	if testHookWaiting != nil {
		testHookWaiting()
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-settled:
	case <-t.C:
	case <-ctx.Done():
		return false
	}
	return true
}

// execute runs the handler under lease l and stores its outcome.
//
// The heartbeat keeps the lease while the handler runs, and is stopped
// before anything is settled: when the handler returns, or when its
// response starts to stream and its outcome is committed early.
func (p *protected) execute(w http.ResponseWriter, r *http.Request, q *request, l idemkv.Lease) {
	op := &Op{lease: l, store: p.m.store, d: p.route.Lease, now: p.m.clock.Now}
	op.length = l.Expires.Sub(op.now())
	sctx := context.WithoutCancel(r.Context()) // a gone client must not leave the key stuck
	c := &capture{w: w, header: make(http.Header), limit: p.route.MaxStoredBody}
	hb := p.startHeartbeat(sctx, q, op)
	var settleErr error
	c.spill = func(c *capture) error {
		q.report.Renewals = hb.stop()
		settleErr = p.settle(sctx, q, op, c, false)
		if settleErr == nil && q.report.Disposition == Stored && p.retention != "" {
			c.header.Set(HeaderRetention, p.retention)
		}
		return settleErr
	}
	panicked, stack := p.run(c, r.WithContext(context.WithValue(r.Context(), opKey{}, op)))
	q.report.Renewals = hb.stop() // a no-op if the response streams: spill stopped it
	switch {
	case panicked != nil:
		if !c.streaming {
			p.abandon(sctx, q, op, fmt.Sprintf("handler panicked: %v", panicked))
		}
		q.report.Disposition = Panicked
		if panicked == http.ErrAbortHandler { //nolint:errorlint // sentinel value, as net/http compares it
			q.report.Status = 0
			p.observe(q)
			panic(panicked)
		}
		p.logEvent(r.Context(), q, slog.LevelError, "httpidem: handler panicked",
			slog.Any("panic", panicked), slog.String("stack", string(stack)))
		if !c.streaming {
			p.problem(w, q, ProblemHandlerPanic, http.StatusInternalServerError, "", 0)
		}
	case c.streaming:
		q.report.Status = c.status
	case c.dropped:
		p.settleFailed(sctx, w, q, settleErr)
	default:
		if err := p.settle(sctx, q, op, c, true); err != nil {
			p.settleFailed(sctx, w, q, err)
			return
		}
		var extra http.Header
		if q.report.Disposition == Stored && p.retention != "" {
			extra = http.Header{HeaderRetention: {p.retention}}
		}
		q.report.Status = c.status
		c.send(extra)
	}
}

// run calls the handler, turning a panic into a value.
func (p *protected) run(w http.ResponseWriter, r *http.Request) (panicked any, stack []byte) {
	defer func() {
		if v := recover(); v != nil {
			panicked, stack = v, debug.Stack()
		}
	}()
	p.next.ServeHTTP(w, r)
	return nil, nil
}

func (p *protected) reject(w http.ResponseWriter, q *request, kind string, status int, detail string) {
	if q.report.Disposition == "" {
		q.report.Disposition = Rejected
	}
	p.problem(w, q, kind, status, detail, 0)
}

func (p *protected) problem(w http.ResponseWriter, q *request, kind string, status int, detail string, retryAfter time.Duration) {
	q.report.Status = status
	writeProblem(w, Problem{Type: ProblemBase + kind, Title: titleOf(kind), Status: status, Detail: detail}, retryAfter)
}

// finish ends q's span and reports q to the observer, last: once a
// report is out, so is everything else the request made.
func (p *protected) finish(q *request) {
	if q.span != nil {
		p.endSpan(q)
	}
	p.observe(q)
}

func (p *protected) observe(q *request) {
	if p.m.observer == nil || q.reported {
		return
	}
	q.reported = true
	q.report.Duration = time.Since(q.start)
	p.m.observer.Observe(q.report)
}
