package httpidem

import (
	"errors"
	"fmt"

	"github.com/idemkv/idemkv"
)

// HeaderKey is the request header field that carries the idempotency key.
const HeaderKey = "Idempotency-Key"

// HeaderReplayed is set to "true" on every response replayed from a stored
// outcome, and is absent from responses produced by running the handler.
const HeaderReplayed = "Idempotent-Replayed"

// HeaderRetention is set on the response of a request that ran and whose
// outcome was stored: how many seconds the outcome is kept and replayed.
// A retry sent later runs as a new request.
const HeaderRetention = "Idempotency-Retention"

// Errors of ParseKey. Both answer 400.
var (
	// ErrMissingKey: the request has no Idempotency-Key field.
	ErrMissingKey = errors.New("httpidem: missing Idempotency-Key header")
	// ErrInvalidKey: the field is repeated, empty, too long, or not a
	// Structured Field string or a bare token.
	ErrInvalidKey = errors.New("httpidem: invalid Idempotency-Key header")
)

// ParseKey returns the idempotency key carried by the values of the
// Idempotency-Key field (http.Header.Values). It accepts exactly one field
// value in one of two forms:
//
//   - a Structured Field string (RFC 9651), as the IETF draft specifies:
//     "8e03978e-40d5-43e8-bc93-6894a57f9324", with \" and \\ as the only
//     escapes; parameters after the string are refused;
//   - a bare token, as many clients send: 8e03978e-40d5-43e8-bc93-6894a57f9324,
//     made of printable ASCII other than space, '"', '\' and ','.
//
// The key (the string's content) must be 1 to 255 bytes. Errors wrap
// ErrMissingKey or ErrInvalidKey and say what is wrong.
func ParseKey(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", ErrMissingKey
	case 1:
	default:
		return "", fmt.Errorf("%w: %d header fields, want exactly one", ErrInvalidKey, len(values))
	}
	v := trimOWS(values[0])
	var key string
	if len(v) > 0 && v[0] == '"' {
		k, err := parseSFString(v)
		if err != nil {
			return "", err
		}
		key = k
	} else {
		for i := 0; i < len(v); i++ {
			switch c := v[i]; {
			case c == ',':
				return "", fmt.Errorf("%w: a list of keys (',' at offset %d); send exactly one", ErrInvalidKey, i)
			case c == '"' || c == '\\' || c <= 0x20 || c >= 0x7f:
				return "", fmt.Errorf("%w: byte 0x%02x at offset %d is not allowed in a bare key; quote the key as a string", ErrInvalidKey, c, i)
			}
		}
		key = v
	}
	if key == "" {
		return "", fmt.Errorf("%w: empty key", ErrInvalidKey)
	}
	if len(key) > idemkv.MaxKeyLen {
		return "", fmt.Errorf("%w: key is %d bytes, limit %d", ErrInvalidKey, len(key), idemkv.MaxKeyLen)
	}
	return key, nil
}

// parseSFString parses v, which starts with '"', as an sf-string and
// refuses anything after it.
func parseSFString(v string) (string, error) {
	out := make([]byte, 0, len(v))
	for i := 1; i < len(v); i++ {
		switch c := v[i]; {
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", fmt.Errorf("%w: bad escape at offset %d (only \\\" and \\\\)", ErrInvalidKey, i-1)
			}
			out = append(out, v[i])
		case c == '"':
			if rest := trimOWS(v[i+1:]); rest != "" {
				return "", fmt.Errorf("%w: unexpected %q after the quoted key (parameters and lists are not accepted)", ErrInvalidKey, truncate(rest, 16))
			}
			return string(out), nil
		case c < 0x20 || c >= 0x7f:
			return "", fmt.Errorf("%w: byte 0x%02x at offset %d is not allowed in a string", ErrInvalidKey, c, i)
		default:
			out = append(out, c)
		}
	}
	return "", fmt.Errorf("%w: unterminated string", ErrInvalidKey)
}

func trimOWS(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
