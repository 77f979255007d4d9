package pgstore

import (
	"encoding/binary"
	"errors"
	"slices"
)

// Event headers are stored as bytes of their own encoding, not as JSON:
// a header value may hold any byte but CR and LF, which JSON would
// rewrite (invalid UTF-8) or jsonb refuse (NUL). The encoding is each
// header, sorted by name, as a uvarint length and the name, then a
// uvarint length and the value. No headers: NULL.

func encodeHeaders(h map[string]string) []byte {
	if len(h) == 0 {
		return nil
	}
	names := make([]string, 0, len(h))
	for n := range h {
		names = append(names, n)
	}
	slices.Sort(names)
	var b []byte
	for _, n := range names {
		b = binary.AppendUvarint(b, uint64(len(n)))
		b = append(b, n...)
		b = binary.AppendUvarint(b, uint64(len(h[n])))
		b = append(b, h[n]...)
	}
	return b
}

var errHeaders = errors.New("malformed header encoding")

func decodeHeaders(b []byte) (map[string]string, error) {
	if len(b) == 0 {
		return nil, nil
	}
	h := map[string]string{}
	next := func() (string, error) {
		n, w := binary.Uvarint(b)
		if w <= 0 || n > uint64(len(b)-w) {
			return "", errHeaders
		}
		s := string(b[w : w+int(n)])
		b = b[w+int(n):]
		return s, nil
	}
	for len(b) > 0 {
		name, err := next()
		if err != nil {
			return nil, err
		}
		value, err := next()
		if err != nil {
			return nil, err
		}
		h[name] = value
	}
	return h, nil
}
