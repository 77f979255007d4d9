package idemkv

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"slices"
	"sync"
)

// The downstream identity of a remote operation.

// OperationID is the stable identity of one logical remote operation: what
// a downstream that deduplicates on its idempotency key sees (through
// StepKey). A store derives it from the logical request, with
// DeriveOperationID under a secret of its own: the same on every attempt,
// after a takeover, after the record was released, resolved with no
// effect, evicted or expired and the request sent again. That is what
// lets a deduplicating downstream absorb a late call whatever the store
// concluded about it meanwhile. A record written before stores derived it
// keeps the random id it was given.
type OperationID [16]byte

// IsZero reports whether id is unset (local claims have none).
func (id OperationID) IsZero() bool { return id == OperationID{} }

// String returns id as 32 lower-case hex digits.
func (id OperationID) String() string { return hex.EncodeToString(id[:]) }

// operationIDDomain separates DeriveOperationID's MAC from any other use
// of a store's secret.
const operationIDDomain = "idemkv operation id v1"

// DeriveOperationID returns the OperationID of the logical request that
// id and fingerprint name, in the given generation: the first 16 bytes of
// HMAC-SHA256 under secret over the request's scope, key and
// fingerprint, each length-prefixed, and the generation. Without secret
// the id cannot be computed from outside the store, so a downstream key
// derived from it cannot be guessed and used first by someone else; with
// it, a store computes the same id for the same request on every claim.
// Stores call it; an application does not need to.
func DeriveOperationID(secret []byte, id ID, fingerprint []byte, generation uint32) OperationID {
	return deriveOperationID(hmac.New(sha256.New, secret), id, fingerprint, generation)
}

// OperationIDs derives operation ids under one secret, as
// DeriveOperationID does, without keying a new MAC for each: a store
// that derives one per claim keeps one. It is safe for concurrent use.
type OperationIDs struct {
	macs sync.Pool
}

// NewOperationIDs returns an OperationIDs for secret (copied).
func NewOperationIDs(secret []byte) *OperationIDs {
	key := slices.Clone(secret)
	return &OperationIDs{macs: sync.Pool{New: func() any { return hmac.New(sha256.New, key) }}}
}

// Derive returns DeriveOperationID(secret, id, fingerprint, generation).
func (o *OperationIDs) Derive(id ID, fingerprint []byte, generation uint32) OperationID {
	m := o.macs.Get().(hash.Hash)
	op := deriveOperationID(m, id, fingerprint, generation)
	m.Reset() // back to the keyed state, which hmac keeps
	o.macs.Put(m)
	return op
}

func deriveOperationID(m hash.Hash, id ID, fingerprint []byte, generation uint32) OperationID {
	var n [binary.MaxVarintLen64]byte
	field := func(b []byte) {
		m.Write(n[:binary.PutUvarint(n[:], uint64(len(b)))])
		m.Write(b)
	}
	field([]byte(operationIDDomain))
	field([]byte(id.Tenant))
	field([]byte(id.Endpoint))
	field([]byte(id.Key))
	field(fingerprint)
	m.Write(binary.BigEndian.AppendUint32(n[:0], generation))
	var sum [sha256.Size]byte
	var op OperationID
	copy(op[:], m.Sum(sum[:0]))
	if op.IsZero() {
		op[0] = 1 // the zero id means "none"
	}
	return op
}

// StepKey returns the downstream idempotency key of one step of the
// operation, named step ("charge", "authorize", "refund"): the same on
// every attempt and after a takeover, which resume the operation id, and
// different for every step, so a processor that deduplicates on its own
// Idempotency-Key sees each step as one logical request. It is 32
// lower-case hex digits of SHA-256 over the id and the step name: it fits
// any processor's key limit and reveals neither.
func (id OperationID) StepKey(step string) string {
	h := sha256.New()
	h.Write(id[:])
	h.Write([]byte(step))
	return hex.EncodeToString(h.Sum(nil)[:16])
}
