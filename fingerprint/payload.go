package fingerprint

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/cespare/xxhash/v2"
)

// Payloads: the input of an operation that is not an HTTP request (a job's
// arguments, a message body, an RPC's request), for callers of package
// once and others that claim keys outside the HTTP middleware.
//
// A payload fingerprint has the format of a request's: the version byte,
// then the version's digest (9 bytes for version 1), so Version reads
// both and a record's fingerprint looks the same whoever wrote it. Only
// the encoding that is hashed differs:
//
//	0x20 kind     payload: the bytes of Payload.Kind
//	then exactly one body form, tagged as in a request (versions.go):
//	0x10 empty, 0x11 raw, 0x12 json or 0x13 field (one per pointer)
//
// A request's encoding always starts with its tenant part (0x01), a
// payload's with its kind part (0x20), so a payload and a request never
// have the same encoding; like two requests, they can collide only
// through the 64-bit hash.
//
// Versions: the payload encoding is frozen like the request encoding, and
// numbered in the same space, so that Version needs no second table. Its
// version 1 is the one below, pinned by TestPayloadVectors. A change to it
// is a new version: a number not yet used by either encoding, registered
// in payloadAlgorithms and in algorithms (with the size of its output).

// kindPayloadKind tags the kind part, the first part of a payload's
// encoding. No request encoding uses it.
const kindPayloadKind = 0x20

// currentPayload is the version ComputePayload uses.
const currentPayload = 1

// payloadAlgorithms holds every released version of the payload encoding.
var payloadAlgorithms = map[byte]func(st *state, p *Payload, c *config) error{
	1: computePayloadV1,
}

// A Payload is the input of one operation that is not an HTTP request.
// ComputePayload does not retain it or anything it refers to.
type Payload struct {
	// Kind names the operation, for example "invoices.send" or
	// "ledger.transfer": two operations with equal bodies but different
	// kinds have different fingerprints. Any string, "" included; it is
	// compared exactly.
	Kind string
	// Body is the operation's input: any bytes in ModeRaw, JSON in
	// ModeJSON (the default) and ModeFields. An empty body is covered as
	// "no body" in every mode.
	Body []byte
}

// ComputePayload fingerprints p with the current version of the payload
// encoding. opts (nil: the defaults) chooses the body mode, the fields of
// ModeFields and the limits, as for Compute; Headers, Query and
// Diagnostics do not apply and are an ErrInvalidOptions. It fails with a
// *BodyError (matching ErrInvalidBody) when the body cannot be
// fingerprinted in the chosen mode. It is safe for concurrent use.
func ComputePayload(p Payload, opts *Options) (FP, error) {
	c, err := payloadConfig(opts)
	if err != nil {
		return FP{}, err
	}
	st := statePool.Get()
	defer st.release()
	if err := payloadAlgorithms[currentPayload](st, &p, &c); err != nil {
		return FP{}, err
	}
	return FP{Bytes: bytes.Clone(st.fp)}, nil
}

// ComputeValue fingerprints the JSON encoding of v (encoding/json's) as
// the body of a payload of the given kind. In ModeJSON, the default, the
// encoding is put in RFC 8785 canonical form, so the fingerprint does not
// depend on the order of a map's keys or of a struct's fields, only on
// the names and values encoded. Integers beyond 2^53 (an int64 id, say)
// are not exact in a JSON number: they are an ErrInexactNumber unless
// opts.InexactNumbers; encode them as strings (the ",string" tag option).
// Strings are text: encoding/json replaces each byte that is not UTF-8
// with U+FFFD, so two strings that differ only in such bytes share a
// fingerprint; keep raw bytes (a signature, a hash) in a []byte, which is
// encoded whole (base64). It fails like json.Marshal for a value that
// cannot be encoded, and otherwise like ComputePayload.
func ComputeValue(kind string, v any, opts *Options) (FP, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return FP{}, fmt.Errorf("fingerprint: encoding the value: %w", err)
	}
	return ComputePayload(Payload{Kind: kind, Body: body}, opts)
}

// MatchesPayload reports whether p has the fingerprint stored, computed
// with the payload version stored names: after an upgrade that adds a
// version, a payload fingerprinted before it still matches its retries
// (see Matches for how to use it on a Mismatch). opts must be the options
// the stored fingerprint was computed with. It fails with
// ErrInvalidStored if stored is not a payload fingerprint of this package
// (a request's is not one, but its bytes are as random: it simply does not
// match), ErrUnknownVersion if its version is newer than this build, and
// like ComputePayload for a bad payload or options.
func MatchesPayload(stored []byte, p Payload, opts *Options) (bool, error) {
	a, err := algorithmOf(stored)
	if err != nil {
		return false, err
	}
	compute := payloadAlgorithms[a.version]
	if compute == nil {
		return false, fmt.Errorf("%w: version %d has no payload form", ErrUnknownVersion, a.version)
	}
	c, err := payloadConfig(opts)
	if err != nil {
		return false, err
	}
	st := statePool.Get()
	defer st.release()
	if err := compute(st, &p, &c); err != nil {
		return false, err
	}
	return bytes.Equal(st.fp, stored), nil
}

// payloadConfig is newConfig, refusing the options a payload has no use
// for: silently ignoring a named header would let two different
// operations share a fingerprint the caller thought covered it.
func payloadConfig(opts *Options) (config, error) {
	c, err := newConfig(opts)
	if err != nil {
		return config{}, err
	}
	var errs []error
	if len(c.headers) > 0 {
		errs = append(errs, errors.New("Headers are set, but a payload has no headers"))
	}
	if len(c.query) > 0 {
		errs = append(errs, errors.New("Query is set, but a payload has no query"))
	}
	if c.diagnostics {
		errs = append(errs, errors.New("Diagnostics are kept for requests only"))
	}
	if err := errors.Join(errs...); err != nil {
		return config{}, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	return c, nil
}

// computePayloadV1 is version 1 of the payload encoding. Frozen: it does
// not share the body code of computeV1, so that neither can change the
// other.
func computePayloadV1(st *state, p *Payload, c *config) error {
	if len(p.Body) > c.maxBody {
		return tooLarge(len(p.Body), c.maxBody)
	}
	st.enc = st.enc[:0]
	st.tmp = append(st.tmp[:0], p.Kind...)
	st.put(kindPayloadKind, st.tmp)
	switch {
	case len(p.Body) == 0:
		st.put(kindBodyEmpty, nil)
	case c.mode == ModeRaw:
		st.put(kindBodyRaw, p.Body)
	case c.mode == ModeJSON:
		if err := st.canon.run(p.Body, c.maxDepth, c.inexact); err != nil {
			return err
		}
		st.put(kindBodyJSON, st.canon.out)
	case c.mode == ModeFields:
		if err := st.canon.run(p.Body, c.maxDepth, c.inexact); err != nil {
			return err
		}
		for _, ptr := range c.fields {
			st.tmp = appendStr(st.tmp[:0], ptr)
			if v, ok := lookup(st.canon.out, ptr); ok {
				st.tmp = append(st.tmp, 1)
				st.tmp = append(st.tmp, v...)
			} else {
				st.tmp = append(st.tmp, 0)
			}
			st.put(kindBodyField, st.tmp)
		}
	}
	st.fp = binary.BigEndian.AppendUint64(append(st.fp[:0], 1), xxhash.Sum64(st.enc))
	return nil
}
