package bench

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	"github.com/idemkv/idemkv"
)

// Requests are derived from numbers, not stored: request i of stream s has
// the key, tenant, fingerprint, result and effect that Key, Fingerprint,
// Result and Effect compute from (s, i). So a measurement can re-derive
// any acknowledged request to verify it, and holds no key list in memory.
//
//   - Key: a UUID-like string (version-4 layout, 36 bytes) from a
//     SplitMix64 hash of (s, i).
//   - Tenant: "acct_" and one of Options.Tenants numbers; endpoint
//     "POST /v1/payments".
//   - Fingerprint: 9 bytes, a version byte and 8 bytes of hash, as a
//     request-body hash would be.
//   - Result: status 201 and a 32-byte pointer
//     ("/v1/payments/pay_" and 15 hex digits), and the body asked for.
//   - Effect: "payments/" + key = 16 bytes (amount, currency, time).
const endpoint = "POST /v1/payments"

// pointerLen is the length of every result pointer.
const pointerLen = 32

// splitmix64 is a fast, well-mixed 64-bit hash (Steele et al.).
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// reqHash is the request's identity hash.
func reqHash(stream, i uint64) uint64 { return splitmix64(stream<<40 ^ i ^ splitmix64(stream)) }

// Key returns request (stream, i)'s record ID, with its tenant one of
// tenants.
func Key(stream, i uint64, tenants int) idemkv.ID {
	h1 := reqHash(stream, i)
	h2 := splitmix64(h1)
	var u [16]byte
	for j := range 8 {
		u[j] = byte(h1 >> (8 * j))
		u[8+j] = byte(h2 >> (8 * j))
	}
	u[6] = u[6]&0x0f | 0x40 // version 4
	u[8] = u[8]&0x3f | 0x80 // RFC 4122 variant
	return idemkv.ID{
		Tenant:   "acct_" + strconv.FormatUint(splitmix64(h2)%uint64(max(1, tenants)), 10),
		Endpoint: endpoint,
		Key:      UUID(u),
	}
}

// UUID formats u as a UUID string: 36 characters, lower-case hex in the
// 8-4-4-4-12 groups.
func UUID(u [16]byte) string {
	var s [36]byte
	hex.Encode(s[0:8], u[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], u[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], u[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], u[8:10])
	s[23] = '-'
	hex.Encode(s[24:36], u[10:16])
	return string(s[:])
}

// Fingerprint returns request (stream, i)'s 9-byte fingerprint; other
// gives a different one for the same key (a mismatch).
func Fingerprint(stream, i uint64, other bool) []byte {
	h := splitmix64(reqHash(stream, i) ^ 0xf1)
	if other {
		h = ^h
	}
	fp := make([]byte, 9)
	fp[0] = 1
	for j := range 8 {
		fp[1+j] = byte(h >> (8 * j))
	}
	return fp
}

// Result returns the result request (stream, i) completes with.
func Result(stream, i uint64, body []byte) idemkv.Result {
	h := splitmix64(reqHash(stream, i) ^ 0x9e)
	p := "/v1/payments/pay_" + strconv.FormatUint(h|1<<60, 16)[:15]
	return idemkv.Result{Status: 201, Pointer: p, Body: body}
}

// Effect returns the local effect request (stream, i), whose ID is id,
// writes with its completion.
func Effect(id idemkv.ID, stream, i uint64) (key, value []byte) {
	h := reqHash(stream, i)
	v := make([]byte, 16)
	for j := range 8 {
		v[j] = byte(h >> (8 * j))
	}
	copy(v[8:], "USD\x00\x00\x00\x00\x01")
	return []byte("payments/" + id.Key), v
}

// ErrViolation is wrapped by the error a run fails with when a store
// breaks the idemkv contract: figures from a store that is wrong are
// worthless.
var ErrViolation = errors.New("bench: contract violation")

// Violation returns an error wrapping ErrViolation, formatted as
// fmt.Errorf formats.
func Violation(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrViolation}, args...)...)
}

// ClaimNew claims request (stream, i)'s key in mode with its own
// fingerprint, and fails with a violation unless the claim acquires it:
// the key is new.
func ClaimNew(ctx context.Context, s idemkv.Store, stream, i uint64, tenants int, mode idemkv.Mode) (idemkv.Claim, error) {
	id := Key(stream, i, tenants)
	c, err := s.Claim(ctx, idemkv.ClaimRequest{ID: id, Fingerprint: Fingerprint(stream, i, false), Mode: mode})
	if err == nil && c.Outcome != idemkv.Acquired {
		err = Violation("claim of new key %v: %v", id, c.Outcome)
	}
	return c, err
}
