package httpidem

import (
	"net/http"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fingerprint"
)

// Route configures how one handler is protected. The zero Route protects
// POST and PATCH, lets a request without a key run unprotected, answers a
// concurrent duplicate 409 at once, and fails closed when the store is
// down.
type Route struct {
	// Pattern is the route pattern that scopes keys and is fingerprinted,
	// for example "/v1/payments/{id}"; its {wildcards}, as the router set
	// them (Request.PathValue), and the path past it are the path
	// parameters fingerprinted. Default: the pattern the request matched
	// in an http.ServeMux (Request.Pattern), without its method and host.
	// A request with neither, or with no value for one of its wildcards,
	// is answered 500 (a configuration error).
	Pattern string

	// Methods are the methods protected. Default: POST and PATCH. Other
	// methods pass through untouched.
	Methods []string

	// Require makes the Idempotency-Key header mandatory: a request
	// without it is answered 400. Without Require such a request runs
	// unprotected.
	Require bool

	// Mode is where the handler's effect lives. idemkv.ModeLocal (the
	// default): the effect is writes committed through Op.Apply, together
	// with the outcome; the claim need not be durable. idemkv.ModeRemote:
	// the handler calls something outside the store; the claim is durable
	// before the handler runs and carries an OperationID to send
	// downstream (Op.Lease).
	Mode idemkv.Mode

	// Resumable declares that the downstream deduplicates on the
	// OperationID, so a remote claim whose holder died may be taken over
	// and re-sent (idemkv.ClaimRequest.Resumable).
	Resumable bool

	// Lease bounds how long the handler may run without renewing its
	// lease before another request may take the key over; the heartbeat
	// (Heartbeat) renews it for that long at every beat. Default: the
	// store's.
	Lease time.Duration

	// Heartbeat is how often the lease is renewed while the handler runs
	// (idemkv.Store.Renew, fenced on the lease's token, for Lease). A
	// handler slower than its lease then keeps its key, and a retry takes
	// it over only from a holder that stopped: one that crashed, or
	// stalled (the heartbeat could not renew) for longer than a lease.
	// The heartbeat stops when the handler returns (or its response
	// starts to stream), before the outcome is committed, and for good
	// once a renewal is fenced (another attempt took the key over; the
	// outcome is then not stored: 409 lease-lost). A renewal that fails
	// otherwise is logged at Warn and tried again at the next beat. The
	// beats are timed by Options.Clock. Default (zero): a third of the
	// lease, so that two beats can fail before the lease runs out. Must
	// be shorter than a positive Lease. A negative Heartbeat turns the
	// heartbeat off: the lease is never renewed, and a handler that
	// outlives it can be taken over while it still runs. Each beat costs
	// a store write (a durable one in a remote route).
	Heartbeat time.Duration

	// Retention names the store's retention class for this route's
	// outcomes. Default: the store's default class.
	Retention string

	// Fingerprint says which parts of the request bind the key
	// (fingerprint.Options); its MaxBodySize also bounds the request body
	// read (413 above it). Set Diagnostics to name, in a 422, the fields
	// of a mismatching retry that differ.
	Fingerprint *fingerprint.Options

	// ReplayHeaders are the response headers stored and replayed with
	// the status and body. Default: DefaultReplayHeaders. Others (Date,
	// per-attempt trace ids) are not replayed.
	ReplayHeaders []string

	// MaxStoredBody is the largest response body buffered and stored for
	// a byte-exact replay. Default: DefaultMaxStoredBody. A response that
	// grows past it, or that the handler flushes, has its outcome stored
	// without the body (status, replayable headers and pointer) at that
	// moment, and streams; its replays are rebuilt by Rebuild.
	MaxStoredBody int

	// PointerOnly stores the outcomes that have a pointer without their
	// bodies: the status, the replayable headers and the pointer, the
	// compact record the guide sizes its store by (tens of bytes instead
	// of the body's hundreds). Their replays are rebuilt by Rebuild, which
	// PointerOnly requires: use it when the created object can be served
	// again exactly as it was first returned (an immutable payment, say).
	// Outcomes without a pointer (a 422, say) keep their bodies. Responses
	// are still buffered (up to MaxStoredBody) and sent only once the
	// outcome is stored.
	PointerOnly bool

	// Wait, if positive, makes a request whose key is held by another
	// request wait for it, up to Wait, and then answer with its outcome
	// (or run, if it released the key). Neither kind of wait polls: a
	// request of this process is waited for in memory, one of another
	// process through the store's notifications, if the store has them
	// (idemkv.Watcher: pgstore does) and otherwise not at all. A key
	// still held after Wait is answered 409 with Retry-After.
	Wait time.Duration

	// FailOpen runs the handler unprotected when the store fails, instead
	// of answering 503. Only for handlers that are harmless to run twice:
	// money must not run unprotected.
	FailOpen bool

	// Storable decides from the response status whether the outcome is
	// final: stored and replayed to retries, or not. One that is not is
	// released so that a retry runs anew in a local route; in a remote
	// route it marks the key uncertain unless the handler called
	// Op.Release. ValidationFailure is asked first: a validation failure
	// is released whatever Storable says. Default: DefaultStorable.
	Storable func(status int) bool

	// ValidationFailure decides from the response status whether the
	// response declares the request invalid: refused before it began to
	// execute, with nothing done. Such a response is neither stored nor
	// marked uncertain, in a local route or a remote one: the key is
	// released, so that the corrected request, sent with the same key,
	// runs anew instead of meeting a 422 key-mismatch (Stripe saves no
	// result for a request that failed validation before it began
	// executing either). Writes added with Op.Apply are dropped with it.
	// A handler can also declare it whatever the status, with Op.Invalid.
	// Default: DefaultValidationFailure, 400 and 422. A handler that may
	// answer 400 or 422 after it acted (a downstream call made, a write
	// outside Op.Apply committed) must not rely on the default, or its
	// effect would run again under the same key: give such a route
	// ValidationFailure: func(int) bool { return false }, which turns the
	// rule off (every 400 and 422 is then stored, as Storable says), and
	// call Op.Invalid where the input was refused before any effect.
	ValidationFailure func(status int) bool

	// Rebuild answers a replay of an outcome stored without its body (a
	// response larger than MaxStoredBody, or streamed). The status and
	// replayable headers are already in w's header map but not written;
	// Rebuild writes the rest, typically from res.Pointer. Default: the
	// stored status, the replayable headers, Location set to the pointer,
	// and an empty body.
	Rebuild func(w http.ResponseWriter, r *http.Request, res idemkv.Result)
}

// DefaultStorable is the default Route.Storable: 2xx, 3xx and 4xx
// responses are final, except 408, 425 and 429, which like every 5xx say
// "try again" rather than "this is the answer". In a local route such a
// response releases the key and a retry runs anew; in a remote route it
// marks the key uncertain, unless the handler called Op.Release to say
// the downstream never acted. A 400 or a 422 is final too, but by
// default it is a validation failure (Route.ValidationFailure, asked
// first), which is released rather than stored.
func DefaultStorable(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return status >= 200 && status < 500
}

// DefaultValidationFailure is the default Route.ValidationFailure: a 400
// (Bad Request) or a 422 (Unprocessable Content) is taken to refuse the
// request's input before the handler did anything, so it is not stored
// and the key is released. Other 4xx (a 402 declined, a 409 out of stock)
// are business answers, stored and replayed as Storable says.
func DefaultValidationFailure(status int) bool {
	return status == http.StatusBadRequest || status == http.StatusUnprocessableEntity
}
