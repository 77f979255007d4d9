// Package fingerprint decides when two requests are the same request. An
// idempotency key names one logical operation; its fingerprint binds the
// key to that operation, so that a retry replays the stored outcome while
// a different request sent under the same key is refused as a Mismatch
// (HTTP 422) instead of being answered with someone else's result.
//
// A fingerprint covers everything that defines the operation: the tenant
// (principal), the HTTP method, the route pattern and its path parameters,
// the body, and the headers and query parameters the caller names. It is
// the algorithm version (one byte) followed by a 64-bit xxhash of a
// tagged, length-prefixed canonical encoding of those parts: 9 bytes,
// well within idemkv.MaxFingerprintLen.
//
// What is guaranteed:
//
//   - Stability. A fingerprint, once stored, keeps matching its retries in
//     every later release. Each version's algorithm is frozen (pinned by
//     vectors in testdata that must never change); a change to it is a new
//     version, and Matches checks a stored fingerprint with the version it
//     names. An upgrade never turns a legitimate retry into a mismatch.
//   - No collisions by construction. Every part is tagged and
//     length-prefixed, so no two different requests have the same encoding
//     (tenant "ab" with method "c" is not tenant "a" with method "bc"; an
//     absent header is not an empty one). Different encodings collide only
//     through the 64-bit hash.
//   - Formatting does not matter in ModeJSON: whitespace, member order,
//     string escapes and number spelling (1, 1.0, 1e0, 10e-1) give the same
//     fingerprint. The body is put in RFC 8785 (JCS) canonical form first.
//   - Errors, never panics. A body that cannot be fingerprinted is a
//     *BodyError matching ErrInvalidBody, with the offset of the problem:
//     the client's fault, a 400. Bad Options are ErrInvalidOptions: the
//     caller's fault.
//
// # Basics
//
//	opts := &fingerprint.Options{Headers: []string{"Api-Version"}}
//	fp, err := fingerprint.Compute(fingerprint.Request{
//		Tenant: accountID, Method: r.Method, Route: "/v1/payments/{id}",
//		Params: map[string]string{"id": id}, Header: r.Header, Body: body,
//	}, opts)
//	if errors.Is(err, fingerprint.ErrInvalidBody) {
//		return badRequest(err) // "fingerprint: malformed JSON at offset 17: ..."
//	}
//	c, err := store.Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: fp.Bytes})
//
// On a Mismatch, ask Matches whether the stored fingerprint, computed by an
// older version, matches the request after all, and if so claim with the
// stored bytes (the example is on Matches).
//
// Body modes: ModeJSON (the default) hashes the JCS form of the body;
// ModeRaw hashes its exact bytes; ModeFields hashes only the members
// selected by JSON Pointers, for APIs whose bodies carry volatile fields
// such as a client timestamp. In every mode an empty body counts as no
// body.
//
// To learn which part of a mismatching retry differs, set
// Options.Diagnostics: Compute then also returns FP.Diagnostics, a digest
// per part (per top-level member of a JSON object body) that the caller
// stores beside the record, and Explain names the parts whose digests
// differ ("body /amount: changed"). The command "idemkv fingerprint" prints
// a request's canonical form and fingerprint, to debug a 422 by hand.
//
// # Caveats
//
//   - Canonical JSON is not semantic equivalence. JCS removes differences of
//     notation only. "5000" and 5000, 50.0 and "50.00", {"a":null} and {},
//     [1,2] and [2,1] are all different requests; so are two bodies that
//     mean the same order to your business but spell it differently.
//     Decide what the operation is and choose the mode, the fields and the
//     headers accordingly.
//   - Numbers are IEEE-754 doubles, as JCS requires. A number a double
//     cannot hold exactly (an integer beyond 2^53, a decimal beyond 17
//     significant digits) is refused with ErrInexactNumber, since
//     9007199254740993 and 9007199254740992 would fingerprint the same;
//     with Options.InexactNumbers it is rounded instead, and they do.
//     Send such values (ids, big amounts) as strings, or use ModeRaw or a
//     field that holds them as a string.
//   - Duplicate member names, invalid UTF-8, lone surrogates, numbers
//     beyond float64 and nesting beyond Options.MaxDepth are errors, even
//     where a lenient parser would accept them: the fingerprint must not
//     depend on which duplicate a parser keeps.
//   - Options are part of what a fingerprint means. Changing an endpoint's
//     mode, fields or named headers while its records are retained makes
//     the retries of earlier requests mismatch, just as changing the
//     request would. Roll such a change out under a new endpoint name, or
//     after the retention window.
//   - The query string is not covered unless its parameters are named in
//     Options.Query.
//   - Diagnostics digests are 32 bits of an unsalted hash: they hide values
//     from a casual reader of the store, not from someone who can guess a
//     low-entropy value (a currency, an amount) and hash it. Keep them as
//     confidential as the records.
//   - A rollback to a release that does not know a stored version cannot
//     check it: Matches returns ErrUnknownVersion, and the request should
//     be refused rather than run.
package fingerprint
