package fingerprint

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// JSON Pointers (RFC 6901), evaluated on canonical JSON text. The text is
// the canonicalizer's output, so it is valid, has no whitespace and uses
// only the escapes appendString writes; the walkers below rely on that and
// still check bounds, so a bug cannot turn into a panic.

// checkPointer reports whether p is a JSON Pointer: empty (the whole
// document) or "/"-separated tokens in which '~' appears only as "~0"
// ('~') or "~1" ('/').
func checkPointer(p string) error {
	if p == "" {
		return nil
	}
	if p[0] != '/' {
		return fmt.Errorf("Fields: %q is not a JSON Pointer (it must be empty or start with '/')", p)
	}
	if !utf8.ValidString(p) {
		return fmt.Errorf("Fields: %q is not valid UTF-8", p)
	}
	for i := 0; i < len(p); i++ {
		if p[i] == '~' && (i+1 == len(p) || (p[i+1] != '0' && p[i+1] != '1')) {
			return fmt.Errorf("Fields: %q: '~' must be followed by 0 or 1", p)
		}
	}
	return nil
}

// pointerTokens splits a valid pointer into its unescaped reference tokens.
func pointerTokens(p string) []string {
	if p == "" {
		return nil
	}
	toks := strings.Split(p[1:], "/")
	for i, t := range toks {
		if strings.IndexByte(t, '~') >= 0 {
			toks[i] = strings.NewReplacer("~1", "/", "~0", "~").Replace(t)
		}
	}
	return toks
}

// escapeToken escapes a member name as a pointer reference token.
func escapeToken(name string) string {
	if !strings.ContainsAny(name, "~/") {
		return name
	}
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(name)
}

// lookup returns the value that the pointer p selects in the canonical
// text doc, and whether there is one.
func lookup(doc []byte, p string) ([]byte, bool) {
	v := doc
	var name []byte
	for _, tok := range pointerTokens(p) {
		if len(v) == 0 {
			return nil, false
		}
		switch v[0] {
		case '{':
			found := false
			forMembers(v, func(n, val []byte) bool {
				name = unquote(name[:0], n)
				if string(name) == tok {
					v, found = val, true
					return false
				}
				return true
			})
			if !found {
				return nil, false
			}
		case '[':
			idx, ok := arrayIndex(tok)
			if !ok {
				return nil, false
			}
			found := false
			forElements(v, func(i int, val []byte) bool {
				if i == idx {
					v, found = val, true
					return false
				}
				return true
			})
			if !found {
				return nil, false
			}
		default:
			return nil, false // a scalar has no members
		}
	}
	return v, true
}

// arrayIndex parses a reference token as an array index: "0" or a decimal
// number without leading zeros. "-" (past the end) selects nothing.
func arrayIndex(tok string) (int, bool) {
	if tok == "" || (len(tok) > 1 && tok[0] == '0') {
		return 0, false
	}
	for i := 0; i < len(tok); i++ {
		if tok[i] < '0' || tok[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(tok)
	return n, err == nil
}

// forMembers calls f with the quoted name and the value of each member of
// the canonical object obj, until f returns false.
func forMembers(obj []byte, f func(name, val []byte) bool) {
	i := 1
	for i < len(obj) && obj[i] != '}' {
		ne := skipValue(obj, i)
		if ne >= len(obj) || obj[ne] != ':' {
			return
		}
		ve := skipValue(obj, ne+1)
		if ve > len(obj) || !f(obj[i:ne], obj[ne+1:ve]) {
			return
		}
		i = ve
		if i < len(obj) && obj[i] == ',' {
			i++
		}
	}
}

// forElements calls f with the index and value of each element of the
// canonical array arr, until f returns false.
func forElements(arr []byte, f func(i int, val []byte) bool) {
	i := 1
	for n := 0; i < len(arr) && arr[i] != ']'; n++ {
		e := skipValue(arr, i)
		if e > len(arr) || !f(n, arr[i:e]) {
			return
		}
		i = e
		if i < len(arr) && arr[i] == ',' {
			i++
		}
	}
}

// skipValue returns the offset just past the canonical value at doc[i].
func skipValue(doc []byte, i int) int {
	if i >= len(doc) {
		return len(doc)
	}
	switch doc[i] {
	case '"':
		for i++; i < len(doc); i++ {
			switch doc[i] {
			case '\\':
				i++
			case '"':
				return i + 1
			}
		}
		return len(doc)
	case '{', '[':
		depth := 0
		for i < len(doc) {
			switch doc[i] {
			case '"':
				i = skipValue(doc, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return len(doc)
	}
	for i < len(doc) && doc[i] != ',' && doc[i] != ']' && doc[i] != '}' && doc[i] != ':' {
		i++
	}
	return i
}

// unquote appends the decoded form of the canonical string q to dst.
func unquote(dst, q []byte) []byte {
	if len(q) < 2 {
		return dst
	}
	q = q[1 : len(q)-1]
	for i := 0; i < len(q); i++ {
		if q[i] != '\\' || i+1 >= len(q) {
			dst = append(dst, q[i])
			continue
		}
		i++
		switch q[i] {
		case 'b':
			dst = append(dst, '\b')
		case 't':
			dst = append(dst, '\t')
		case 'n':
			dst = append(dst, '\n')
		case 'f':
			dst = append(dst, '\f')
		case 'r':
			dst = append(dst, '\r')
		case 'u':
			if r, ok := hex4(q, i+1); ok {
				dst = utf8.AppendRune(dst, r)
				i += 4
			}
		default: // '"' and '\\'
			dst = append(dst, q[i])
		}
	}
	return dst
}
