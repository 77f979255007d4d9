package processor

import (
	"errors"
	"net/http"
	"time"

	"github.com/idemkv/idemkv/httpidem"
)

// faults wraps the charge route with the simulated failures: latency, a
// refusal before charging, and a charge whose answer is withheld.
func (s *Server) faults(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.count(func(st *Stats) { st.Calls++ })
		if s.o.Latency > 0 {
			t := time.NewTimer(s.o.Latency)
			select {
			case <-t.C:
			case <-r.Context().Done():
				t.Stop()
				return // the caller gave up before anything happened
			}
		}
		switch fault := s.draw(r); {
		case errors.Is(fault, ErrRefuse):
			s.count(func(st *Stats) { st.Refused++ })
			httpidem.WriteProblem(w, "processor-unavailable", http.StatusServiceUnavailable,
				"the processor is unavailable; nothing was charged", time.Second)
		case errors.Is(fault, ErrTimeout):
			d := &discard{header: http.Header{}}
			next.ServeHTTP(d, r) // charged and committed, unless refused or replayed
			if d.status == http.StatusCreated && d.header.Get(httpidem.HeaderReplayed) != "true" {
				s.count(func(st *Stats) { st.TimedOut++ })
			}
			t := time.NewTimer(s.o.Hold)
			select {
			case <-t.C:
			case <-r.Context().Done():
				t.Stop()
			}
			httpidem.WriteProblem(w, "processor-timeout", http.StatusGatewayTimeout,
				"the processor did not answer in time; the charge may have been made", 0)
		default:
			next.ServeHTTP(w, r)
		}
	})
}

// draw decides the fault of one charge request.
func (s *Server) draw(r *http.Request) error {
	if s.o.Fault != nil {
		return s.o.Fault(r.Context(), r.Header.Get("Idempotency-Key"))
	}
	s.mu.Lock()
	roll := s.rnd.Float64()
	s.mu.Unlock()
	switch {
	case roll < s.o.FailRate:
		return ErrRefuse
	case roll < s.o.FailRate+s.o.TimeoutRate:
		return ErrTimeout
	}
	return nil
}

// discard is a ResponseWriter that drops the answer of a charge whose
// answer is withheld.
type discard struct {
	header http.Header
	status int
}

func (d *discard) Header() http.Header { return d.header }
func (d *discard) Write(p []byte) (int, error) {
	if d.status == 0 {
		d.status = http.StatusOK
	}
	return len(p), nil
}
func (d *discard) WriteHeader(code int) {
	if d.status == 0 {
		d.status = code
	}
}
