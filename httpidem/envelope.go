package httpidem

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
)

// A stored response travels in idemkv.Result: the status in Status, the
// created object's location in Pointer, and in Body an envelope holding
// the replayable headers, the fingerprint diagnostics and, unless the
// response was too large to keep, the body:
//
//	version byte (1) | flags byte | uvarint header count |
//	  per header: uvarint len, name, uvarint len, value |
//	[flagDiag: uvarint len, diagnostics] | [flagBody: the body, to the end]
const envelopeV1 = 1

const (
	flagBody = 1 << iota // the body is stored and replayed byte for byte
	flagDiag             // fingerprint diagnostics are stored
)

var errEnvelope = errors.New("httpidem: stored response is malformed")

type envelope struct {
	header   [][2]string // canonical name, value; in order
	diag     []byte
	body     []byte
	haveBody bool
}

func (e *envelope) size() int {
	n := 2 + binary.MaxVarintLen32 + len(e.diag) + binary.MaxVarintLen32 + len(e.body)
	for _, h := range e.header {
		n += 2*binary.MaxVarintLen32 + len(h[0]) + len(h[1])
	}
	return n
}

func (e *envelope) encode() []byte {
	var flags byte
	if e.haveBody {
		flags |= flagBody
	}
	if e.diag != nil {
		flags |= flagDiag
	}
	b := make([]byte, 0, e.size())
	b = append(b, envelopeV1, flags)
	b = binary.AppendUvarint(b, uint64(len(e.header)))
	for _, h := range e.header {
		b = binary.AppendUvarint(b, uint64(len(h[0])))
		b = append(b, h[0]...)
		b = binary.AppendUvarint(b, uint64(len(h[1])))
		b = append(b, h[1]...)
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

// decodeEnvelope parses b. The result aliases b.
func decodeEnvelope(b []byte) (envelope, error) {
	var e envelope
	if len(b) < 2 {
		return e, fmt.Errorf("%w: %d bytes", errEnvelope, len(b))
	}
	if b[0] != envelopeV1 {
		return e, fmt.Errorf("%w: unknown version %d", errEnvelope, b[0])
	}
	flags := b[1]
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
		var name, value []byte
		if name, b, err = lenPrefixed(b); err != nil {
			return e, err
		}
		if value, b, err = lenPrefixed(b); err != nil {
			return e, err
		}
		e.header = append(e.header, [2]string{string(name), string(value)})
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
