//go:build ignore

// Command generate writes engine/testdata/layout5: a small store in layout
// 5, written by the engine and HTTP middleware of the last commit that
// wrote layout 5 (879e426), and requests.json, what was sent to it and
// answered. The current code's upgrade tests open a copy of the store and
// replay the requests. It is engine/testdata/layout4/generate.go with
// another layout and commit: the same requests, so each fixture tests one
// migration.
//
// It compiles only against that commit's packages: run it from a copy of
// that commit's tree, never from the current tree (which writes layout 6):
//
//	mkdir /tmp/layout5 && git archive 879e426 | tar -x -C /tmp/layout5
//	mkdir /tmp/layout5/gen && cp engine/testdata/layout5/generate.go /tmp/layout5/gen/
//	(cd /tmp/layout5 && go run ./gen/generate.go /tmp/out)
//	rm -r engine/testdata/layout5/store && cp -r /tmp/out/store /tmp/out/requests.json engine/testdata/layout5/
//	rm engine/testdata/layout5/store/idemkv-claimfilter
//	rm -r /tmp/layout5
//
// Every request goes through httpidem over loopback HTTP, so the stored
// fingerprints are the ones the middleware computed, and every remote
// record stores its operation id, derived under the store's secret, in
// full. The engine reads a fake clock, so the fixture's records expire
// relative to its own time (requests.json's "start" and "end"), never the
// test machine's.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/fingerprint"
	"github.com/idemkv/idemkv/httpidem"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/ttl"
)

// The fixture's format, which the tests read (engine/upgrade_test.go).
type fixture struct {
	Layout    int               `json:"layout"`
	Commit    string            `json:"commit"`
	Start     time.Time         `json:"start"`
	End       time.Time         `json:"end"`
	Lease     int               `json:"lease_seconds"`
	Retention map[string]int    `json:"retention_seconds"`
	Routes    []route           `json:"routes"`
	Requests  []request         `json:"requests"`
	Effects   map[string]string `json:"effects"`
}

type route struct {
	Name         string   `json:"name"`
	Method       string   `json:"method"`
	Pattern      string   `json:"pattern"`
	Remote       bool     `json:"remote"`
	Resumable    bool     `json:"resumable"`
	Retention    string   `json:"retention"`
	LeaseSeconds int      `json:"lease_seconds"`
	BodyMode     string   `json:"body_mode"` // json, raw or fields
	Fields       []string `json:"fields,omitempty"`
	Headers      []string `json:"headers,omitempty"`
}

type request struct {
	Route   string            `json:"route"`
	Method  string            `json:"method"`
	Path    string            `json:"path"`
	Tenant  string            `json:"tenant"`
	Key     string            `json:"key"`
	Headers map[string]string `json:"headers,omitempty"`
	Body    string            `json:"body"`
	// Outcome is what the store holds for the key: completed (replayed),
	// released (nothing), uncertain, or abandoned (a remote claim whose
	// process stopped).
	Outcome string `json:"outcome"`
	// The answer the client got.
	Status       int    `json:"status"`
	ContentType  string `json:"content_type,omitempty"`
	Location     string `json:"location,omitempty"`
	ResponseBody string `json:"response_body"`
}

var t0 = time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)

var routes = []route{
	{Name: "create payment", Method: "POST", Pattern: "/v1/payments", Retention: "money", BodyMode: "json", Headers: []string{"X-Currency"}},
	{Name: "capture payment", Method: "PATCH", Pattern: "/v1/payments/{id}", BodyMode: "fields", Fields: []string{"/amount"}},
	{Name: "refund", Method: "POST", Pattern: "/v1/refunds", Remote: true, Resumable: true, LeaseSeconds: 30, BodyMode: "json"},
	{Name: "note", Method: "POST", Pattern: "/v1/notes", Retention: "short", BodyMode: "raw"},
}

var requests = []request{
	{Route: "create payment", Method: "POST", Path: "/v1/payments", Tenant: "acct_a", Key: "pay-1", Headers: map[string]string{"X-Currency": "EUR"}, Body: `{"amount": 100, "card": "tok_visa"}`},
	{Route: "create payment", Method: "POST", Path: "/v1/payments", Tenant: "acct_b", Key: "pay-1", Headers: map[string]string{"X-Currency": "USD"}, Body: `{"card":"tok_mc","amount":250}`},
	{Route: "create payment", Method: "POST", Path: "/v1/payments", Tenant: "acct_a", Key: "pay-declined", Headers: map[string]string{"X-Currency": "EUR"}, Body: `{"amount": -5, "card": "tok_visa"}`},
	{Route: "capture payment", Method: "PATCH", Path: "/v1/payments/pay_acct_a_pay-1", Tenant: "acct_a", Key: "cap-1", Body: `{"amount": 100, "memo": "not fingerprinted"}`},
	{Route: "refund", Method: "POST", Path: "/v1/refunds", Tenant: "acct_b", Key: "ref-ok", Body: `{"payment": "pay_acct_b_pay-1", "outcome": "ok"}`},
	{Route: "note", Method: "POST", Path: "/v1/notes", Tenant: "acct_b", Key: "note-1", Body: "remember the milk\n"},
	{Route: "refund", Method: "POST", Path: "/v1/refunds", Tenant: "acct_a", Key: "ref-timeout", Body: `{"payment": "pay_acct_a_pay-1", "outcome": "timeout"}`},
	// Last: the store closes while its handler runs.
	{Route: "refund", Method: "POST", Path: "/v1/refunds", Tenant: "acct_b", Key: "ref-hang", Body: `{"payment": "pay_acct_b_pay-1", "outcome": "hang"}`},
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: generate OUTDIR")
		os.Exit(2)
	}
	if err := generate(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "generate:", err)
		os.Exit(1)
	}
}

func generate(out string) error {
	dir := filepath.Join(out, "store")
	clock := fakeclock.New(t0)
	fx := fixture{Layout: 5, Commit: "879e426", Start: t0, Lease: 30,
		Retention: map[string]int{"": 24 * 3600, "money": 30 * 24 * 3600, "short": 3600}, Routes: routes}
	classes := ttl.Classes{}
	for c, s := range fx.Retention {
		if c != "" {
			classes[c] = time.Duration(s) * time.Second
		}
	}
	e, err := engine.Open(dir, &engine.Options{Clock: clock, Lease: 30 * time.Second, Retention: 24 * time.Hour,
		RetentionClasses: classes, NoBackgroundSweep: true, MemTableSize: 1 << 20, CacheSize: 1 << 20})
	if err != nil {
		return err
	}
	mw, err := httpidem.New(&httpidem.Options{Store: e, Tenant: func(r *http.Request) (string, error) {
		return strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "), nil
	}})
	if err != nil {
		return err
	}
	started, release := make(chan struct{}), make(chan struct{})
	mux := http.NewServeMux()
	for _, rt := range routes {
		h, err := mw.Wrap(handler(rt, started, release), httpRoute(rt))
		if err != nil {
			return err
		}
		mux.Handle(rt.Method+" "+rt.Pattern, h)
	}
	srv := httptest.NewServer(mux)
	defer srv.Close()

	for i := range requests {
		q := &requests[i]
		clock.Advance(time.Second)
		if q.Key == "ref-hang" {
			// The process stops while the refund runs: its remote claim
			// stays in progress on disk, abandoned once its lease ends.
			done := make(chan error, 1)
			go func() { done <- send(srv.URL, q) }()
			<-started
			fx.End = clock.Now()
			if err := e.Close(); err != nil {
				return err
			}
			close(release)
			if err := <-done; err != nil {
				return err
			}
			q.Outcome = "abandoned"
			continue
		}
		if err := send(srv.URL, q); err != nil {
			return err
		}
		q.Outcome = "completed"
		if q.Status == http.StatusUnprocessableEntity {
			// Layout 5's middleware releases the key of a request the
			// handler calls invalid: nothing is stored.
			q.Outcome = "released"
		}
		if q.Status == http.StatusGatewayTimeout {
			q.Outcome = "uncertain"
		}
	}
	fx.Requests = requests

	// The store as layout 5's own check sees it, and its effects.
	e, err = engine.Open(dir, &engine.Options{Clock: clock, ReadOnly: true, NoBackgroundSweep: true,
		RetentionClasses: classes})
	if err != nil {
		return err
	}
	rep, err := e.Check(context.Background())
	if err == nil && rep.ProblemCount > 0 {
		err = fmt.Errorf("check: %v", rep.Problems)
	}
	if err == nil {
		fx.Effects = map[string]string{}
		err = e.ScanData(nil, func(k, v []byte) bool {
			fx.Effects[string(k)] = string(v)
			return true
		})
	}
	if cerr := e.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(fx, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(out, "requests.json"), append(b, '\n'), 0o644)
}

func httpRoute(rt route) httpidem.Route {
	fp := &fingerprint.Options{Fields: rt.Fields, Headers: rt.Headers}
	switch rt.BodyMode {
	case "raw":
		fp.Mode = fingerprint.ModeRaw
	case "fields":
		fp.Mode = fingerprint.ModeFields
	}
	r := httpidem.Route{Pattern: rt.Pattern, Methods: []string{rt.Method}, Require: true, Retention: rt.Retention,
		Fingerprint: fp, Resumable: rt.Resumable, Lease: time.Duration(rt.LeaseSeconds) * time.Second}
	if rt.Remote {
		r.Mode = idemkv.ModeRemote
	}
	return r
}

// handler answers rt's requests. A payment writes itself as an effect,
// committed with its outcome.
func handler(rt route, started, release chan struct{}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		op := httpidem.FromContext(r.Context())
		tenant := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		key := op.Lease().ID.Key
		var in struct {
			Amount  int    `json:"amount"`
			Outcome string `json:"outcome"`
			Payment string `json:"payment"`
		}
		_ = json.Unmarshal(body, &in)
		switch rt.Name {
		case "create payment":
			if in.Amount <= 0 {
				w.Header().Set("Content-Type", "application/problem+json")
				w.WriteHeader(http.StatusUnprocessableEntity)
				fmt.Fprintf(w, `{"type":"https://example.com/declined","title":"amount must be positive","amount":%d}`, in.Amount)
				return
			}
			id := "pay_" + tenant + "_" + key
			pay := fmt.Sprintf(`{"id":%q,"amount":%d,"currency":%q,"status":"succeeded"}`, id, in.Amount, r.Header.Get("X-Currency"))
			_ = op.Apply(func(fx idemkv.Effects) error { return fx.Set([]byte("payments/"+id), []byte(pay)) })
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Location", "/v1/payments/"+id)
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, pay)
		case "capture payment":
			id := r.PathValue("id")
			_ = op.Apply(func(fx idemkv.Effects) error { return fx.Set([]byte("captures/"+id), body) })
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":%q,"captured":%d}`, id, in.Amount)
		case "refund":
			switch in.Outcome {
			case "timeout":
				op.Uncertain("provider timeout")
				w.WriteHeader(http.StatusGatewayTimeout)
				io.WriteString(w, "the provider did not answer\n")
				return
			case "hang":
				close(started)
				<-release
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"refund":"re_%s","payment":%q,"operation":%q}`, key, in.Payment, op.Lease().OperationID)
		case "note":
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			fmt.Fprintf(w, "noted %d bytes\n", len(body))
		}
	})
}

// send sends q and records the answer in it.
func send(base string, q *request) error {
	req, err := http.NewRequest(q.Method, base+q.Path, strings.NewReader(q.Body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+q.Tenant)
	req.Header.Set("Idempotency-Key", `"`+q.Key+`"`)
	for k, v := range q.Headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode >= 500 && resp.StatusCode != http.StatusGatewayTimeout && q.Key != "ref-hang" {
		return errors.New(q.Key + ": " + resp.Status + ": " + string(b))
	}
	q.Status, q.ResponseBody = resp.StatusCode, string(b)
	q.ContentType, q.Location = resp.Header.Get("Content-Type"), resp.Header.Get("Location")
	return nil
}
