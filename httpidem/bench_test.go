package httpidem_test

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/httpidem"
)

// BenchmarkFirstRun is a new payment's request handled in process: bare,
// and behind the middleware (key check, fingerprint, claim, capture, and
// the completion committing the row with the stored response). The engine
// runs on Pebble's in-memory filesystem, so its syncs cost nothing and the
// figures are the CPU and the allocations the middleware adds; what the
// disk adds is `idemkv bench http`'s to measure.
func BenchmarkFirstRun(b *testing.B) {
	body := `{"amount":5000,"currency":"USD","card":"tok_visa"}`
	handler := func(commit func(r *http.Request, row []byte) error) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			row := []byte(`{"id":"pay_1","amount":5000,"currency":"USD","status":"succeeded"}`)
			if err := commit(r, row); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Location", "/v1/payments/pay_1")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(row)
		}
	}
	run := func(b *testing.B, h http.Handler) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			r := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(body))
			r.Header.Set("Authorization", "Bearer acct_"+strconv.Itoa(i%1000))
			r.Header.Set(httpidem.HeaderKey, fmt.Sprintf(`"8e03978e-40d5-43e8-bc93-%012d"`, i))
			r.Header.Set("Content-Type", "application/json")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != http.StatusCreated {
				b.Fatalf("status %d: %s", w.Code, w.Body)
			}
		}
	}

	b.Run("bare", func(b *testing.B) {
		run(b, handler(func(*http.Request, []byte) error { return nil }))
	})
	middleware := func(b *testing.B, opts httpidem.Options) {
		e, err := engine.Open("bench", &engine.Options{FS: vfs.NewMem(), NoBackgroundSweep: true})
		if err != nil {
			b.Fatal(err)
		}
		defer e.Close()
		opts.Store = e
		opts.Tenant = func(r *http.Request) (string, error) {
			return strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "), nil
		}
		m, err := httpidem.New(&opts)
		if err != nil {
			b.Fatal(err)
		}
		h, err := m.Wrap(handler(func(r *http.Request, row []byte) error {
			return httpidem.FromContext(r.Context()).Apply(func(fx idemkv.Effects) error {
				return fx.Set([]byte("pay/1"), row)
			})
		}), httpidem.Route{Require: true, Pattern: "/v1/payments"})
		if err != nil {
			b.Fatal(err)
		}
		run(b, h)
	}
	// The state changes logged at Info, as a service does, formatted and
	// thrown away: the cost of the records themselves.
	b.Run("middleware", func(b *testing.B) {
		middleware(b, httpidem.Options{Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	})
	// A logger whose level leaves the records out: what logging costs
	// when it is off.
	b.Run("middleware-nolog", func(b *testing.B) {
		middleware(b, httpidem.Options{Logger: slog.New(slog.DiscardHandler)})
	})
	// A span per request, recorded by the SDK and dropped (no exporter).
	b.Run("middleware-traced", func(b *testing.B) {
		middleware(b, httpidem.Options{Logger: slog.New(slog.DiscardHandler), TracerProvider: sdktrace.NewTracerProvider()})
	})
}
