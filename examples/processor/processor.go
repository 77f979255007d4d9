package processor

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/fingerprint"
	"github.com/idemkv/idemkv/httpidem"
)

// Faults a call may meet (Options.Fault).
var (
	// ErrRefuse: the call is refused before anything is charged (503).
	ErrRefuse = errors.New("processor: refused before charging")
	// ErrTimeout: the charge is made and committed, and the answer is
	// never sent: the call is held until the caller gives up (or
	// Options.Hold passes), then answered 504.
	ErrTimeout = errors.New("processor: charged, and the answer lost")
)

// Options configure a Server.
type Options struct {
	// Store keeps the charges and their idempotency keys. Required. Its
	// retention bounds how long a key is deduplicated and looked up: keep
	// it longer than a caller can take to reconcile.
	Store *engine.Engine
	// Latency is how long each charge request takes before anything
	// happens.
	Latency time.Duration
	// FailRate is the fraction of charge requests refused before
	// charging; TimeoutRate the fraction charged and then left without an
	// answer.
	FailRate, TimeoutRate float64
	// Hold is how long a charge that "times out" holds its call before
	// answering 504, if the caller has not given up first. Default: 30 s.
	Hold time.Duration
	// Fault, if set, decides each charge request's fault instead of the
	// rates: nil, ErrRefuse or ErrTimeout. key is its Idempotency-Key.
	Fault func(ctx context.Context, key string) error
	// Rand draws the faults. Default: a random seed.
	Rand *rand.Rand
	// Logger. Default: slog.Default().
	Logger *slog.Logger
}

// Charge is one charge, as the API returns it.
type Charge struct {
	ID          string    `json:"id"`
	Key         string    `json:"key"`
	Amount      int64     `json:"amount"`
	Currency    string    `json:"currency"`
	Description string    `json:"description,omitempty"`
	Created     time.Time `json:"created"`
}

// Stats counts a server's charge requests since New.
type Stats struct {
	Calls    int64 // charge requests received
	Refused  int64 // refused before charging (503)
	Expired  int64 // refused for arriving after their deadline (503)
	Charges  int64 // charges made
	TimedOut int64 // charges made whose answer was withheld (not replays)
}

// Server is the simulated processor.
type Server struct {
	o       Options
	handler http.Handler

	mu    sync.Mutex
	rnd   *rand.Rand
	stats Stats

	betweenReads func() // a test's, run by lookup between its two reads
}

// merchant is the one tenant of the processor's idempotency keys: it
// simulates one merchant's account.
const merchant = "merchant"

// New builds the server and its routes.
func New(o Options) (*Server, error) {
	if o.Store == nil {
		return nil, errors.New("processor: Options.Store is required")
	}
	if o.FailRate < 0 || o.TimeoutRate < 0 || o.FailRate+o.TimeoutRate > 1 {
		return nil, fmt.Errorf("processor: fail rate %v and timeout rate %v must be fractions summing to at most 1", o.FailRate, o.TimeoutRate)
	}
	if o.Hold <= 0 {
		o.Hold = 30 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	s := &Server{o: o, rnd: o.Rand}
	if s.rnd == nil {
		s.rnd = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	m, err := httpidem.New(&httpidem.Options{Store: o.Store, Logger: o.Logger,
		Tenant: func(*http.Request) (string, error) { return merchant, nil }})
	if err != nil {
		return nil, err
	}
	charge, err := m.Wrap(http.HandlerFunc(s.charge), httpidem.Route{
		Require:     true,
		Mode:        idemkv.ModeLocal, // the charge is a row in this store, committed with its key
		Fingerprint: &fingerprint.Options{Mode: fingerprint.ModeJSON, MaxBodySize: 4 << 10},
	})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle(chargeEndpoint, s.faults(charge))
	mux.HandleFunc("GET /v1/charges/{key}", s.lookup)
	mux.HandleFunc("GET /v1/charges", s.list)
	s.handler = mux
	return s, nil
}

// Handler returns the HTTP API.
func (s *Server) Handler() http.Handler { return s.handler }

// Stats returns the server's counts.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

func (s *Server) count(fn func(*Stats)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fn(&s.stats)
}

// chargeEndpoint is the endpoint of the charge route's idempotency keys.
const chargeEndpoint = "POST /v1/charges"

// chargeKey is the data key of the charge made under an idempotency key.
func chargeKey(key string) []byte { return []byte("charge/" + key) }

type chargeRequest struct {
	Amount      int64  `json:"amount"`
	Currency    string `json:"currency"`
	Description string `json:"description"`
}

// charge makes a charge; the middleware around it deduplicates on the
// Idempotency-Key header and replays the first answer to every retry.
func (s *Server) charge(w http.ResponseWriter, r *http.Request) {
	op := httpidem.FromContext(r.Context())
	if !s.inTime(w, r) {
		return
	}
	var req chargeRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, 4<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		httpidem.WriteProblem(w, "invalid-charge", http.StatusBadRequest, err.Error(), 0)
		return
	}
	if req.Amount <= 0 || len(req.Currency) != 3 || len(req.Description) > 500 {
		httpidem.WriteProblem(w, "invalid-charge", http.StatusUnprocessableEntity,
			"amount must be positive, currency three letters, description at most 500 bytes", 0)
		return
	}
	c := Charge{ID: "ch_" + randomHex(8), Key: op.Lease().ID.Key, Amount: req.Amount, Currency: req.Currency,
		Description: req.Description, Created: s.o.Store.Now().UTC()}
	row, _ := json.Marshal(c)
	if err := op.Apply(func(fx idemkv.Effects) error { return fx.Set(chargeKey(c.Key), row) }); err != nil {
		httpidem.WriteProblem(w, "internal", http.StatusInternalServerError, err.Error(), 0)
		return
	}
	s.count(func(st *Stats) { st.Charges++ })
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	w.Write(row)
}

// inTime refuses, and answers, a charge request that arrived after the
// deadline its caller sent (the Charge-Deadline header), by the store's
// clock: 503 call-expired, nothing charged, and the key free again. A
// request under a key already charged never gets here: the middleware
// replays the charge. It reports whether the request may go on.
func (s *Server) inTime(w http.ResponseWriter, r *http.Request) bool {
	v := r.Header.Get(HeaderDeadline)
	if v == "" {
		return true
	}
	deadline, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		httpidem.WriteProblem(w, "invalid-deadline", http.StatusBadRequest,
			HeaderDeadline+" must be an RFC 3339 time, such as 2026-12-07T20:21:00.5Z: "+err.Error(), 0)
		return false
	}
	if now := s.o.Store.Now(); now.After(deadline) {
		s.count(func(st *Stats) { st.Expired++ })
		httpidem.WriteProblem(w, "call-expired", http.StatusServiceUnavailable, fmt.Sprintf(
			"the call arrived at %s, after its deadline %s; nothing was charged", now.UTC().Format(time.RFC3339Nano), v), 0)
		return false
	}
	return true
}

// HeaderDeadline is the request header a caller sends its call's
// deadline in: the last moment, in RFC 3339, the call may be acted on.
const HeaderDeadline = "Charge-Deadline"

// lookup answers the charge made under an idempotency key, or 404.
func (s *Server) lookup(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	if err := idemkv.ValidateKey(key); err != nil {
		httpidem.WriteProblem(w, "invalid-key", http.StatusBadRequest, err.Error(), 0)
		return
	}
	// The key's record first: a request under it may be charging now,
	// and "no charge" would then be wrong a moment later. Read after it,
	// the row is there if its charge committed (row and record commit
	// together); read before, a charge committing in between would be
	// missed.
	rec, err := s.o.Store.Get(r.Context(), idemkv.ID{Tenant: merchant, Endpoint: chargeEndpoint, Key: key})
	switch {
	case err == nil && rec.State != idemkv.StateCompleted:
		httpidem.WriteProblem(w, httpidem.ProblemInProgress, http.StatusConflict,
			"a charge request under this key is being processed; ask again", time.Second)
		return
	case err != nil && !errors.Is(err, idemkv.ErrNotFound):
		httpidem.WriteProblem(w, "store-unavailable", http.StatusServiceUnavailable, err.Error(), time.Second)
		return
	}
	if s.betweenReads != nil {
		s.betweenReads()
	}
	row, err := s.o.Store.GetData(r.Context(), chargeKey(key))
	switch {
	case errors.Is(err, idemkv.ErrNotFound):
		httpidem.WriteProblem(w, "no-charge", http.StatusNotFound, "no charge was made under this key", 0)
	case err != nil:
		httpidem.WriteProblem(w, "store-unavailable", http.StatusServiceUnavailable, err.Error(), time.Second)
	default:
		w.Header().Set("Content-Type", "application/json")
		w.Write(row)
	}
}

// list answers every charge the store holds, by key.
func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	out := struct {
		Charges []json.RawMessage `json:"charges"`
	}{Charges: []json.RawMessage{}}
	err := s.o.Store.ScanData(r.Context(), []byte("charge/"), func(_, v []byte) bool {
		out.Charges = append(out.Charges, json.RawMessage(append([]byte(nil), v...)))
		return true
	})
	if err != nil {
		httpidem.WriteProblem(w, "store-unavailable", http.StatusServiceUnavailable, err.Error(), time.Second)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(out)
}

func randomHex(n int) string {
	b := make([]byte, n)
	crand.Read(b)
	return hex.EncodeToString(b)
}
