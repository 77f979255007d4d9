package fingerprint

import (
	"bytes"
	"slices"
	"strconv"
	"unicode/utf8"
)

// This file is the RFC 8785 JSON Canonicalization Scheme (JCS). Its output
// is part of fingerprint version 1: a change to what it produces for any
// accepted input changes stored fingerprints, so it needs a new version
// (see versions.go), never an edit in place. TestVectors guards that.
//
// The parser is a strict RFC 8259 recursive-descent parser that writes the
// canonical form as it goes: strings re-escaped minimally, numbers
// re-spelled the way ECMAScript prints them, and each object's members
// reordered once the object is complete. It never builds a tree.

// Canonical returns the JCS (RFC 8785) canonical form of the JSON text
// body: no whitespace, object members sorted by the UTF-16 code units of
// their names, numbers in ECMAScript's shortest form, strings escaped
// minimally. Only opts.MaxBodySize and opts.MaxDepth are used; a nil opts
// means the defaults.
//
// It fails with a *BodyError (matching ErrInvalidBody) on a body that is
// empty, malformed, has a duplicate member name, invalid Unicode, a number
// beyond float64 or not exact in one (unless Options.InexactNumbers), or is
// too large or too deep; with ErrInvalidOptions on
// bad limits.
func Canonical(body []byte, opts *Options) ([]byte, error) {
	o := opts.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if len(body) > o.MaxBodySize {
		return nil, tooLarge(len(body), o.MaxBodySize)
	}
	c := canonPool.Get()
	defer c.release()
	if err := c.run(body, o.MaxDepth, o.InexactNumbers); err != nil {
		return nil, err
	}
	return bytes.Clone(c.out), nil
}

func tooLarge(n, limit int) *BodyError {
	return bodyError(ErrTooLarge, -1, "%d bytes, limit %d", n, limit)
}

// canon is the canonicalizer's state. Its buffers are reused through
// canonPool; c.out is valid until the canon is released.
type canon struct {
	in       []byte
	pos      int
	depth    int
	maxDepth int
	inexact  bool // Options.InexactNumbers
	out      []byte
	// names holds the decoded member names of the objects being built, as
	// a stack: an object's names follow its enclosing object's.
	names []byte
	// members holds the members of the objects being built, as a stack.
	members []member
	// dec is the decoded form of the string being read, when it has
	// escapes or non-ASCII bytes.
	dec []byte
	// scratch is where an object's members are copied while reordered.
	scratch []byte
}

// member is one member of an object being built.
type member struct {
	name       [2]int // the decoded name, in canon.names
	start, end int    // `"name":value` in canon.out, without a comma
	at         int    // offset of the name in the input, for errors
}

// maxRetained bounds the buffers a pooled canon keeps, so that one huge
// body does not pin its memory forever.
const maxRetained = 256 << 10

var canonPool = poolOf(func() *canon { return new(canon) })

func (c *canon) release() {
	c.reset()
	canonPool.Put(c)
}

// reset forgets the input and drops buffers grown past maxRetained.
func (c *canon) reset() {
	if cap(c.out) > maxRetained || cap(c.scratch) > maxRetained || cap(c.names) > maxRetained || cap(c.dec) > maxRetained {
		*c = canon{}
	}
	c.in = nil
}

// run canonicalizes in into c.out.
func (c *canon) run(in []byte, maxDepth int, inexact bool) error {
	c.in, c.pos, c.depth, c.maxDepth, c.inexact = in, 0, 0, maxDepth, inexact
	c.out, c.names, c.members = c.out[:0], c.names[:0], c.members[:0]
	c.ws()
	if err := c.value(); err != nil {
		return err
	}
	c.ws()
	if c.pos < len(c.in) {
		return c.unexpected("after the top-level value")
	}
	return nil
}

// ws skips JSON whitespace.
func (c *canon) ws() {
	for c.pos < len(c.in) {
		switch c.in[c.pos] {
		case ' ', '\t', '\n', '\r':
			c.pos++
		default:
			return
		}
	}
}

// unexpected reports the byte at c.pos (or the end of input) as a syntax
// error.
func (c *canon) unexpected(where string) error {
	if c.pos >= len(c.in) {
		if where == "" {
			return bodyError(ErrMalformed, c.pos, "unexpected end of input")
		}
		return bodyError(ErrMalformed, c.pos, "unexpected end of input %s", where)
	}
	if where == "" {
		return bodyError(ErrMalformed, c.pos, "invalid character %s", quoteByte(c.in[c.pos]))
	}
	return bodyError(ErrMalformed, c.pos, "invalid character %s %s", quoteByte(c.in[c.pos]), where)
}

func quoteByte(b byte) string {
	if b >= 0x20 && b < 0x7f {
		return strconv.QuoteRune(rune(b))
	}
	return "0x" + string(hexDigits[b>>4]) + string(hexDigits[b&0xf])
}

const hexDigits = "0123456789abcdef"

func (c *canon) value() error {
	if c.pos >= len(c.in) {
		return c.unexpected("")
	}
	switch b := c.in[c.pos]; {
	case b == '{':
		return c.object()
	case b == '[':
		return c.array()
	case b == '"':
		return c.str(false)
	case b == '-' || ('0' <= b && b <= '9'):
		return c.number()
	case b == 't':
		return c.literal("true")
	case b == 'f':
		return c.literal("false")
	case b == 'n':
		return c.literal("null")
	}
	return c.unexpected("looking for a value")
}

func (c *canon) literal(lit string) error {
	if !bytes.HasPrefix(c.in[c.pos:], []byte(lit)) {
		for i := 0; i < len(lit); i++ {
			if c.pos+i >= len(c.in) || c.in[c.pos+i] != lit[i] {
				c.pos += i
				return c.unexpected("in literal " + lit)
			}
		}
	}
	c.pos += len(lit)
	c.out = append(c.out, lit...)
	return nil
}

// enter opens an array or object at c.pos.
func (c *canon) enter() error {
	if c.depth >= c.maxDepth {
		return bodyError(ErrTooDeep, c.pos, "more than %d nested arrays and objects", c.maxDepth)
	}
	c.depth++
	c.out = append(c.out, c.in[c.pos])
	c.pos++
	c.ws()
	return nil
}

func (c *canon) array() error {
	if err := c.enter(); err != nil {
		return err
	}
	if c.pos < len(c.in) && c.in[c.pos] == ']' {
		c.pos++
		c.out = append(c.out, ']')
		c.depth--
		return nil
	}
	for {
		if err := c.value(); err != nil {
			return err
		}
		c.ws()
		if c.pos >= len(c.in) {
			return c.unexpected("")
		}
		switch c.in[c.pos] {
		case ',':
			c.pos++
			c.out = append(c.out, ',')
			c.ws()
		case ']':
			c.pos++
			c.out = append(c.out, ']')
			c.depth--
			return nil
		default:
			return c.unexpected("after an array element (want ',' or ']')")
		}
	}
}

func (c *canon) object() error {
	if err := c.enter(); err != nil {
		return err
	}
	open := len(c.out) - 1 // the '{'
	base, nameBase := len(c.members), len(c.names)
	if c.pos < len(c.in) && c.in[c.pos] == '}' {
		c.pos++
		c.out = append(c.out, '}')
		c.depth--
		return nil
	}
	for {
		if c.pos >= len(c.in) || c.in[c.pos] != '"' {
			return c.unexpected("looking for a member name")
		}
		m := member{at: c.pos, start: len(c.out)}
		m.name[0] = len(c.names)
		if err := c.str(true); err != nil {
			return err
		}
		m.name[1] = len(c.names)
		c.ws()
		if c.pos >= len(c.in) || c.in[c.pos] != ':' {
			return c.unexpected("after a member name (want ':')")
		}
		c.pos++
		c.out = append(c.out, ':')
		c.ws()
		if err := c.value(); err != nil {
			return err
		}
		m.end = len(c.out)
		c.members = append(c.members, m)
		c.ws()
		if c.pos >= len(c.in) {
			return c.unexpected("")
		}
		if c.in[c.pos] == '}' {
			c.pos++
			break
		}
		if c.in[c.pos] != ',' {
			return c.unexpected("after an object member (want ',' or '}')")
		}
		c.pos++
		c.out = append(c.out, ',')
		c.ws()
	}
	if err := c.order(open, c.members[base:]); err != nil {
		return err
	}
	c.out = append(c.out, '}')
	c.members, c.names = c.members[:base], c.names[:nameBase]
	c.depth--
	return nil
}

// order puts the members ms of the object that opens at c.out[open] in
// JCS order, and rejects duplicate names. c.out holds the members as read,
// separated by commas; most bodies arrive sorted already and are left as
// they are.
func (c *canon) order(open int, ms []member) error {
	sorted := true
	for i := 1; i < len(ms); i++ {
		if compareUTF16(c.name(ms[i-1]), c.name(ms[i])) >= 0 {
			sorted = false
			break
		}
	}
	if sorted {
		return nil
	}
	slices.SortFunc(ms, func(a, b member) int { return compareUTF16(c.name(a), c.name(b)) })
	// Report the duplicate that comes first in the body.
	dup := -1
	for i := 1; i < len(ms); i++ {
		if bytes.Equal(c.name(ms[i-1]), c.name(ms[i])) {
			if at := max(ms[i-1].at, ms[i].at); dup < 0 || at < dup {
				dup = at
			}
		}
	}
	if dup >= 0 {
		for _, m := range ms {
			if m.at == dup {
				return bodyError(ErrDuplicateName, dup, "%s", quoteName(c.name(m)))
			}
		}
	}
	c.scratch = append(c.scratch[:0], c.out[open:]...)
	c.out = append(c.out[:open], '{')
	for i, m := range ms {
		if i > 0 {
			c.out = append(c.out, ',')
		}
		c.out = append(c.out, c.scratch[m.start-open:m.end-open]...)
	}
	return nil
}

func (c *canon) name(m member) []byte { return c.names[m.name[0]:m.name[1]] }

// quoteName quotes a member name for an error message, shortened if long.
func quoteName(name []byte) string {
	const limit = 64
	if len(name) > limit {
		cut := limit
		for cut > 0 && !utf8.RuneStart(name[cut]) {
			cut--
		}
		return strconv.Quote(string(name[:cut])) + "..."
	}
	return strconv.Quote(string(name))
}

// compareUTF16 compares two UTF-8 strings by their UTF-16 code units, as
// JCS sorts member names. UTF-8 byte order is code point order, which
// differs from UTF-16 order only between U+E000..U+FFFF and the
// supplementary planes: in UTF-16 the latter (surrogates D800..DFFF) come
// first.
func compareUTF16(a, b []byte) int {
	for len(a) > 0 && len(b) > 0 {
		if a[0] < utf8.RuneSelf && b[0] < utf8.RuneSelf {
			if a[0] != b[0] {
				return int(a[0]) - int(b[0])
			}
			a, b = a[1:], b[1:]
			continue
		}
		ra, na := utf8.DecodeRune(a)
		rb, nb := utf8.DecodeRune(b)
		if ra != rb {
			return int(utf16Key(ra)) - int(utf16Key(rb))
		}
		a, b = a[na:], b[nb:]
	}
	return len(a) - len(b)
}

// utf16Key maps r to a number that orders runes as their UTF-16 encodings
// do: the first code unit in the high bits and, for a supplementary rune,
// the low 10 bits of its second unit below it. (A BMP rune never shares its
// first unit with another rune; two supplementary runes that do share it
// are then ordered by the second unit.)
func utf16Key(r rune) rune {
	if r < 0x10000 {
		return r << 10
	}
	hi := 0xd800 + (r-0x10000)>>10
	return hi<<10 | (r-0x10000)&0x3ff
}

// str reads the string at c.pos and appends its canonical form to c.out.
// If name is set it also appends the decoded string to c.names.
func (c *canon) str(name bool) error {
	start := c.pos
	i := start + 1
	// Fast path: printable ASCII without escapes is its own canonical form.
	for i < len(c.in) {
		b := c.in[i]
		if b == '"' {
			c.out = append(c.out, c.in[start:i+1]...)
			if name {
				c.names = append(c.names, c.in[start+1:i]...)
			}
			c.pos = i + 1
			return nil
		}
		if b == '\\' || b < 0x20 || b >= utf8.RuneSelf {
			break
		}
		i++
	}
	dec := append(c.dec[:0], c.in[start+1:i]...)
	for {
		if i >= len(c.in) {
			return bodyError(ErrMalformed, i, "unexpected end of input in the string that starts at offset %d", start)
		}
		b := c.in[i]
		switch {
		case b == '"':
			c.pos = i + 1
			c.dec = dec
			c.out = appendString(c.out, dec)
			if name {
				c.names = append(c.names, dec...)
			}
			return nil
		case b == '\\':
			var err error
			dec, i, err = c.escape(dec, i)
			if err != nil {
				return err
			}
		case b < 0x20:
			return bodyError(ErrMalformed, i, "control character %s in a string (must be escaped)", quoteByte(b))
		case b < utf8.RuneSelf:
			dec = append(dec, b)
			i++
		default:
			r, n := utf8.DecodeRune(c.in[i:])
			if r == utf8.RuneError && n == 1 {
				return bodyError(ErrInvalidUnicode, i, "invalid UTF-8 byte %s", quoteByte(b))
			}
			dec = append(dec, c.in[i:i+n]...)
			i += n
		}
	}
}

// escape decodes the escape sequence at c.in[i], appending its character
// to dec, and returns the offset after it.
func (c *canon) escape(dec []byte, i int) ([]byte, int, error) {
	if i+1 >= len(c.in) {
		return dec, i, bodyError(ErrMalformed, i+1, "unexpected end of input in an escape")
	}
	switch e := c.in[i+1]; e {
	case '"', '\\', '/':
		return append(dec, e), i + 2, nil
	case 'b':
		return append(dec, '\b'), i + 2, nil
	case 'f':
		return append(dec, '\f'), i + 2, nil
	case 'n':
		return append(dec, '\n'), i + 2, nil
	case 'r':
		return append(dec, '\r'), i + 2, nil
	case 't':
		return append(dec, '\t'), i + 2, nil
	case 'u':
		r, ok := hex4(c.in, i+2)
		if !ok {
			return dec, i, bodyError(ErrMalformed, i, "invalid \\u escape (want four hex digits)")
		}
		switch {
		case 0xd800 <= r && r < 0xdc00:
			lo, ok := rune(0), false
			if i+7 < len(c.in) && c.in[i+6] == '\\' && c.in[i+7] == 'u' {
				lo, ok = hex4(c.in, i+8)
			}
			if !ok || lo < 0xdc00 || lo >= 0xe000 {
				return dec, i, bodyError(ErrInvalidUnicode, i, "lone surrogate \\u%04x", r)
			}
			return utf8.AppendRune(dec, 0x10000+(r-0xd800)<<10+(lo-0xdc00)), i + 12, nil
		case 0xdc00 <= r && r < 0xe000:
			return dec, i, bodyError(ErrInvalidUnicode, i, "lone surrogate \\u%04x", r)
		}
		return utf8.AppendRune(dec, r), i + 6, nil
	}
	return dec, i, bodyError(ErrMalformed, i, "invalid escape character %s after a backslash", quoteByte(c.in[i+1]))
}

// hex4 decodes the four hex digits at b[i:].
func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, h := range b[i : i+4] {
		switch {
		case '0' <= h && h <= '9':
			h -= '0'
		case 'a' <= h && h <= 'f':
			h -= 'a' - 10
		case 'A' <= h && h <= 'F':
			h -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(h)
	}
	return r, true
}

// appendString appends s (valid UTF-8) as a JCS string: '"' and '\\'
// escaped, control characters as \b \t \n \f \r or \u00xx, everything else
// literal.
func appendString(dst, s []byte) []byte {
	dst = append(dst, '"')
	from := 0
	for i, b := range s {
		if b >= 0x20 && b != '"' && b != '\\' {
			continue
		}
		dst = append(dst, s[from:i]...)
		switch b {
		case '"':
			dst = append(dst, `\"`...)
		case '\\':
			dst = append(dst, `\\`...)
		case '\b':
			dst = append(dst, `\b`...)
		case '\t':
			dst = append(dst, `\t`...)
		case '\n':
			dst = append(dst, `\n`...)
		case '\f':
			dst = append(dst, `\f`...)
		case '\r':
			dst = append(dst, `\r`...)
		default:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xf])
		}
		from = i + 1
	}
	dst = append(dst, s[from:]...)
	return append(dst, '"')
}
