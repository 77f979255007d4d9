package payments

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idemkv/idemkv"

	"github.com/idemkv/idemkv/fingerprint"
	"github.com/idemkv/idemkv/httpidem"
	"github.com/idemkv/idemkv/saga"
)

// Store is what a Service keeps its keys, outcomes and payments in: an
// *engine.Engine (one process) or a *pgstore.Store (a fleet of processes
// sharing one PostgreSQL database).
type Store = idemkv.DataStore

// Config configures a Service.
type Config struct {
	// Store holds keys, outcomes and payments. Required.
	Store Store
	// Processor is the card processor. Default: a simulated one in this
	// process that always succeeds at once (NewProvider), on Clock.
	Processor Processor
	// Wait is how long a duplicate of a payment still being processed in
	// this process waits for its outcome before a 409 (httpidem.Route.Wait).
	// Default: 0, answer 409 at once.
	Wait time.Duration
	// Lease bounds how long a payment may take before a retry may take it
	// over (resuming the same charge). Default: the store's (30 s).
	Lease time.Duration
	// CallTimeout bounds how long after it is sent a charge may still
	// reach the processor: every call carries a deadline
	// (ChargeRequest.Deadline), the end of its attempt's lease or
	// CallTimeout past the send if sooner, after which the processor
	// refuses it. Keep the reconciler's grace (reconcile.Options.Grace)
	// above it, plus how far the processor's clock may lag the store's:
	// a payment is then asked about only once its call can no longer
	// charge, and the processor's "no charge" is final. Default: 5 s,
	// ProcessorClient's default timeout.
	CallTimeout time.Duration
	// Heartbeat is how often a payment still running renews its lease
	// (httpidem.Route.Heartbeat): a payment slower than its lease is then
	// taken over only if its process stalls. Default: a third of the
	// lease; negative: never renew.
	Heartbeat time.Duration
	// Clock tells the time of payments (Payment.Created): every time the
	// service reads, in a request, a reconciler's answer or an operator's
	// settlement, comes from it, so a test or a simulation that drives a
	// clock drives the service. It must tell the Store's time: a call's
	// deadline is the earlier of the lease's end, in the Store's time,
	// and CallTimeout from now by this clock. Default: the Store, whose
	// clock its records' times are in.
	Clock idemkv.Clock
	// Logger. Default: slog.Default().
	Logger *slog.Logger
	// APIKeys authenticates callers: the bearer token is a secret API key
	// and the account is the one it maps to. Nil is demo mode: the bearer
	// token is the account itself, so anyone can act as any account; only
	// for a service on loopback (idemkv serve refuses otherwise).
	APIKeys *APIKeys
	// NoMetricsRoute leaves GET /metrics out of Handler, for a service
	// that serves MetricsHandler on an address of its own (the metrics
	// are not authenticated).
	NoMetricsRoute bool
	// Events, if set, emits a payments.created event (CreatedEvent) with
	// every payment, in the commit that stores it; a relay
	// (package outbox) must then publish them, or they pile up in the
	// store's outbox.
	Events bool
	// AccountLimit, if positive, is the most an account's payments may
	// charge in all, in minor units (limit.go): a payment past it is
	// refused with 402 limit-exceeded and nothing is charged. Set it
	// before the first payment: payments made without it are counted
	// only as they are stored. Orders (POST /v1/orders) are not counted:
	// their authorizations charge the card outside the limit.
	AccountLimit int64
}

// Service is the payments API.
type Service struct {
	cfg      Config
	orders   *saga.Runner
	handler  http.Handler
	registry *prometheus.Registry
	created  prometheus.Counter
	provider *prometheus.CounterVec
}

// Payment is the API's payment object.
type Payment struct {
	ID       string `json:"id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	Status   string `json:"status"`
	Charge   string `json:"charge"`
	// Description is the client's own text, kept as sent (at most
	// maxDescription bytes): an order reference, say.
	Description string    `json:"description,omitempty"`
	Created     time.Time `json:"created"`
}

// stored is a payment as kept in the store.
type stored struct {
	Payment
	Tenant string `json:"tenant"`
}

// Data keys (engine effects namespace): "pay/" + len(tenant) + tenant + id
// holds the payment; "idx/" + len(tenant) + tenant + (MaxUint64 - created
// ns) + id lists a tenant's payments newest first. The tenant is part of
// the payment's key so that asking for another account's payment reads
// the same absent key as asking for none: the answer and its timing say
// nothing about whether the id exists.
func paymentKey(tenant, id string) []byte {
	k := make([]byte, 0, 5+len(tenant)+len(id))
	k = append(k, "pay/"...)
	k = append(k, byte(len(tenant)))
	return append(append(k, tenant...), id...)
}

func indexPrefix(tenant string) []byte {
	k := make([]byte, 0, 5+len(tenant)+8+32)
	k = append(k, "idx/"...)
	k = append(k, byte(len(tenant)))
	return append(k, tenant...)
}

func indexKey(tenant string, created time.Time, id string) []byte {
	k := indexPrefix(tenant)
	k = binary.BigEndian.AppendUint64(k, math.MaxUint64-uint64(created.UnixNano()))
	return append(k, id...)
}

// New builds the service and its routes.
func New(cfg Config) (*Service, error) {
	if cfg.Store == nil {
		return nil, errors.New("payments: Config.Store is required")
	}
	if cfg.Clock == nil {
		cfg.Clock = cfg.Store
	}
	if cfg.Processor == nil {
		cfg.Processor = NewProvider(ProviderOptions{Clock: cfg.Clock})
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.AccountLimit < 0 {
		return nil, errors.New("payments: Config.AccountLimit is negative")
	}
	if cfg.CallTimeout < 0 {
		return nil, errors.New("payments: Config.CallTimeout is negative")
	}
	cfg.CallTimeout = cmp.Or(cfg.CallTimeout, 5*time.Second)
	s := &Service{cfg: cfg, registry: prometheus.NewRegistry()}
	obs, err := s.metrics()
	if err != nil {
		return nil, err
	}
	if s.orders, err = s.orderSaga(); err != nil {
		return nil, err
	}
	m, err := httpidem.New(&httpidem.Options{Store: cfg.Store, Tenant: s.tenantOf, Challenge: challenge, Observer: obs,
		Logger: cfg.Logger, Clock: cfg.Clock})
	if err != nil {
		return nil, err
	}
	create, err := m.Wrap(http.HandlerFunc(s.create), httpidem.Route{
		Require:   true,
		Mode:      idemkv.ModeRemote,
		Resumable: true, // the processor deduplicates on a key derived from the OperationID
		Heartbeat: cfg.Heartbeat,
		Wait:      cfg.Wait,
		Lease:     cfg.Lease,
		Fingerprint: &fingerprint.Options{
			Mode: fingerprint.ModeJSON, MaxBodySize: 16 << 10, Diagnostics: true,
		},
		// Payments never change once made, so a replay rebuilt from the
		// stored row is byte-identical to the first answer, and the
		// idempotency record needs only the status and the pointer.
		PointerOnly: true,
		Rebuild:     s.rebuild,
	})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/payments", create)
	mux.HandleFunc("GET /v1/payments/{id}", s.get)
	mux.HandleFunc("GET /v1/payments", s.list)
	mux.HandleFunc("GET /v1/account", s.account)
	mux.HandleFunc("POST /v1/orders", s.createOrder)
	mux.HandleFunc("GET /v1/orders/{id}", s.getOrder)
	mux.HandleFunc("GET /healthz", s.healthz)
	if !cfg.NoMetricsRoute {
		mux.Handle("GET /metrics", s.MetricsHandler())
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { noRoute(mux, w, r) })
	s.handler = mux
	return s, nil
}

// noRoute answers a request no route of mux matched: 405 with Allow if
// its path has routes for other methods, else 404. The catch-all route
// that calls it would otherwise hide the mux's own 405s.
func noRoute(mux *http.ServeMux, w http.ResponseWriter, r *http.Request) {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		probe := &http.Request{Method: m, URL: r.URL, Host: r.Host, Header: http.Header{}}
		if _, pattern := mux.Handler(probe); pattern != "/" {
			allow = append(allow, m)
		}
	}
	if len(allow) == 0 {
		httpidem.WriteProblem(w, "not-found", http.StatusNotFound, "no such route: "+r.Method+" "+r.URL.Path, 0)
		return
	}
	w.Header().Set("Allow", strings.Join(allow, ", "))
	httpidem.WriteProblem(w, "method-not-allowed", http.StatusMethodNotAllowed,
		r.Method+" is not allowed on "+r.URL.Path+"; allowed: "+strings.Join(allow, ", "), 0)
}

// MetricsHandler serves the service's metrics in Prometheus's format.
func (s *Service) MetricsHandler() http.Handler {
	return promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{Registry: s.registry})
}

// Handler returns the service's HTTP handler.
func (s *Service) Handler() http.Handler { return s.handler }

// Registry returns the service's Prometheus registry, for tests and for
// adding collectors.
func (s *Service) Registry() *prometheus.Registry { return s.registry }

// challenge is the WWW-Authenticate value of every 401.
const challenge = `Bearer realm="payments"`

// tenantOf is the principal: the account the bearer token authenticates
// (Config.APIKeys), or in demo mode the token itself. Every route calls it,
// so every route applies the same rules.
func (s *Service) tenantOf(r *http.Request) (string, error) {
	auth := r.Header.Get("Authorization")
	tok, ok := strings.CutPrefix(auth, "Bearer ")
	tok = strings.TrimSpace(tok)
	switch {
	case auth == "":
		return "", errors.New("send Authorization: Bearer <api key>")
	case !ok || tok == "":
		return "", errors.New("the Authorization header must be Bearer <api key>")
	case s.cfg.APIKeys != nil:
		account, ok := s.cfg.APIKeys.Account(tok)
		if !ok {
			return "", errors.New("unknown API key")
		}
		return account, nil
	}
	if err := validAccount(tok); err != nil {
		return "", err
	}
	return tok, nil
}

func (s *Service) create(w http.ResponseWriter, r *http.Request) {
	op := httpidem.FromContext(r.Context())
	tenant := op.Lease().ID.Tenant // the principal the middleware scoped the key to
	req, problems, err := decodePayment(r.Body)
	if err != nil {
		httpidem.WriteProblem(w, "invalid-payment", http.StatusBadRequest, err.Error(), 0)
		return
	}
	amount, more := validate(req)
	if problems = append(problems, more...); len(problems) > 0 {
		httpidem.WriteProblem(w, "invalid-payment", http.StatusUnprocessableEntity, strings.Join(problems, "; "), 0)
		return
	}
	// Both come from the operation id, which every attempt and every
	// takeover of this key resumes: the processor sees one charge request,
	// and a retry never mints a new payment id.
	opID := op.Lease().OperationID
	// Every give-back of the hold below goes with the attempt's own
	// release or outcome, in the commit fenced on its lease: an attempt
	// that has lost its lease to a retry gives back nothing, since the
	// retry resumes the same operation and still uses the hold (limit.go).
	paid, err := s.begin(r.Context(), tenant, opID, op.Lease().Token, intent{Amount: amount, Currency: *req.Currency, Description: req.Description})
	switch {
	case errors.Is(err, errPaid):
		// The payment is stored already: answer it, charging nothing.
		// (Fenced off with the outcome if another attempt stored it.)
		w.Header().Set("Location", "/v1/payments/"+paid.ID)
		writeJSON(w, http.StatusCreated, paid.Payment)
		return
	case errors.Is(err, errGivenBack):
		// This attempt stalled past its lease, and its payment was
		// settled as not charged meanwhile: it holds and sends nothing.
		// (The release is fenced; were the lease still live, it frees
		// the key rather than store this answer for good.)
		op.Release()
		httpidem.WriteProblem(w, httpidem.ProblemLeaseLost, http.StatusConflict,
			"this attempt outlived its lease and its payment was settled meanwhile; nothing was charged. Retry with the same key.", 0)
		return
	case errors.Is(err, errOverLimit):
		// begin's transaction failed whole: nothing held, nothing
		// charged. The give-back notes the lease, so that an attempt
		// this one took over, stalled before its hold, holds nothing.
		op.Release(s.giveBack(tenant, opID, op.Lease().Token))
		httpidem.WriteProblem(w, "limit-exceeded", http.StatusPaymentRequired, err.Error()+"; nothing was charged", 0)
		return
	case err != nil:
		s.giveUp(w, op, "its hold could not be taken", err) // whether begin committed is unknown
		return
	}
	s.charge(w, r, op, ChargeRequest{Key: opID.StepKey("charge"), Amount: amount, Currency: *req.Currency, Description: req.Description})
}

// rebuild answers a replay: the payment the stored pointer names, encoded
// as the first answer was. A payment the store no longer has (its row
// deleted by hand) is answered with the stored status and no body. A
// store that fails to read it is answered 503, not as a replay: the
// client retries, and gets the payment once the store is back.
func (s *Service) rebuild(w http.ResponseWriter, r *http.Request, res idemkv.Result) {
	id, _ := strings.CutPrefix(res.Pointer, "/v1/payments/")
	tenant, err := s.tenantOf(r) // the principal whose record this is
	var p stored
	if err == nil {
		p, err = s.load(r.Context(), tenant, id)
		if err != nil && !errors.Is(err, idemkv.ErrNotFound) && !errors.Is(err, errUnreadablePayment) {
			w.Header().Del(httpidem.HeaderReplayed)
			w.Header().Del("Location")
			s.storeError(w, err)
			return
		}
	}
	if err != nil {
		w.Header().Set("Content-Length", "0")
		w.WriteHeader(res.Status)
		return
	}
	writeJSON(w, res.Status, p.Payment)
}

// load reads tenant's payment id.
func (s *Service) load(ctx context.Context, tenant, id string) (stored, error) {
	var p stored
	if id == "" || len(id) > 64 {
		return p, idemkv.ErrNotFound
	}
	v, err := s.cfg.Store.GetData(ctx, paymentKey(tenant, id))
	if err != nil {
		return p, err
	}
	if err := json.Unmarshal(v, &p); err != nil {
		return p, fmt.Errorf("%w: %s: %v", errUnreadablePayment, id, err)
	}
	return p, nil
}

// errUnreadablePayment is a stored payment that does not decode.
var errUnreadablePayment = errors.New("payments: stored payment unreadable")

func (s *Service) get(w http.ResponseWriter, r *http.Request) {
	tenant, err := s.tenantOf(r)
	if err != nil {
		w.Header().Set("WWW-Authenticate", challenge)
		httpidem.WriteProblem(w, httpidem.ProblemUnauthenticated, http.StatusUnauthorized, err.Error(), 0)
		return
	}
	p, err := s.load(r.Context(), tenant, r.PathValue("id"))
	switch {
	case errors.Is(err, idemkv.ErrNotFound) || (err == nil && p.Tenant != tenant):
		httpidem.WriteProblem(w, "not-found", http.StatusNotFound, "no such payment", 0)
	case err != nil:
		s.storeError(w, err)
	default:
		writeJSON(w, http.StatusOK, p.Payment)
	}
}

// List limits.
const (
	defaultListLimit = 100
	maxListLimit     = 1000
)

func (s *Service) list(w http.ResponseWriter, r *http.Request) {
	tenant, err := s.tenantOf(r)
	if err != nil {
		w.Header().Set("WWW-Authenticate", challenge)
		httpidem.WriteProblem(w, httpidem.ProblemUnauthenticated, http.StatusUnauthorized, err.Error(), 0)
		return
	}
	limit := defaultListLimit
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxListLimit {
			httpidem.WriteProblem(w, "invalid-query", http.StatusBadRequest, fmt.Sprintf("limit must be 1 to %d", maxListLimit), 0)
			return
		}
		limit = n
	}
	// A page resumes after the payment named by starting_after, one of
	// the caller's own.
	var after []byte
	if id := r.URL.Query().Get("starting_after"); id != "" {
		p, err := s.load(r.Context(), tenant, id)
		switch {
		case errors.Is(err, idemkv.ErrNotFound) || (err == nil && p.Tenant != tenant):
			httpidem.WriteProblem(w, "invalid-query", http.StatusBadRequest, "starting_after names no payment of this account", 0)
			return
		case err != nil:
			s.storeError(w, err)
			return
		}
		after = indexKey(tenant, p.Created, p.ID)
	}
	var ids []string
	more := false
	err = s.cfg.Store.ScanDataAfter(r.Context(), indexPrefix(tenant), after, func(_, v []byte) bool {
		if len(ids) == limit {
			more = true
			return false
		}
		ids = append(ids, string(v))
		return true
	})
	if err != nil {
		s.storeError(w, err)
		return
	}
	out := struct {
		Data    []Payment `json:"data"`
		HasMore bool      `json:"has_more"`
	}{Data: make([]Payment, 0, len(ids)), HasMore: more}
	for _, id := range ids {
		p, err := s.load(r.Context(), tenant, id)
		if err != nil {
			s.storeError(w, err)
			return
		}
		out.Data = append(out.Data, p.Payment)
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Service) healthz(w http.ResponseWriter, r *http.Request) {
	if err := s.cfg.Store.Health(r.Context()); err != nil {
		// The reason, for the operator; it names no key or account.
		httpidem.WriteProblem(w, httpidem.ProblemStoreUnavailable, http.StatusServiceUnavailable, err.Error(), httpidem.StoreRetryAfter)
		return
	}
	_, err := s.cfg.Store.Get(r.Context(), idemkv.ID{Tenant: "healthz", Endpoint: "healthz", Key: "healthz"})
	if err != nil && !errors.Is(err, idemkv.ErrNotFound) {
		s.storeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Write([]byte("ok\n"))
}

func (s *Service) storeError(w http.ResponseWriter, err error) {
	s.cfg.Logger.Error("payments: store error", "err", err)
	httpidem.WriteProblem(w, httpidem.ProblemStoreUnavailable, http.StatusServiceUnavailable, "the store is unavailable", httpidem.StoreRetryAfter)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	b = append(b, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	w.Write(b)
}
