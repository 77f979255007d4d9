package fingerprint_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/idemkv/idemkv/fingerprint"
	"pgregory.net/rapid"
)

// A model of JSON values: nil, bool, float64, string, []any, object.
type object []objMember

type objMember struct {
	name string
	val  any
}

// genDoc draws a request body: mostly an object, as request bodies are,
// sometimes any JSON value.
func genDoc(t *rapid.T, depth int) any {
	if rapid.IntRange(0, 4).Draw(t, "top") == 4 {
		return genValue(t, depth)
	}
	return genObject(t, depth, 1)
}

// genValue draws a JSON value nested at most depth levels.
func genValue(t *rapid.T, depth int) any {
	kinds := []string{"object", "array", "number", "string", "null", "bool", "number", "string", "object", "array"}
	if depth == 0 {
		kinds = kinds[2:6]
	}
	switch rapid.SampledFrom(kinds).Draw(t, "kind") {
	case "null":
		return nil
	case "bool":
		return rapid.Bool().Draw(t, "bool")
	case "number":
		return genNumber(t)
	case "string":
		return genString(t, "string")
	case "array":
		n := rapid.IntRange(0, 4).Draw(t, "len")
		a := make([]any, n)
		for i := range a {
			a[i] = genValue(t, depth-1)
		}
		return a
	}
	return genObject(t, depth, 0)
}

func genObject(t *rapid.T, depth, minMembers int) object {
	names := rapid.SliceOfNDistinct(rapid.Custom(func(t *rapid.T) string { return genString(t, "name") }), minMembers, 5, rapid.ID[string]).Draw(t, "names")
	o := make(object, len(names))
	for i, n := range names {
		o[i] = objMember{n, genValue(t, depth-1)}
	}
	return o
}

func genNumber(t *rapid.T) float64 {
	switch rapid.IntRange(0, 3).Draw(t, "numkind") {
	case 0:
		return float64(rapid.IntRange(-1000, 1000).Draw(t, "int"))
	case 1:
		return rapid.SampledFrom([]float64{0, 1e21, 1e-7, 1e-6, 5e-324, math.MaxFloat64, 9007199254740992, 0.1, 333333333.3333333, 1.5e300}).Draw(t, "special")
	default:
		return rapid.Float64().Draw(t, "float")
	}
}

// genString draws strings rich in what JCS treats specially: escapes,
// control characters, non-ASCII, supplementary-plane characters.
func genString(t *rapid.T, label string) string {
	r := rapid.OneOf(
		rapid.RuneFrom([]rune{'a', 'b', 'A', '0', ' ', '"', '\\', '/', '\n', '\t', 0, 0x1f, 0x7f, 'é', '€', 0xff61, 0x2028, 0x1f600, 0x10ffff, 0xfb33}),
		rapid.Rune(),
	)
	return rapid.StringOfN(r, 0, 6, -1).Draw(t, label)
}

// spell writes v as JSON text with randomly chosen, equivalent spelling:
// whitespace, member order, string escapes and number forms.
func spell(t *rapid.T, v any) string {
	var b strings.Builder
	spellTo(t, &b, v)
	return b.String()
}

func ws(t *rapid.T) string {
	return rapid.SampledFrom([]string{"", "", " ", "\n", "\t", "\r\n  "}).Draw(t, "ws")
}

func spellTo(t *rapid.T, b *strings.Builder, v any) {
	b.WriteString(ws(t))
	switch v := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(v))
	case float64:
		b.WriteString(spellNumber(t, v))
	case string:
		b.WriteString(spellString(t, v))
	case []any:
		b.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				b.WriteByte(',')
			}
			spellTo(t, b, e)
		}
		b.WriteString(ws(t) + "]")
	case object:
		b.WriteByte('{')
		for i, m := range rapid.Permutation(v).Draw(t, "order") {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(ws(t) + spellString(t, m.name) + ws(t) + ":")
			spellTo(t, b, m.val)
		}
		b.WriteString(ws(t) + "}")
	}
	b.WriteString(ws(t))
}

// spellNumber writes f in one of its many decimal spellings: 5000 as
// 5000, 5e3, 5.000E+3, 0.5e4, 50000e-1...
func spellNumber(t *rapid.T, f float64) string {
	sign := ""
	if math.Signbit(f) {
		sign, f = "-", -f
	}
	if f == 0 {
		return sign + rapid.SampledFrom([]string{"0", "0.0", "0e5", "0.000E-3"}).Draw(t, "zero")
	}
	// f = 0.digits × 10^n
	e := strconv.FormatFloat(f, 'e', -1, 64)
	mant, exp, _ := strings.Cut(e, "e")
	digits := strings.Replace(mant, ".", "", 1)
	x, _ := strconv.Atoi(exp)
	n := x + 1
	digits += strings.Repeat("0", rapid.IntRange(0, 3).Draw(t, "trailing zeros"))
	p := rapid.IntRange(0, len(digits)).Draw(t, "point")
	intPart, frac := digits[:p], digits[p:]
	if intPart == "" {
		intPart = "0"
	} else if intPart[0] == '0' {
		return sign + e // a leading zero is not JSON; keep it simple
	}
	s := intPart
	if frac != "" {
		s += "." + frac
	}
	if ex := n - p; ex != 0 || rapid.Bool().Draw(t, "explicit exponent") {
		s += rapid.SampledFrom([]string{"e", "E", "e+", "E+"}).Draw(t, "e")
		if ex < 0 {
			s = strings.TrimSuffix(strings.TrimSuffix(s, "+"), "+")
		}
		s += strconv.Itoa(ex)
	}
	return sign + s
}

// spellString writes s as a JSON string, escaping each character or not
// at random (where JSON allows the choice).
func spellString(t *rapid.T, s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		must := r < 0x20 || r == '"' || r == '\\'
		if !must && !rapid.Bool().Draw(t, "escape") {
			b.WriteRune(r)
			continue
		}
		short := map[rune]string{'"': `\"`, '\\': `\\`, '/': `\/`, '\b': `\b`, '\f': `\f`, '\n': `\n`, '\r': `\r`, '\t': `\t`}[r]
		if short != "" && rapid.Bool().Draw(t, "short escape") {
			b.WriteString(short)
			continue
		}
		format := rapid.SampledFrom([]string{`\u%04x`, `\u%04X`}).Draw(t, "hex case")
		for _, u := range utf16.Encode([]rune{r}) {
			fmt.Fprintf(&b, format, u)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// toAny converts a model value to what encoding/json decodes.
func toAny(v any) any {
	switch v := v.(type) {
	case []any:
		a := make([]any, len(v))
		for i, e := range v {
			a[i] = toAny(e)
		}
		return a
	case object:
		m := map[string]any{}
		for _, e := range v {
			m[e.name] = toAny(e.val)
		}
		return m
	}
	return v
}

// checkSorted checks, with an implementation independent of the package's,
// that every object in the canonical text has its names in UTF-16 order.
func checkSorted(t *rapid.T, canon []byte) {
	dec := json.NewDecoder(bytes.NewReader(canon))
	type frame struct {
		object bool
		last   []uint16
		key    bool // the next string token is a name
		first  bool
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err != nil {
			break
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		isKey := top != nil && top.object && top.key
		if top != nil && top.object {
			top.key = !top.key
		}
		switch tok := tok.(type) {
		case json.Delim:
			switch tok {
			case '{':
				stack = append(stack, &frame{object: true, key: true, first: true})
			case '[':
				stack = append(stack, &frame{})
			default:
				stack = stack[:len(stack)-1]
				if len(stack) > 0 && stack[len(stack)-1].object {
					stack[len(stack)-1].key = true
				}
			}
		case string:
			if isKey {
				u := utf16.Encode([]rune(tok))
				if !top.first && slices.Compare(top.last, u) >= 0 {
					t.Fatalf("names out of order in %s: %q after %q", canon, tok, string(utf16.Decode(top.last)))
				}
				top.last, top.first = u, false
			}
		}
	}
}

func TestPropertySpelling(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		v := genDoc(t, 3)
		s1, s2 := spell(t, v), spell(t, v)
		c1, err := fingerprint.Canonical([]byte(s1), nil)
		if err != nil {
			t.Fatalf("%s: %v", s1, err)
		}
		c2, err := fingerprint.Canonical([]byte(s2), nil)
		if err != nil {
			t.Fatalf("%s: %v", s2, err)
		}
		if !bytes.Equal(c1, c2) {
			t.Fatalf("two spellings, two canonical forms:\n%s\n%s\n->\n%s\n%s", s1, s2, c1, c2)
		}
		again, err := fingerprint.Canonical(c1, nil)
		if err != nil || !bytes.Equal(again, c1) {
			t.Fatalf("canonicalizing %s again gave %s, %v", c1, again, err)
		}
		var decoded any
		if err := json.Unmarshal(c1, &decoded); err != nil {
			t.Fatalf("%s: %v", c1, err)
		}
		if !equalJSON(decoded, toAny(v)) {
			t.Fatalf("%s does not decode to the value spelled", c1)
		}
		checkSorted(t, c1)

		req := fingerprint.Request{Tenant: "t", Method: "POST", Route: "/r"}
		r1, r2 := req, req
		r1.Body, r2.Body = []byte(s1), []byte(s2)
		f1, err1 := fingerprint.Compute(r1, nil)
		f2, err2 := fingerprint.Compute(r2, nil)
		if err1 != nil || err2 != nil || !bytes.Equal(f1.Bytes, f2.Bytes) {
			t.Fatalf("fingerprints %s, %s (%v, %v) for\n%s\n%s", f1, f2, err1, err2, s1, s2)
		}
	})
}

// equalJSON compares decoded JSON; unlike reflect.DeepEqual it also holds
// -0 equal to 0, as JSON numbers do.
func equalJSON(a, b any) bool {
	switch a := a.(type) {
	case []any:
		b, ok := b.([]any)
		return ok && slices.EqualFunc(a, b, equalJSON)
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for k, v := range a {
			if w, ok := b[k]; !ok || !equalJSON(v, w) {
				return false
			}
		}
		return true
	}
	return a == b
}

// mutate returns v with one value changed, added or removed, somewhere.
func mutate(t *rapid.T, v any) any {
	switch v := v.(type) {
	case []any:
		if len(v) > 0 && rapid.Bool().Draw(t, "descend") {
			i := rapid.IntRange(0, len(v)-1).Draw(t, "index")
			w := slices.Clone(v)
			w[i] = mutate(t, w[i])
			return w
		}
		if len(v) > 0 && rapid.Bool().Draw(t, "shrink") {
			return v[:len(v)-1]
		}
		return append(slices.Clone(v), genValue(t, 1))
	case object:
		if len(v) > 0 {
			i := rapid.IntRange(0, len(v)-1).Draw(t, "member")
			w := slices.Clone(v)
			switch rapid.IntRange(0, 2).Draw(t, "how") {
			case 0:
				w[i].val = mutate(t, w[i].val)
			case 1:
				w[i].name += "\x00renamed" // unique: no generated name has it
			default:
				w = slices.Delete(w, i, i+1)
			}
			return w
		}
		return object{{"added", genValue(t, 1)}}
	case nil:
		return false
	case bool:
		if rapid.Bool().Draw(t, "retype") {
			return map[bool]string{true: "true", false: "false"}[v]
		}
		return !v
	case float64:
		if v == 0 {
			return 1.0
		}
		if rapid.Bool().Draw(t, "retype") {
			return strconv.FormatFloat(v, 'g', -1, 64)
		}
		return v / 2
	case string:
		return v + rapid.SampledFrom([]string{"x", "\x00", "é"}).Draw(t, "suffix")
	}
	panic(fmt.Sprintf("unknown value %T", v))
}

func TestPropertyValueChange(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		v := genDoc(t, 3)
		w := mutate(t, v)
		s1, s2 := spell(t, v), spell(t, w)
		c1, _ := fingerprint.Canonical([]byte(s1), nil)
		c2, _ := fingerprint.Canonical([]byte(s2), nil)
		if bytes.Equal(c1, c2) {
			t.Fatalf("a changed value kept its canonical form %s:\n%s\n%s", c1, s1, s2)
		}
		for _, mode := range []fingerprint.Mode{fingerprint.ModeJSON, fingerprint.ModeFields} {
			opts := &fingerprint.Options{Mode: mode}
			if mode == fingerprint.ModeFields {
				opts.Fields = []string{""} // the whole document
			}
			f1, err1 := fingerprint.Compute(fingerprint.Request{Body: []byte(s1)}, opts)
			f2, err2 := fingerprint.Compute(fingerprint.Request{Body: []byte(s2)}, opts)
			if err1 != nil || err2 != nil || bytes.Equal(f1.Bytes, f2.Bytes) {
				t.Fatalf("%s: same fingerprint %s (%v, %v) for\n%s\n%s", mode, f1, err1, err2, s1, s2)
			}
		}
	})
}

// genRequest draws a request whose every part is covered: a JSON body,
// path parameters, and the headers and query parameters named in opts.
func genRequest(t *rapid.T) (fingerprint.Request, *fingerprint.Options) {
	str := rapid.StringN(0, 8, -1)
	values := rapid.SliceOfN(str, 0, 3)
	names := rapid.SliceOfNDistinct(rapid.StringMatching(`[a-z][a-z0-9-]{0,6}`), 0, 3, rapid.ID[string])
	req := fingerprint.Request{
		Tenant: str.Draw(t, "tenant"),
		Method: rapid.SampledFrom([]string{"POST", "PUT", "PATCH", "DELETE", "post"}).Draw(t, "method"),
		Route:  str.Draw(t, "route"),
		Params: map[string]string{},
		Query:  map[string][]string{},
		Header: map[string][]string{},
		Body:   []byte(spell(t, genDoc(t, 2))),
	}
	for _, n := range names.Draw(t, "params") {
		req.Params[n] = str.Draw(t, "param")
	}
	opts := &fingerprint.Options{Query: names.Draw(t, "query names"), Headers: names.Draw(t, "header names")}
	for _, n := range opts.Query {
		if rapid.Bool().Draw(t, "query present") {
			req.Query[n] = values.Draw(t, "query values")
		}
	}
	for _, n := range opts.Headers {
		if rapid.Bool().Draw(t, "header present") {
			req.Header[strings.ToUpper(n[:1])+n[1:]] = values.Draw(t, "header values")
		}
	}
	return req, opts
}

func clone(r fingerprint.Request) fingerprint.Request {
	c := r
	c.Params = map[string]string{}
	for k, v := range r.Params {
		c.Params[k] = v
	}
	c.Query, c.Header = map[string][]string{}, map[string][]string{}
	for k, v := range r.Query {
		c.Query[k] = slices.Clone(v)
	}
	for k, v := range r.Header {
		c.Header[k] = slices.Clone(v)
	}
	return c
}

func TestPropertyPartChange(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		req, opts := genRequest(t)
		before, err := fingerprint.Compute(req, opts)
		if err != nil {
			t.Fatal(err)
		}

		// Spelled differently, it is the same request.
		same := clone(req)
		same.Body = []byte(fmt.Sprintf(" %s\n", req.Body))
		for k, v := range same.Header {
			delete(same.Header, k)
			same.Header[strings.ToLower(k)] = v
		}
		sameOpts := *opts
		sameOpts.Headers = append(slices.Clone(opts.Headers), opts.Headers...)
		slices.Reverse(sameOpts.Headers)
		if fp, _ := fingerprint.Compute(same, &sameOpts); !bytes.Equal(fp.Bytes, before.Bytes) {
			t.Fatalf("header case or option order changed the fingerprint")
		}

		// Any change to any part is another request.
		changed := clone(req)
		part := rapid.SampledFrom([]string{"tenant", "method", "route", "param", "query", "header", "body"}).Draw(t, "part")
		suffix := rapid.SampledFrom([]string{"x", "\x00", "/"}).Draw(t, "suffix")
		switch part {
		case "tenant":
			changed.Tenant += suffix
		case "method":
			changed.Method += suffix
		case "route":
			changed.Route += suffix
		case "param":
			changed.Params[pickOrNew(t, mapsKeys(changed.Params))] += suffix
		case "query":
			if len(opts.Query) == 0 {
				t.Skip("no query parameter is covered")
			}
			changeValues(t, changed.Query, rapid.SampledFrom(opts.Query).Draw(t, "name"), suffix)
		case "header":
			if len(opts.Headers) == 0 {
				t.Skip("no header is covered")
			}
			n := rapid.SampledFrom(opts.Headers).Draw(t, "name")
			changeValues(t, changed.Header, strings.ToUpper(n[:1])+n[1:], suffix)
		case "body":
			changed.Body = fmt.Appendf(nil, "%s 1", req.Body) // now malformed: must fail
			if _, err := fingerprint.Compute(changed, opts); err == nil {
				t.Fatalf("trailing data accepted")
			}
			changed.Body = []byte(fmt.Sprintf("[%s]", req.Body))
		}
		after, err := fingerprint.Compute(changed, opts)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Equal(after.Bytes, before.Bytes) {
			t.Fatalf("changing the %s kept fingerprint %s", part, after)
		}
		if ok, err := fingerprint.Matches(before.Bytes, changed, opts); ok || err != nil {
			t.Fatalf("Matches(%s) = %v, %v after changing the %s", before, ok, err, part)
		}
	})
}

func mapsKeys(m map[string]string) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// pickOrNew returns one of names or a name not among them.
func pickOrNew(t *rapid.T, names []string) string {
	if len(names) > 0 && rapid.Bool().Draw(t, "existing") {
		return rapid.SampledFrom(names).Draw(t, "name")
	}
	return "new-" + strings.Join(names, "-")
}

// changeValues changes the values of one header or query parameter: one
// value altered, one added, all removed, or the order reversed.
func changeValues(t *rapid.T, m map[string][]string, name, suffix string) {
	vs := m[name]
	switch {
	case len(vs) == 0:
		m[name] = []string{""} // present and empty is not absent
	case len(vs) > 1 && vs[0] != vs[len(vs)-1] && rapid.Bool().Draw(t, "reverse"):
		slices.Reverse(vs)
	case rapid.Bool().Draw(t, "remove"):
		delete(m, name)
	default:
		i := rapid.IntRange(0, len(vs)).Draw(t, "value")
		if i == len(vs) {
			m[name] = append(vs, "")
		} else {
			vs[i] += suffix
		}
	}
}

// TestPropertyNoConcatenation splits one string into tenant, method and
// route in different places: every split is a different request.
func TestPropertyNoConcatenation(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := rapid.StringN(0, 6, -1).Draw(t, "s")
		seen := map[string][2]int{}
		for i := 0; i <= len(s); i++ {
			for j := i; j <= len(s); j++ {
				fp, err := fingerprint.Compute(fingerprint.Request{Tenant: s[:i], Method: s[i:j], Route: s[j:]}, nil)
				if err != nil {
					t.Fatal(err)
				}
				if prev, dup := seen[fp.String()]; dup {
					t.Fatalf("splits %v and %v of %q collide", prev, [2]int{i, j}, s)
				}
				seen[fp.String()] = [2]int{i, j}
			}
		}
	})
}

// genNumberText draws JSON number text: an integer or decimal part of up to 25
// digits, sometimes with an exponent, so that some values are exact in a
// double and many are not.
func genNumberText(t *rapid.T) string {
	var b strings.Builder
	if rapid.Bool().Draw(t, "neg") {
		b.WriteByte('-')
	}
	digits := rapid.StringMatching(`(0|[1-9][0-9]{0,24})`).Draw(t, "int")
	b.WriteString(digits)
	if rapid.Bool().Draw(t, "frac") {
		b.WriteString("." + rapid.StringMatching(`[0-9]{1,20}`).Draw(t, "fraction"))
	}
	if rapid.IntRange(0, 3).Draw(t, "exp?") == 0 {
		fmt.Fprintf(&b, "e%d", rapid.IntRange(-330, 310).Draw(t, "exp"))
	}
	return b.String()
}

// TestPropertyNumbersExact: a number is accepted exactly when its
// canonical form denotes the same value as its text, decided here by exact
// rational arithmetic; two accepted numbers share a fingerprint only if
// they are the same number; with InexactNumbers every number in range is
// accepted, as RFC 8785 rounds it.
func TestPropertyNumbersExact(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a := genNumberText(t)
		got, err := fingerprint.Canonical([]byte(a), nil)
		f, ferr := strconv.ParseFloat(a, 64)
		if ferr != nil && !math.IsInf(f, 0) {
			t.Fatalf("%s: %v", a, ferr)
		}
		if math.IsInf(f, 0) {
			if !errors.Is(err, fingerprint.ErrNumberRange) {
				t.Fatalf("%s overflows, got %v", a, err)
			}
			return
		}
		text, _ := new(big.Rat).SetString(a)
		exact := false
		if canon, err := fingerprint.Canonical([]byte(a), &fingerprint.Options{InexactNumbers: true}); err != nil {
			t.Fatalf("%s in range, refused with InexactNumbers: %v", a, err)
		} else {
			c, _ := new(big.Rat).SetString(string(canon))
			exact = c.Cmp(text) == 0
		}
		if exact != (err == nil) {
			t.Fatalf("%s: exact %v, but Canonical says %q, %v", a, exact, got, err)
		}
		if err != nil && !errors.Is(err, fingerprint.ErrInexactNumber) {
			t.Fatalf("%s: %v", a, err)
		}

		b := genNumberText(t)
		gotB, errB := fingerprint.Canonical([]byte(b), nil)
		tb, _ := new(big.Rat).SetString(b)
		if err == nil && errB == nil && bytes.Equal(got, gotB) != (text.Cmp(tb) == 0) {
			t.Fatalf("%s and %s: canonical %s and %s", a, b, got, gotB)
		}
	})
}

// The numbers of the hostile-client report: different requests that a
// double cannot tell apart are refused, not replayed; numbers whose
// canonical form keeps their value are accepted.
func TestNumbersThatADoubleCannotTellApart(t *testing.T) {
	for _, in := range []string{"9007199254740993", "1000000000000000001", "5000.0000000000001", "1e-400", "0.30000000000000000001"} {
		_, err := fingerprint.Canonical([]byte(`{"amount":`+in+`}`), nil)
		if !errors.Is(err, fingerprint.ErrInexactNumber) || !errors.Is(err, fingerprint.ErrInvalidBody) {
			t.Errorf("%s: %v, want ErrInexactNumber", in, err)
		}
	}
	for in, want := range map[string]string{"9007199254740992": "9007199254740992", "1000000000000000000": "1000000000000000000",
		"5000.0": "5000", "0.1": "0.1", "1E3": "1000", "-0": "0", "0e999": "0", "123.4560e-2": "1.23456"} {
		got, err := fingerprint.Canonical([]byte(in), nil)
		if err != nil || string(got) != want {
			t.Errorf("%s: %s, %v; want %s", in, got, err, want)
		}
	}
}
