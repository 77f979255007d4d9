// Package httpidem protects net/http handlers with the Idempotency-Key
// header field (IETF draft-ietf-httpapi-idempotency-key-header) on any
// idemkv.Store: the first request with a key runs, its retries get the
// stored response back, and the same key with a different request is
// refused. docs/http.md describes the protocol in full.
//
// What is guaranteed, per route:
//
//   - Scoped and payload-bound. A key is scoped to the principal that
//     Options.Tenant returns and to the method and route pattern; it is
//     bound to the request's fingerprint (package fingerprint). A request
//     that reuses a key with a different payload gets 422, never someone
//     else's response.
//   - Stored before sent. The handler's response is buffered, its outcome
//     (and, for a local route, the writes the handler registered with
//     Op.Apply, in the same atomic commit) is stored, and only then is
//     the response sent: no client sees an answer a crash could take
//     back. A response too large to buffer is stored without its body at
//     the moment it starts to stream.
//   - Kept while it runs. The handler's lease is renewed while it runs
//     (Route.Heartbeat), so a retry takes a key over only from a holder
//     that stopped: one that crashed, or stalled for longer than a
//     lease. Until then a retry gets 409 in progress. A remote route's
//     handler calls Op.Sending right before its downstream call: a
//     handler that stalled renews its lease first, or, if a retry or a
//     reconciler has the key now, sends nothing.
//   - Replays are byte-identical: the stored status, the route's
//     replayable headers and body, plus "Idempotent-Replayed: true".
//   - Nothing held by accident. In a local route, transient answers (5xx,
//     408, 425, 429), panics and failed commits release the key. In a
//     remote route, where they prove nothing about the downstream, they
//     mark it uncertain (retries get 409 until it is resolved) unless the
//     handler calls Op.Release. A client that disconnects still has its
//     outcome recorded. Otherwise only a failing store can hold a key, and
//     only until its lease runs out.
//   - Validation failures are not stored. A 400 or 422 the handler
//     answers (Route.ValidationFailure), or any answer after Op.Invalid,
//     says the input was refused before anything was done: the key is
//     released, in a remote route too, so the corrected request runs
//     under the same key instead of meeting a 422 key-mismatch.
//   - Fail closed. When the store fails, requests get 503 with
//     Retry-After and the handler does not run, unless the route is
//     marked FailOpen.
//   - Bad input never reaches the store or the handler: a malformed key
//     (400), a missing principal (401), a body that cannot be
//     fingerprinted (400) or is too large (413). Every error the
//     middleware writes is application/problem+json (RFC 9457) with a
//     stable type URI.
//
// # Basics
//
//	m, err := httpidem.New(&httpidem.Options{Store: eng, Tenant: accountOf})
//	h, err := m.Wrap(http.HandlerFunc(create), httpidem.Route{Require: true})
//	mux.Handle("POST /v1/orders", h)
//
//	func create(w http.ResponseWriter, r *http.Request) {
//		op := httpidem.FromContext(r.Context())
//		op.Apply(func(fx idemkv.Effects) error { return fx.Set(key, row) })
//		w.WriteHeader(http.StatusCreated)
//	}
//
// Options.Logger gets a structured record of every state change a
// request causes (claimed, taken over, stored, released, marked
// uncertain) at Info, and of every failure at Warn or Error, each naming
// the tenant, endpoint, key_hash (idemkv.ID.Hash) and request_id
// (HeaderRequestID); never the raw key, unless Options.LogRawKeys, and
// never a body. Options.TracerProvider, if set, gives each request an
// OpenTelemetry span (SpanName) that the handler runs under:
//
//	m, err := httpidem.New(&httpidem.Options{Store: eng, Tenant: accountOf, TracerProvider: tp})
//
// docs/operations.md ("Logs and traces") lists the records and
// attributes.
//
// # Caveats
//
//   - Waiting (Route.Wait) for a key held by another process needs a
//     store that is an idemkv.Watcher (pgstore without NoListen); on any
//     other, such a key is answered 409 at once.
//   - Fingerprint diagnostics (the field names of a 422) are kept with
//     completed outcomes only: a mismatch against a request still running
//     names no fields.
//   - Informational (1xx) responses written by a handler are not relayed.
//   - The stored-body cap (Route.MaxStoredBody) must stay below the
//     store's own bound on result bodies (the engine's 64 KiB). An
//     outcome the store refuses as too large is stored with less, logged
//     at Warn, until the store takes it, dropping in turn: the fingerprint
//     diagnostics (a mismatch then names no fields), the replayable
//     headers but Content-Type, Content-Encoding and Location (one may
//     echo the client), the body with its Content-Encoding (replayed like
//     a streamed response's), the headers left.
//   - The key hash in logs and spans hides a key from their readers, not
//     from someone who can guess it: a short or sequential key can be
//     confirmed by hashing the candidates.
//   - The default Logger, slog.Default(), takes Info: a service that
//     keeps it logs two records per first request. Give a Logger with a
//     higher level to log failures only.
//   - The request id is not sent back on the response: a client that
//     wants its requests found in the logs sends X-Request-Id.
//   - Keys are scoped by the pattern's path, not its host: two patterns
//     for one path on two hosts share their keys (a key sent to both is
//     422). Give them distinct Route.Pattern values or principals.
package httpidem
