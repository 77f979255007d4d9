package natsjs

import (
	"fmt"
	"strings"
)

// validateSubject reports whether subj is a literal subject a message can
// be published on: dot-separated, non-empty tokens of printable ASCII
// without spaces, and no wildcard ('*' or '>'). NATS itself accepts
// wildcards only as whole tokens and rejects them on publish; we refuse
// the characters anywhere, so that a topic never reads as a pattern.
func validateSubject(subj string) error {
	if subj == "" {
		return fmt.Errorf("empty subject")
	}
	for i := 0; i < len(subj); i++ {
		switch c := subj[i]; {
		case c <= ' ' || c > '~':
			return fmt.Errorf("byte 0x%02x at offset %d: subjects are printable ASCII without spaces", c, i)
		case c == '*' || c == '>':
			return fmt.Errorf("wildcard %q at offset %d: events are published on literal subjects", c, i)
		}
	}
	if strings.HasPrefix(subj, ".") || strings.HasSuffix(subj, ".") || strings.Contains(subj, "..") {
		return fmt.Errorf("empty token in %q (leading, trailing or double dot)", subj)
	}
	return nil
}

// reservedHeaderPrefix starts the headers the server acts on (Nats-Msg-Id,
// Nats-Expected-*, Nats-Rollup, Nats-TTL, ...). An event may not set them:
// one could change the message's deduplication or purge the stream.
const reservedHeaderPrefix = "nats-"

// headerNameForbidden are the printable ASCII bytes nats.go refuses in a
// header name (it would fail the publish with ErrBadHeaderMsg). We check
// first, to name the header in the error.
const headerNameForbidden = "\"()/,:;<=>?@[\\]{}"

// validateHeader reports whether an event header can be published as is.
// nats.go trims a value's surrounding whitespace and turns CR and LF into
// spaces; a value it would change in the middle (CR, LF) is refused, so
// that consumers see what the operation emitted. (idemkv.Event.Validate
// refuses surrounding spaces and tabs too, in values and keys, when an
// event is emitted; one stored before it did is published trimmed rather
// than held back forever.)
func validateHeader(name, value string) error {
	if name == "" {
		return fmt.Errorf("empty header name")
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c > '~' || strings.IndexByte(headerNameForbidden, c) >= 0 {
			return fmt.Errorf("header name %q: byte %q at offset %d is not allowed (printable ASCII, no spaces or separators)", name, c, i)
		}
	}
	if strings.HasPrefix(strings.ToLower(name), reservedHeaderPrefix) {
		return fmt.Errorf("header name %q: Nats-* headers are the server's and are reserved", name)
	}
	if strings.ContainsAny(value, "\r\n") {
		return fmt.Errorf("header %q: value contains CR or LF", name)
	}
	return nil
}
