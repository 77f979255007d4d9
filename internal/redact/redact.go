// Package redact takes idempotency keys out of text bound for logs and
// traces. The stores name a key in their errors (quoted, as %q does), so
// that a caller can tell which key failed; a log line must not, since a
// key can carry customer data. Whatever logs an error names the key by
// its hash (idemkv.ID.Hash) instead.
package redact

import (
	"strconv"
	"strings"
)

// MinBareLen is the shortest key replaced where it appears unquoted.
// Shorter keys are replaced only in their quoted form: replacing every
// bare "k" would garble the message around it, and a key that short
// carries little.
const MinBareLen = 8

// Key returns s with key replaced by "[key HASH]": its quoted form
// wherever it appears, and the key itself where it is at least
// MinBareLen bytes long.
func Key(s, key, hash string) string {
	if key == "" {
		return s
	}
	with := "[key " + hash + "]"
	if q := strconv.Quote(key); strings.Contains(s, q) {
		s = strings.ReplaceAll(s, q, with)
	}
	if len(key) >= MinBareLen && strings.Contains(s, key) {
		s = strings.ReplaceAll(s, key, with)
	}
	return s
}
