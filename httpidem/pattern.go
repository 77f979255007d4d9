package httpidem

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// restParam names, among a fingerprint's path parameters, the part of
// the request's path past the route pattern: what a subtree pattern
// ("/v1/") matched, or what a request under a mounted router has past
// Route.Pattern. It is not a valid wildcard name, so it never meets one.
const restParam = "..."

// patternPath returns the path part of an http.ServeMux pattern
// ("POST example.com/v1/{id}" -> "/v1/{id}").
func patternPath(pattern string) string {
	if i := strings.IndexAny(pattern, " \t"); i >= 0 {
		pattern = strings.TrimLeft(pattern[i:], " \t")
	}
	if i := strings.IndexByte(pattern, '/'); i >= 0 {
		return pattern[i:]
	}
	return ""
}

// pathParams returns what of r's path the fingerprint covers beyond the
// pattern itself: the values of pattern's wildcards, and the path past
// the pattern's last segment (restParam), if any. Two requests for two
// resources must never share a fingerprint, or one would be answered
// with the other's response. A wildcard with no value (other than a
// {name...} one, which may match nothing) means the router names it
// otherwise, or does not set Request.PathValue: every resource would
// look alike, and it is an error. The path past the pattern is in the
// normal form of RFC 3986 (normalizeEscapes); asIs is that path as the
// request spelled it, if that differs, for outcomes stored before the
// form was normal ("" otherwise).
func pathParams(r *http.Request, pattern string) (params map[string]string, asIs string, err error) {
	set := func(name, value string) {
		if params == nil {
			params = make(map[string]string)
		}
		params[name] = value
	}
	segs := strings.Split(strings.TrimPrefix(pattern, "/"), "/")
	rest := true // whether the path may go on past the pattern
	for i, seg := range segs {
		if !strings.HasPrefix(seg, "{") || !strings.HasSuffix(seg, "}") {
			continue
		}
		name, multi := strings.CutSuffix(seg[1:len(seg)-1], "...")
		switch {
		case name == "$":
			rest = false
			continue
		case name == "":
			continue
		}
		v := r.PathValue(name)
		if v == "" && !multi {
			return nil, "", fmt.Errorf("the wildcard {%s} of route pattern %q has no value in the request: "+
				"name it as the router does, or serve through an http.ServeMux", name, pattern)
		}
		if multi && i == len(segs)-1 {
			rest = false
		}
		set(name, v)
	}
	if rest {
		if tail := pathPast(requestPath(r), segs); tail != "" {
			set(restParam, normalizeEscapes(tail))
			if params[restParam] != tail {
				asIs = tail
			}
		}
	}
	return params, asIs, nil
}

// requestPath is the escaped path r was sent to, as the mux that matched
// the pattern saw it: a handler mounted with http.StripPrefix gets a
// shortened URL.Path, while Request.Pattern and RequestURI keep the
// whole.
func requestPath(r *http.Request) string {
	if u, err := url.ParseRequestURI(r.RequestURI); err == nil && u.EscapedPath() != "" {
		return u.EscapedPath()
	}
	return r.URL.EscapedPath()
}

// pathPast returns what of the escaped path lies past a pattern of the
// given segments: under a subtree pattern ("/v1/", whose last segment is
// empty) the path from that segment on, else the segments past the
// pattern's; "" if nothing.
func pathPast(path string, pattern []string) string {
	segs := strings.Split(strings.TrimPrefix(path, "/"), "/")
	n := len(pattern)
	if pattern[n-1] == "" {
		n-- // the subtree's own segment is past the pattern
	}
	if len(segs) <= n {
		return ""
	}
	return strings.Join(segs[n:], "/")
}

// normalizeEscapes returns the escaped path p in the normal form of RFC
// 3986, section 6.2.2: an escaped unreserved character spelled out, and
// the hex digits of other escapes in upper case. Two spellings of one
// path that a client or a proxy may send ("pay_%41", "pay_A") are then one
// resource, while an escaped "/" stays apart from a real one.
func normalizeEscapes(p string) string {
	if !strings.Contains(p, "%") {
		return p
	}
	var b strings.Builder
	b.Grow(len(p))
	for i := 0; i < len(p); i++ {
		if p[i] != '%' || i+2 >= len(p) || !isHex(p[i+1]) || !isHex(p[i+2]) {
			b.WriteByte(p[i])
			continue
		}
		c := unhex(p[i+1])<<4 | unhex(p[i+2])
		if isUnreserved(c) {
			b.WriteByte(c)
		} else {
			b.WriteByte('%')
			b.WriteString(strings.ToUpper(p[i+1 : i+3]))
		}
		i += 2
	}
	return b.String()
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c >= 'a':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

// isUnreserved reports whether c is an unreserved character of RFC 3986.
func isUnreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~'
}
