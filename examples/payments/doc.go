// Package payments is an example of embedding idemkv in a service: a
// small card-payments API whose POST /v1/payments is protected by the
// Idempotency-Key middleware (package httpidem) on any idemkv.DataStore
// (the Pebble engine for one process, pgstore for a fleet), in front of a
// simulated card processor. `idemkv
// serve` runs it and `idemkv demo` plays the guide's failure modes
// against it over HTTP. It is meant to be read, and copied from.
//
// Run it with
//
//	go run ./cmd/idemkv serve
//
// and pay with curl (README.md shows a session, docs/http.md the
// protocol and the metrics).
//
// What it shows:
//
//   - A remote, resumable route. The claim is durable before the
//     processor is called (idemkv.ModeRemote), and the processor is sent
//     the claim's OperationID as its own idempotency key. A crash, or a
//     request that outlives its lease, between the charge and the answer
//     cannot lead to a second charge: the retry resumes the same
//     operation and the processor deduplicates it.
//   - Business writes that commit with the outcome. The payment row and
//     its index entry go through httpidem.Op.Apply, in the same atomic
//     batch as the stored response: a payment exists exactly when its
//     retries can be replayed, and an attempt fenced off by a takeover
//     writes neither.
//   - Compact outcomes. Payments never change, so the route stores only
//     the status and a pointer (httpidem.Route.PointerOnly) and rebuilds
//     a replay from the payment row, byte for byte.
//   - Uncertain outcomes. A processor timeout marks the key uncertain and
//     answers 504; its retries get 409 reconciling, never a second
//     charge.
//   - Calls with deadlines. Each charge carries the end of its attempt's
//     lease, or Config.CallTimeout past its send if sooner
//     (ChargeRequest.Deadline), and the processor refuses one that
//     reaches it later. A call held back by a paused process or a slow
//     network therefore cannot charge after the reconciler, asking a
//     grace past that moment, heard "no charge".
//   - Metrics on the service's own registry: the middleware's reports
//     through an httpidem.Observer, and the engine's figures through
//     package engine/engineprom when the store is an *engine.Engine.
//
// # Basics
//
//	e, err := engine.Open("idemkv-data", nil)
//	svc, err := payments.New(payments.Config{Store: e}) // a simulated processor, on the store's clock
//	err = http.ListenAndServe("127.0.0.1:8080", svc.Handler())
//
// Routes: POST /v1/payments (Idempotency-Key required), GET
// /v1/payments/{id}, GET /v1/payments (newest first; limit,
// starting_after), GET /healthz and GET /metrics. The account is the
// bearer token: "Authorization: Bearer acct_1".
//
// # Caveats
//
//   - The processor is simulated (Provider). Given a Ledger (idemkv serve
//     gives it an engine under DATA/processor) it keeps its charges
//     durably, as a remote processor does, so a restart cannot make it
//     deny a charge; without one it keeps them in memory and forgets them
//     when the process ends, and a charge resumed after a restart is then
//     charged anew. It lives in one process: services sharing a
//     PostgreSQL store must share a processor of their own
//     (ProcessorClient; idemkv serve --store requires --processor).
//   - An uncertain payment stays uncertain, and its retries answer 409,
//     until a reconcile.Worker asks the processor through the service's
//     Reconcile (idemkv serve runs one), or an operator settles it
//     through its Settle (idemkv resolve).
//   - Authentication is a stand-in: the bearer token is taken as the
//     account, unchecked.
package payments
