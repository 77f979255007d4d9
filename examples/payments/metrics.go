package payments

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/engine/engineprom"
	"github.com/idemkv/idemkv/httpidem"
)

// metrics registers the service's collectors and returns the observer
// that feeds the middleware's reports into them.
//
//	idemkv_http_requests_total{endpoint,disposition}  what the middleware did:
//	    stored, released, uncertain, replayed, mismatch, conflict,
//	    reconciling, rejected, unprotected, lease_lost, store_error, panicked
//	idemkv_http_request_duration_seconds{disposition}  latency in the middleware
//	idemkv_http_store_errors_total                     requests that met a store error
//	idemkv_payments_created_total                      payments committed
//	idemkv_provider_calls_total{result}                charged, declined, timeout, unavailable,
//	    expired (refused for arriving after its deadline: nothing charged),
//	    cancelled (the client went away: before the call, released; during it, uncertain),
//	    unknown (the call failed some other way: uncertain)
//	idemkv_engine_*                                    the engine's own (package engineprom)
func (s *Service) metrics() (httpidem.Observer, error) {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idemkv_http_requests_total",
		Help: "Requests handled by the idempotency middleware, by what it did with them.",
	}, []string{"endpoint", "disposition"})
	latency := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "idemkv_http_request_duration_seconds",
		Help:    "Time spent in the idempotency middleware, handler included.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16), // 100 µs to 3.3 s
	}, []string{"disposition"})
	storeErrors := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "idemkv_http_store_errors_total",
		Help: "Requests that met an error of the idempotency store.",
	})
	s.created = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "idemkv_payments_created_total",
		Help: "Payments committed.",
	})
	s.provider = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idemkv_provider_calls_total",
		Help: "Calls to the simulated card processor, by result.",
	}, []string{"result"})
	s.registry.MustRegister(requests, latency, storeErrors, s.created, s.provider,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if e, ok := s.cfg.Store.(*engine.Engine); ok {
		if err := engineprom.Register(s.registry, e); err != nil {
			return nil, err
		}
	}
	return httpidem.ObserverFunc(func(r httpidem.Report) {
		requests.WithLabelValues(r.Endpoint, string(r.Disposition)).Inc()
		latency.WithLabelValues(string(r.Disposition)).Observe(r.Duration.Seconds())
		if r.Err != nil {
			storeErrors.Inc()
		}
		// A payment is created when its outcome commits, which the
		// middleware reports; the handler only stages it.
		if r.Endpoint == paymentsEndpoint && r.Disposition == httpidem.Stored && r.Status == http.StatusCreated {
			s.created.Inc()
		}
	}), nil
}
