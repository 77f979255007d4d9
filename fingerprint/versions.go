package fingerprint

import (
	"encoding/binary"
	"slices"

	"github.com/cespare/xxhash/v2"
)

// Versions.
//
// A fingerprint is stored for as long as its record is retained, and every
// retry within that time must produce the same bytes. So an algorithm,
// once released, is frozen: its encoding, its canonicalizer's output and
// its hash never change. To change anything, add a version: write its
// compute function (keeping the old one and everything it calls as they
// are), register it below and raise CurrentVersion. Compute then uses the
// new version while Matches and Explain keep checking stored values with
// the version they name. TestVectors pins version 1's output.

// CurrentVersion is the algorithm version Compute uses.
const CurrentVersion = 1

// current is the version Compute uses: CurrentVersion, except in tests
// that play an upgrade.
var current byte = CurrentVersion

// algorithms holds every released version by number.
var algorithms = map[byte]*algorithm{
	1: {version: 1, size: 9, compute: computeV1},
}

// An algorithm is one frozen version of the fingerprint function.
type algorithm struct {
	version byte
	// size is the length of its fingerprints, version byte included.
	size int
	// compute sets st.fp to the fingerprint of req under c and, if
	// c.diagnostics is set, st.entries to the digests of its parts.
	compute func(st *state, req *Request, c *config) error
}

// state holds one computation's buffers, reused through statePool.
type state struct {
	fp      []byte
	enc     []byte   // the canonical encoding being hashed
	tmp     []byte   // one part's payload
	keys    []string // sorted names
	entries []entry  // diagnostics
	canon   canon
}

var statePool = poolOf(func() *state { return new(state) })

func (st *state) release() {
	if cap(st.enc) > maxRetained || cap(st.tmp) > maxRetained {
		st.enc, st.tmp = nil, nil
	}
	clear(st.keys)
	clear(st.entries)
	st.keys, st.entries = st.keys[:0], st.entries[:0]
	st.canon.reset()
	statePool.Put(st)
}

// Version 1.
//
// The fingerprint is the byte 1, then the big-endian xxhash64 (seed 0) of
// this encoding of the request, a sequence of parts in a fixed order:
//
//	part    = kind:byte length:uvarint payload
//	str(x)  = len(x):uvarint x
//
//	0x01 tenant   payload: the bytes of Request.Tenant
//	0x02 method   payload: the bytes of Request.Method
//	0x03 route    payload: the bytes of Request.Route
//	0x04 param    one per path parameter, by name (bytewise):
//	              str(name) str(value)
//	0x05 query    one per Options.Query name (sorted bytewise, once each):
//	              str(name) count:uvarint str(value)...   (count 0: absent)
//	0x06 header   one per Options.Headers name (lower-cased, sorted, once):
//	              str(name) count:uvarint str(value)...   (count 0: absent)
//	              values in the order sent; if several map keys match the
//	              name, their values follow in bytewise order of the keys
//	then exactly one body form:
//	0x10 empty    an empty body, in every mode; no payload
//	0x11 raw      ModeRaw: the body's bytes
//	0x12 json     ModeJSON: the body's JCS form
//	0x13 field    ModeFields, one per pointer of Options.Fields (sorted
//	              bytewise, once each):
//	              str(pointer) 0x00                     (selects nothing)
//	              str(pointer) 0x01 the value's JCS form
//
// Every part is tagged and length-prefixed, so the encoding of two
// different requests can never be the same bytes: no field can borrow
// bytes from its neighbour, and an absent part differs from an empty one.
const (
	kindTenant    = 0x01
	kindMethod    = 0x02
	kindRoute     = 0x03
	kindParam     = 0x04
	kindQuery     = 0x05
	kindHeader    = 0x06
	kindBodyEmpty = 0x10
	kindBodyRaw   = 0x11
	kindBodyJSON  = 0x12
	kindBodyField = 0x13
	// kindBodyMember tags a top-level member of a JSON object body in a
	// diagnostics digest (never in the hashed encoding):
	// str(pointer) the value's JCS form.
	kindBodyMember = 0x14
)

func computeV1(st *state, req *Request, c *config) error {
	if len(req.Body) > c.maxBody {
		return tooLarge(len(req.Body), c.maxBody)
	}
	st.enc = st.enc[:0]
	st.entries = st.entries[:0]
	diag := c.diagnostics

	st.tmp = append(st.tmp[:0], req.Tenant...)
	st.note(diag, partTenant, "", st.put(kindTenant, st.tmp))
	st.tmp = append(st.tmp[:0], req.Method...)
	st.note(diag, partMethod, "", st.put(kindMethod, st.tmp))
	st.tmp = append(st.tmp[:0], req.Route...)
	st.note(diag, partRoute, "", st.put(kindRoute, st.tmp))

	st.keys = st.keys[:0]
	for k := range req.Params {
		st.keys = append(st.keys, k)
	}
	slices.Sort(st.keys)
	for _, k := range st.keys {
		st.tmp = appendStr(st.tmp[:0], k)
		st.tmp = appendStr(st.tmp, req.Params[k])
		st.note(diag, partParam, k, st.put(kindParam, st.tmp))
	}

	for _, name := range c.query {
		st.tmp = appendStr(st.tmp[:0], name)
		vs := req.Query[name]
		st.tmp = binary.AppendUvarint(st.tmp, uint64(len(vs)))
		for _, v := range vs {
			st.tmp = appendStr(st.tmp, v)
		}
		st.note(diag, partQuery, name, st.put(kindQuery, st.tmp))
	}

	for _, name := range c.headers {
		st.tmp = appendStr(st.tmp[:0], name)
		st.tmp = st.appendHeaderValues(st.tmp, req.Header, name)
		st.note(diag, partHeader, name, st.put(kindHeader, st.tmp))
	}

	switch {
	case len(req.Body) == 0:
		st.note(diag, partBody, "", st.put(kindBodyEmpty, nil))
	case c.mode == ModeRaw:
		st.note(diag, partBody, "", st.put(kindBodyRaw, req.Body))
	case c.mode == ModeJSON:
		if err := st.canon.run(req.Body, c.maxDepth, c.inexact); err != nil {
			return err
		}
		doc := st.canon.out
		part := st.put(kindBodyJSON, doc)
		if diag {
			if len(doc) > 2 && doc[0] == '{' {
				st.noteMembers(doc)
			} else {
				st.note(diag, partBody, "", part)
			}
		}
	case c.mode == ModeFields:
		if err := st.canon.run(req.Body, c.maxDepth, c.inexact); err != nil {
			return err
		}
		for _, p := range c.fields {
			st.tmp = appendStr(st.tmp[:0], p)
			if v, ok := lookup(st.canon.out, p); ok {
				st.tmp = append(st.tmp, 1)
				st.tmp = append(st.tmp, v...)
			} else {
				st.tmp = append(st.tmp, 0)
			}
			st.note(diag, partBodyField, p, st.put(kindBodyField, st.tmp))
		}
	}

	st.fp = binary.BigEndian.AppendUint64(append(st.fp[:0], 1), xxhash.Sum64(st.enc))
	return nil
}

// put appends a part of the given kind to st.enc and returns the part's
// bytes.
func (st *state) put(kind byte, payload []byte) []byte {
	start := len(st.enc)
	st.enc = append(st.enc, kind)
	st.enc = binary.AppendUvarint(st.enc, uint64(len(payload)))
	st.enc = append(st.enc, payload...)
	return st.enc[start:]
}

// note records the digest of a part's bytes for diagnostics, if diag.
func (st *state) note(diag bool, part byte, name string, b []byte) {
	if diag {
		st.entries = append(st.entries, entry{part: part, name: name, digest: digestV1(b)})
	}
}

// noteMembers records a digest per member of the canonical object doc.
func (st *state) noteMembers(doc []byte) {
	var name []byte
	forMembers(doc, func(n, val []byte) bool {
		name = unquote(name[:0], n)
		p := "/" + escapeToken(string(name))
		st.tmp = append(st.tmp[:0], kindBodyMember)
		st.tmp = appendStr(st.tmp, p)
		st.tmp = append(st.tmp, val...)
		st.note(true, partBodyField, p, st.tmp)
		return true
	})
}

// digestV1 is a part's diagnostics digest: the high 32 bits of its
// xxhash64.
func digestV1(b []byte) uint32 { return uint32(xxhash.Sum64(b) >> 32) }

// asciiEqualFold reports whether a equals b ignoring ASCII case (header
// names are ASCII; Unicode folding would match "\u212a" to "k").
func asciiEqualFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

func appendStr(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// appendHeaderValues appends count:uvarint str(value)... for the header
// name (lower-case) in h. Keys match case-insensitively; if several keys
// match (a map built by hand), their values follow in bytewise key order.
func (st *state) appendHeaderValues(dst []byte, h map[string][]string, name string) []byte {
	st.keys = st.keys[:0]
	n := 0
	for k, vs := range h {
		if asciiEqualFold(k, name) {
			st.keys = append(st.keys, k)
			n += len(vs)
		}
	}
	slices.Sort(st.keys)
	dst = binary.AppendUvarint(dst, uint64(n))
	for _, k := range st.keys {
		for _, v := range h[k] {
			dst = appendStr(dst, v)
		}
	}
	return dst
}
