package httpidem

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"

	"github.com/idemkv/idemkv"
)

// A stored response travels in idemkv.Result: the status in Status, the
// created object's location in Pointer, and in Body an envelope holding
// the replayable headers, the fingerprint diagnostics and, unless the
// response was too large to keep, the body. Version 2, the one written:
//
//	version byte (2) | flags byte | uvarint header count |
//	  per header: name ref, value ref |
//	[flagDiag: uvarint len, diagnostics] | [flagBody: the body, to the end]
//
// A ref is a uvarint r. An odd r names entry r>>1 of a static table
// (headerNames for names, headerValues for values); an even r is followed
// by r>>1 bytes spelling the string out. Value entry 0 stands for the
// record's Pointer, so that a Location header naming the created object
// is not stored twice. A typical JSON 201 (Content-Type and Location) thus
// stores its headers in 6 bytes instead of about 60.
//
// Version 1, written by earlier versions, spells every name and value out,
// each as a uvarint length and its bytes. Records written in it are still
// read until they expire.
const (
	envelopeV1 = 1
	envelopeV2 = 2
)

const (
	flagBody = 1 << iota // the body is stored and replayed byte for byte
	flagDiag             // fingerprint diagnostics are stored
)

// The static tables of envelope version 2. Stored records refer to their
// entries by position: entries may be appended, never changed, removed or
// reordered.
var (
	headerNames = []string{
		"Content-Type", "Location", "Content-Language", "Content-Encoding",
		"Cache-Control", "Etag", "Last-Modified", "Link", "Vary", "Retry-After",
	}
	headerValues = []string{
		"", // the record's Pointer; never matched as a literal
		"application/json", "application/json; charset=utf-8",
		"application/problem+json", "text/plain; charset=utf-8",
		"text/html; charset=utf-8", "application/octet-stream", "no-store",
	}
)

var errEnvelope = errors.New("httpidem: stored response is malformed")

// Outcome returns the idemkv.Result that stores an HTTP response the way
// this package's routes do, for whoever settles a record outside a
// request: a reconciler (reconcile.Answer.Result) or an operator (idemkv
// resolve). Replays answer status with every header of header (nil: none)
// and body byte for byte; a nil body leaves replays to the route's
// Rebuild, or else to an empty body with Location set to pointer, the
// created object.
func Outcome(status int, pointer string, header http.Header, body []byte) idemkv.Result {
	names := slices.Sorted(maps.Keys(header))
	env := envelope{header: replayableHeaders(header, names)}
	if body != nil {
		env.haveBody, env.body = true, body
	}
	return idemkv.Result{Status: status, Pointer: pointer, Body: env.encode(pointer)}
}

type envelope struct {
	header   [][2]string // canonical name, value; in order
	diag     []byte
	body     []byte
	haveBody bool
}

// shrink drops the next of the parts a store may refuse, in the order a
// replay can best do without them: the fingerprint diagnostics (a
// mismatch then names no fields); the headers other than those that say
// how to read the body and where the created object is (one may echo the
// client; a Location that is the pointer takes a byte); the body, with
// its Content-Encoding (replays then fall back to the route's Rebuild or
// the pointer); the headers left. It names what it dropped, "" if nothing
// is left to drop.
func (e *envelope) shrink() string {
	if e.diag != nil {
		e.diag = nil
		return "fingerprint diagnostics"
	}
	if kept := e.headersBut(func(name string) bool {
		return name != "Content-Type" && name != "Content-Encoding" && name != "Location"
	}); len(kept) < len(e.header) {
		e.header = kept
		return "headers other than Content-Type, Content-Encoding and Location"
	}
	if e.haveBody {
		e.haveBody, e.body = false, nil
		e.header = e.headersBut(func(name string) bool { return name == "Content-Encoding" })
		return "body"
	}
	if len(e.header) > 0 {
		e.header = nil
		return "headers"
	}
	return ""
}

// headersBut returns e's headers without those whose names drop says.
func (e *envelope) headersBut(drop func(name string) bool) [][2]string {
	return slices.DeleteFunc(slices.Clone(e.header), func(h [2]string) bool { return drop(h[0]) })
}

func (e *envelope) size() int {
	n := 2 + binary.MaxVarintLen32 + len(e.diag) + binary.MaxVarintLen32 + len(e.body)
	for _, h := range e.header {
		n += 2*binary.MaxVarintLen32 + len(h[0]) + len(h[1])
	}
	return n
}

// encode returns the envelope in version 2; pointer is the Pointer of the
// Result it will be stored in.
func (e *envelope) encode(pointer string) []byte {
	var flags byte
	if e.haveBody {
		flags |= flagBody
	}
	if e.diag != nil {
		flags |= flagDiag
	}
	b := make([]byte, 0, e.size())
	b = append(b, envelopeV2, flags)
	b = binary.AppendUvarint(b, uint64(len(e.header)))
	for _, h := range e.header {
		b = appendRef(b, h[0], headerNames, "")
		b = appendRef(b, h[1], headerValues, pointer)
	}
	if e.diag != nil {
		b = binary.AppendUvarint(b, uint64(len(e.diag)))
		b = append(b, e.diag...)
	}
	if e.haveBody {
		b = append(b, e.body...)
	}
	return b
}

// appendRef appends the ref of s: entry 0 of table if s is pointer (not
// empty; only values are passed one), the entry of table equal to s if
// there is one, else s spelled out.
func appendRef(b []byte, s string, table []string, pointer string) []byte {
	if pointer != "" && s == pointer {
		return binary.AppendUvarint(b, 1)
	}
	for i, t := range table {
		if t == s && t != "" {
			return binary.AppendUvarint(b, uint64(i)<<1|1)
		}
	}
	b = binary.AppendUvarint(b, uint64(len(s))<<1)
	return append(b, s...)
}

// decodeEnvelope parses b, stored in a Result whose Pointer is pointer.
// The result aliases b.
func decodeEnvelope(b []byte, pointer string) (envelope, error) {
	var e envelope
	if len(b) < 2 {
		return e, fmt.Errorf("%w: %d bytes", errEnvelope, len(b))
	}
	version, flags := b[0], b[1]
	if version != envelopeV1 && version != envelopeV2 {
		return e, fmt.Errorf("%w: unknown version %d", errEnvelope, version)
	}
	if flags&^(flagBody|flagDiag) != 0 {
		return e, fmt.Errorf("%w: unknown flags %#x", errEnvelope, flags)
	}
	b = b[2:]
	n, b, err := uvarint(b)
	if err != nil {
		return e, err
	}
	if n > uint64(len(b))/2 {
		return e, fmt.Errorf("%w: %d headers in %d bytes", errEnvelope, n, len(b))
	}
	e.header = make([][2]string, 0, n)
	for i := uint64(0); i < n; i++ {
		var name, value string
		if version == envelopeV1 {
			var nb, vb []byte
			if nb, b, err = lenPrefixed(b); err != nil {
				return e, err
			}
			if vb, b, err = lenPrefixed(b); err != nil {
				return e, err
			}
			name, value = string(nb), string(vb)
		} else {
			if name, b, err = ref(b, headerNames, ""); err != nil {
				return e, err
			}
			if value, b, err = ref(b, headerValues, pointer); err != nil {
				return e, err
			}
		}
		e.header = append(e.header, [2]string{name, value})
	}
	if flags&flagDiag != 0 {
		if e.diag, b, err = lenPrefixed(b); err != nil {
			return e, err
		}
	}
	if flags&flagBody != 0 {
		e.haveBody, e.body = true, b
	} else if len(b) != 0 {
		return e, fmt.Errorf("%w: %d trailing bytes", errEnvelope, len(b))
	}
	return e, nil
}

// ref reads one version 2 ref (see envelopeV2).
func ref(b []byte, table []string, pointer string) (string, []byte, error) {
	r, b, err := uvarint(b)
	if err != nil {
		return "", nil, err
	}
	if r&1 == 0 {
		if r>>1 > uint64(len(b)) {
			return "", nil, fmt.Errorf("%w: length %d beyond the %d bytes left", errEnvelope, r>>1, len(b))
		}
		return string(b[:r>>1]), b[r>>1:], nil
	}
	i := r >> 1
	switch {
	case i >= uint64(len(table)):
		return "", nil, fmt.Errorf("%w: table entry %d of %d", errEnvelope, i, len(table))
	case i == 0 && table[0] == "":
		if pointer == "" {
			return "", nil, fmt.Errorf("%w: a header refers to an empty pointer", errEnvelope)
		}
		return pointer, b, nil
	}
	return table[i], b, nil
}

func uvarint(b []byte) (uint64, []byte, error) {
	v, n := binary.Uvarint(b)
	if n <= 0 {
		return 0, nil, fmt.Errorf("%w: bad length", errEnvelope)
	}
	return v, b[n:], nil
}

func lenPrefixed(b []byte) ([]byte, []byte, error) {
	n, b, err := uvarint(b)
	if err != nil {
		return nil, nil, err
	}
	if n > uint64(len(b)) {
		return nil, nil, fmt.Errorf("%w: length %d beyond the %d bytes left", errEnvelope, n, len(b))
	}
	return b[:n], b[n:], nil
}

// replayableHeaders picks the named headers from h, in the order of names.
func replayableHeaders(h http.Header, names []string) [][2]string {
	var out [][2]string
	for _, name := range names {
		for _, v := range h.Values(name) {
			out = append(out, [2]string{name, v})
		}
	}
	return out
}
