package payments

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkv/idemkv/engine"
)

// FuzzCreatePayment sends any body to POST /v1/payments (through the
// middleware and the handler, on a real engine): the answer is always a
// 201, a 400 or a 422, never a 5xx or a panic, and a 201 carries JSON.
func FuzzCreatePayment(f *testing.F) {
	for _, s := range []string{
		`{"amount": 5000, "currency": "USD", "card": "tok_123"}`,
		`{"amount": -1, "currency": "usd"}`, `{"amount": 1.5, "currency": "USD", "card": "x"}`,
		`{"amount": 1e400}`, `[]`, `null`, `{"amount":`, `{"a":1,"a":2}`, "",
		`{"amount": 9223372036854775808, "currency": "USD", "card": "x"}`,
		`{"amount": 1, "currency": "USD", "card": "x", "description": "` + strings.Repeat("d", 600) + `"}`,
	} {
		f.Add(s)
	}
	eng, err := engine.Open(f.TempDir(), &engine.Options{NoBackgroundSweep: true})
	if err != nil {
		f.Fatal(err)
	}
	defer eng.Close()
	svc, err := New(Config{Store: eng})
	if err != nil {
		f.Fatal(err)
	}
	h := svc.Handler()
	var n atomic.Int64
	f.Fuzz(func(t *testing.T, body string) {
		req := httptest.NewRequest("POST", "/v1/payments", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer acct_fuzz")
		req.Header.Set("Idempotency-Key", fmt.Sprintf("fuzz-%d", n.Add(1)))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		switch w.Code {
		case http.StatusCreated:
			if ct := w.Header().Get("Content-Type"); ct != "application/json" {
				t.Fatalf("201 with Content-Type %q", ct)
			}
		case http.StatusBadRequest, http.StatusUnprocessableEntity:
			if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
				t.Fatalf("%d with Content-Type %q", w.Code, ct)
			}
		default:
			t.Fatalf("body %q: status %d: %s", body, w.Code, w.Body.String())
		}
	})
}
