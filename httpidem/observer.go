package httpidem

import "time"

// Disposition says what the middleware did with a request.
type Disposition string

// Dispositions, as reported to an Observer. They make good metric labels.
const (
	// Unprotected: the request ran without protection (no key on a route
	// where it is optional, or a fail-open route whose store failed).
	Unprotected Disposition = "unprotected"
	// Rejected: bad input (key, body, principal); nothing ran or was stored.
	Rejected Disposition = "rejected"
	// Stored: the handler ran and its outcome was stored.
	Stored Disposition = "stored"
	// Released: the handler ran; its outcome was transient, a validation
	// failure (Route.ValidationFailure, Op.Invalid) or declared without
	// effect (Op.Release), so the key was released for a retry.
	Released Disposition = "released"
	// Uncertain: the handler ran and reported an unknown outcome.
	Uncertain Disposition = "uncertain"
	// Replayed: a stored outcome was replayed.
	Replayed Disposition = "replayed"
	// Mismatch: the key was used with a different request (422).
	Mismatch Disposition = "mismatch"
	// Conflict: the key is held by a request still running (409).
	Conflict Disposition = "conflict"
	// Reconciling: an earlier attempt's outcome is unknown (409).
	Reconciling Disposition = "reconciling"
	// LeaseLost: the handler outlived its lease; another attempt took over.
	LeaseLost Disposition = "lease_lost"
	// StoreError: the store failed (503).
	StoreError Disposition = "store_error"
	// Panicked: the handler panicked; its key was given up.
	Panicked Disposition = "panicked"
)

// Report describes one request the middleware handled.
type Report struct {
	// Endpoint is the method and route pattern, "POST /v1/payments"; empty
	// when the request was rejected before its route was known.
	Endpoint    string
	Disposition Disposition
	// Status is the HTTP status sent (0 if the connection was aborted).
	Status int
	// Duration is the time spent in the middleware, handler included.
	Duration time.Duration
	// Err is the store error behind a StoreError, LeaseLost or Unprotected
	// (fail-open) disposition.
	Err error
	// Renewals counts the times the heartbeat renewed the request's lease
	// while its handler ran (Route.Heartbeat): zero for a handler quicker
	// than a beat. A handler that keeps a key for long shows here.
	Renewals int
}

// Observer receives a Report per request; implementations must be safe
// for concurrent use and quick (it runs on the request's goroutine).
type Observer interface {
	Observe(Report)
}

// ObserverFunc adapts a function to an Observer.
type ObserverFunc func(Report)

// Observe calls f(r).
func (f ObserverFunc) Observe(r Report) { f(r) }
