// Package client is the caller's half of idempotency: one key per logical
// request, reused on every retry. Its Transport, an http.RoundTripper,
// gives each unsafe request (any method but GET, HEAD, OPTIONS and TRACE) a fresh
// Idempotency-Key unless the caller set one, keeps it across its own
// retries, and retries what may succeed later, with jittered exponential
// backoff that honours Retry-After: connection errors; 5xx, 408, 425 and
// 429; and those 409s that package httpidem answers when the same key
// should be sent again (problem types in-progress, reconciling and
// lease-lost: the first attempt is still running, its outcome is being
// reconciled, or another attempt took it over). It never retries another
// 409 (a business conflict such as out of stock), a 422 or any other 4xx.
//
// # Basics
//
//	c := client.New(nil, nil) // an *http.Client
//	resp, err := c.Post(url, "application/json", strings.NewReader(body))
//	if err == nil && client.Replayed(resp) {
//		// an earlier attempt did the work; this is its stored answer
//	}
//
// To retry a request later, after the Transport has given up (a job
// queue, a user pressing the button again), send it with the same key:
// give it one before the first send and keep it, and the Transport keeps
// it on every attempt.
//
//	key := client.SetKey(req) // stored with the job
//	resp, err := c.Do(req)
//
// # Caveats
//
//   - A body is sent again from the request's GetBody, which
//     http.NewRequest sets for *bytes.Buffer, *bytes.Reader and
//     *strings.Reader; other bodies are copied up to
//     Options.MaxBufferedBody, and a larger one is sent once, unretried.
//   - A key the Transport chose is fresh per RoundTrip, and is not set
//     on the caller's request: sending the same request again, or a new
//     one, without SetKey is a second operation.
//   - After MaxAttempts, or when the next wait would end past MaxElapsed
//     or the request's deadline, the last answer (a 409, a 503) or error
//     is returned as it is; the operation may still complete on the
//     server, and a later request with the same key learns its outcome.
//     Key(resp) tells the key of an answer; an error tells none, so a
//     caller that would retry after an error sets the key first.
//   - Retrying is safe only against a server that honours the key. A
//     server that ignores it runs a retried POST twice.
package client
