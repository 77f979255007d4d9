package fingerprint

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// Mode says how the request body is canonicalized before it is hashed.
type Mode uint8

const (
	// ModeJSON hashes the body's RFC 8785 (JCS) canonical form: member
	// order, whitespace, string escapes and number spelling do not matter;
	// every value does.
	ModeJSON Mode = iota
	// ModeRaw hashes the body's exact bytes. For bodies that are not JSON,
	// or when any difference in the bytes must count.
	ModeRaw
	// ModeFields hashes only the members selected by Options.Fields, each
	// in JCS form. For APIs whose bodies carry volatile fields, such as a
	// client timestamp, that a retry may legitimately change.
	ModeFields
)

// String returns "json", "raw" or "fields".
func (m Mode) String() string {
	switch m {
	case ModeJSON:
		return "json"
	case ModeRaw:
		return "raw"
	case ModeFields:
		return "fields"
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// ParseMode parses "json", "raw" or "fields".
func ParseMode(s string) (Mode, error) {
	for _, m := range []Mode{ModeJSON, ModeRaw, ModeFields} {
		if s == m.String() {
			return m, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown mode %q (want json, raw or fields)", ErrInvalidOptions, s)
}

// Defaults and bounds of the limits.
const (
	// DefaultMaxBodySize is the default Options.MaxBodySize: 1 MiB.
	DefaultMaxBodySize = 1 << 20
	// DefaultMaxDepth is the default Options.MaxDepth.
	DefaultMaxDepth = 64
	// MaxMaxDepth is the largest Options.MaxDepth accepted. The
	// canonicalizer recurses once per level.
	MaxMaxDepth = 10000
)

// Options say which parts of a request a fingerprint covers and how. A nil
// *Options, and every zero field, means the default documented on the
// field.
//
// The options are part of what a fingerprint means: fingerprints computed
// with different options differ. Changing an endpoint's options while its
// records are retained turns retries of requests made before the change
// into mismatches, exactly like changing the request would.
type Options struct {
	// Mode is how the body is canonicalized. Default: ModeJSON. Whatever
	// the mode, an empty body is covered as "no body".
	Mode Mode

	// Fields lists the JSON Pointers (RFC 6901, "/amount", "/items/0/sku",
	// "/a~1b" for the member "a/b") whose values ModeFields covers. Their
	// order and repetitions do not matter. A pointer that selects nothing
	// in a body is covered as absent, which differs from null. Required in
	// ModeFields, not allowed in the other modes. The whole body is still
	// parsed and checked, so a malformed body is an error in every mode
	// but ModeRaw.
	Fields []string

	// Headers names the request headers covered, case-insensitively.
	// Default: none. A named header missing from the request is covered as
	// absent; its values are covered in the order they were sent. Name
	// only headers that define the operation (a currency or API-version
	// header), never per-attempt ones (Date, traceparent, the
	// Idempotency-Key itself, which is already the record's key).
	Headers []string

	// Query names the query parameters covered, case-sensitively. Default:
	// none: the query string is not covered. Named parameters are covered
	// by name, so their order in the URL does not matter; the values of one
	// parameter are covered in order.
	Query []string

	// MaxBodySize is the largest body fingerprinted, in bytes. Default:
	// DefaultMaxBodySize (1 MiB). A larger body is an ErrTooLarge. ModeJSON
	// and ModeFields hold about three times the body in memory while
	// canonicalizing (a number such as 1e20 grows when spelled out).
	MaxBodySize int

	// MaxDepth is the deepest nesting of JSON arrays and objects accepted.
	// Default: DefaultMaxDepth (64); at most MaxMaxDepth. Deeper bodies are
	// an ErrTooDeep.
	MaxDepth int

	// InexactNumbers accepts numbers whose value changes on their way
	// through a 64-bit float, rounding them as RFC 8785 does. Default: off:
	// such a number is an ErrInexactNumber, since two different numbers
	// (9007199254740993 and 9007199254740992) would share a fingerprint
	// and a retry with the other would be replayed. Turn it on only for a
	// route whose handler reads numbers as doubles too.
	InexactNumbers bool

	// Diagnostics makes Compute also return per-part digests (FP.Diagnostics)
	// so that Explain can later name which parts of a mismatching retry
	// differ. Default: off. It costs a few bytes per covered part, stored
	// by the caller (see docs/fingerprint.md for figures), and does not
	// change FP.Bytes.
	Diagnostics bool
}

// EnsureDefaults returns a copy of o (which may be nil) with every zero
// field set to its default.
func (o *Options) EnsureDefaults() *Options {
	var c Options
	if o != nil {
		c = *o
	}
	if c.MaxBodySize == 0 {
		c.MaxBodySize = DefaultMaxBodySize
	}
	if c.MaxDepth == 0 {
		c.MaxDepth = DefaultMaxDepth
	}
	return &c
}

// Validate reports options that cannot be used. Its errors wrap
// ErrInvalidOptions.
func (o *Options) Validate() error {
	var errs []error
	switch o.Mode {
	case ModeJSON, ModeRaw:
		if len(o.Fields) > 0 {
			errs = append(errs, fmt.Errorf("Fields are set but Mode is %s, not fields", o.Mode))
		}
	case ModeFields:
		if len(o.Fields) == 0 {
			errs = append(errs, errors.New("Mode is fields but no Fields are set"))
		}
	default:
		errs = append(errs, fmt.Errorf("unknown Mode %d", uint8(o.Mode)))
	}
	for _, p := range o.Fields {
		if err := checkPointer(p); err != nil {
			errs = append(errs, err)
		}
	}
	for _, h := range o.Headers {
		if !validHeaderName(h) {
			errs = append(errs, fmt.Errorf("Headers: %q is not a header name", h))
		}
	}
	for _, q := range o.Query {
		if !utf8.ValidString(q) {
			errs = append(errs, fmt.Errorf("Query: %q is not valid UTF-8", q))
		}
	}
	if o.MaxBodySize < 0 {
		errs = append(errs, fmt.Errorf("MaxBodySize %d is negative", o.MaxBodySize))
	}
	if o.MaxDepth < 0 || o.MaxDepth > MaxMaxDepth {
		errs = append(errs, fmt.Errorf("MaxDepth %d outside 0..%d", o.MaxDepth, MaxMaxDepth))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	return nil
}

// config is a validated Options with its name lists in canonical form:
// header names lower-cased, every list sorted and without repetitions.
type config struct {
	mode        Mode
	fields      []string
	headers     []string
	query       []string
	maxBody     int
	maxDepth    int
	inexact     bool
	diagnostics bool
}

func newConfig(opts *Options) (config, error) {
	o := opts.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return config{}, err
	}
	c := config{
		mode: o.Mode, maxBody: o.MaxBodySize, maxDepth: o.MaxDepth, inexact: o.InexactNumbers, diagnostics: o.Diagnostics,
		fields: sortedSet(o.Fields, false),
		query:  sortedSet(o.Query, false),
	}
	c.headers = sortedSet(o.Headers, true)
	return c, nil
}

// sortedSet returns names sorted bytewise without repetitions, lower-cased
// (ASCII only) if lower is set. It returns names itself when nothing needs
// to change, which is the common case of short, already sorted lists.
func sortedSet(names []string, lower bool) []string {
	ok := true
	for i, n := range names {
		if (lower && hasUpper(n)) || (i > 0 && names[i-1] >= n) {
			ok = false
			break
		}
	}
	if ok {
		return names
	}
	s := make([]string, len(names))
	for i, n := range names {
		if lower {
			n = strings.ToLower(n)
		}
		s[i] = n
	}
	slices.Sort(s)
	return slices.Compact(s)
}

func hasUpper(s string) bool {
	for i := 0; i < len(s); i++ {
		if 'A' <= s[i] && s[i] <= 'Z' {
			return true
		}
	}
	return false
}

// validHeaderName reports whether s is an RFC 9110 field name (a token).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
