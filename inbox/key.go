package inbox

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"strconv"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fingerprint"
)

// The dedup mark of an event: its key and its fingerprint.
//
// A mark's key (idemkv.ID.Key, printable ASCII, at most idemkv.MaxKeyLen
// bytes) takes one of four forms, told apart by their prefix, so that no
// two forms ever collide:
//
//	id/<id>              an id that fits as it is (printable ASCII, at
//	                     most 252 bytes), the common case: outbox ids
//	id-sha256/<hex>      any other id: SHA-256 of its bytes
//	sha256/<hex>         an event without an id: SHA-256 of its content
//	pos/<decimal>        not an event: the commit that advances the
//	                     position past a duplicate (Consumer.catchUp)
//	pos/<decimal>/<hex>  the same, made again after a reset of the
//	                     position, <hex> 64 random bits
//
// An event's content is its subject and its payload, the payload in its
// RFC 8785 canonical form when it is JSON (fingerprint.Canonical), so
// that two copies whose JSON differs only in member order, whitespace or
// number spelling are one event; any other payload (not JSON, or JSON the
// canonical form refuses: an integer beyond 2^53, nesting deeper than
// fingerprint.DefaultMaxDepth) counts byte for byte. A canonical form is
// JSON and a payload the canonical form refuses is not one, so the two
// never yield the same bytes.
//
// The content key is a 256-bit hash, not the fingerprint's 64 bits: two
// distinct events sharing a key would lose one of them without a trace,
// and at a billion retained marks a 64-bit hash gives that a chance of a
// few percent.
//
// The fingerprint, which the store compares on every copy, is the
// payload fingerprint (fingerprint.ComputePayload, kind: the subject) of
// the same content. For an id-less event it follows from the key; for an
// event with an id, a copy with other content is reported
// (Outcome.Mismatch).

// eventMark is the key and fingerprint of an event's dedup mark.
type eventMark struct {
	key string
	fp  []byte
}

func identify(msg *Message) (eventMark, error) {
	body := canonical(msg.Data)
	fp, err := fingerprint.ComputePayload(fingerprint.Payload{Kind: msg.Subject, Body: body},
		&fingerprint.Options{Mode: fingerprint.ModeRaw, MaxBodySize: max(len(body), fingerprint.DefaultMaxBodySize)})
	if err != nil {
		return eventMark{}, fmt.Errorf("fingerprinting the event: %w", err)
	}
	m := eventMark{fp: fp.Bytes}
	switch {
	case msg.ID == "":
		h := sha256.New()
		h.Write(binary.AppendUvarint(nil, uint64(len(msg.Subject))))
		h.Write([]byte(msg.Subject))
		h.Write(body)
		m.key = "sha256/" + hex.EncodeToString(h.Sum(nil))
	case idemkv.ValidateKey("id/"+msg.ID) == nil:
		m.key = "id/" + msg.ID
	default:
		sum := sha256.Sum256([]byte(msg.ID))
		m.key = "id-sha256/" + hex.EncodeToString(sum[:])
	}
	return m, nil
}

// canonical returns data's RFC 8785 canonical form if it is JSON the
// canonical form accepts, and otherwise data itself.
func canonical(data []byte) []byte {
	if len(data) == 0 {
		return data
	}
	c, err := fingerprint.Canonical(data, &fingerprint.Options{MaxBodySize: max(len(data), fingerprint.DefaultMaxBodySize)})
	if err != nil {
		return data
	}
	return c
}

// positionMarkKey is the key of the commit that advances the position to
// pos past a duplicate, or with again, a key never used before.
func positionMarkKey(pos uint64, again bool) string {
	k := "pos/" + strconv.FormatUint(pos, 10)
	if again {
		k += "/" + strconv.FormatUint(rand.Uint64(), 16)
	}
	return k
}
