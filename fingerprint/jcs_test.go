package fingerprint

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestNumberRFC8785 is RFC 8785 Appendix B: IEEE-754 values (as bit
// patterns) and the JCS text of each. NaN and Infinity are in the table as
// errors; JSON input cannot spell them, so they are not here.
func TestNumberRFC8785(t *testing.T) {
	for _, tc := range []struct {
		bits uint64
		want string
	}{
		{0x0000000000000000, "0"},
		{0x8000000000000000, "0"}, // -0
		{0x0000000000000001, "5e-324"},
		{0x8000000000000001, "-5e-324"},
		{0x7fefffffffffffff, "1.7976931348623157e+308"},
		{0xffefffffffffffff, "-1.7976931348623157e+308"},
		{0x4340000000000000, "9007199254740992"},
		{0xc340000000000000, "-9007199254740992"},
		{0x4430000000000000, "295147905179352830000"},
		{0x44b52d02c7e14af5, "9.999999999999997e+22"},
		{0x44b52d02c7e14af6, "1e+23"},
		{0x44b52d02c7e14af7, "1.0000000000000001e+23"},
		{0x444b1ae4d6e2ef4e, "999999999999999700000"},
		{0x444b1ae4d6e2ef4f, "999999999999999900000"},
		{0x444b1ae4d6e2ef50, "1e+21"},
		{0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"},
		{0x3eb0c6f7a0b5ed8d, "0.000001"},
		{0x41b3de4355555553, "333333333.3333332"},
		{0x41b3de4355555554, "333333333.33333325"},
		{0x41b3de4355555555, "333333333.3333333"},
		{0x41b3de4355555556, "333333333.3333334"},
		{0x41b3de4355555557, "333333333.33333343"},
		{0xbecbf647612f3696, "-0.0000033333333333333333"},
		{0x43143ff3c1cb0959, "1424953923781206.2"},
	} {
		f := math.Float64frombits(tc.bits)
		require.Equal(t, tc.want, string(appendNumber(nil, f)), "%016x", tc.bits)
		// The same value read back from its own text, and from Go's
		// spelling of it, canonicalizes to the same text.
		for _, in := range []string{tc.want, strconv.FormatFloat(f, 'g', -1, 64)} {
			got, err := Canonical([]byte(in), nil)
			require.NoError(t, err, in)
			require.Equal(t, tc.want, string(got), "input %s", in)
		}
		// Twenty digits are more than the double holds: rounded only when
		// the options allow it.
		in := strconv.FormatFloat(f, 'e', 20, 64)
		got, err := Canonical([]byte(in), &Options{InexactNumbers: true})
		require.NoError(t, err, in)
		require.Equal(t, tc.want, string(got), "input %s", in)
	}
}

// TestNumberLayout covers each branch of ECMAScript's Number::toString and
// well-known outputs of JavaScript's String(x).
func TestNumberLayout(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"1e21", "1e+21"},
		{"1e20", "100000000000000000000"},
		{"123456789012345678901", "123456789012345680000"},
		{"1e-7", "1e-7"},
		{"1e-6", "0.000001"},
		{"1.5e-7", "1.5e-7"},
		{"0.000001234", "0.000001234"},
		{"-0", "0"},
		{"-0.0", "0"},
		{"-0e10", "0"},
		{"1E400", ""}, // out of range
		{"1e-400", "0"},
		{"-1e-400", "0"},
		{"5e-324", "5e-324"},
		{"2e-324", "0"},
		{"1.7976931348623157e308", "1.7976931348623157e+308"},
		{"9007199254740992", "9007199254740992"},
		{"9007199254740993", "9007199254740992"}, // doubles cannot hold it
		{"333333333.3333333", "333333333.3333333"},
		{"0.30000000000000004", "0.30000000000000004"},
		{"100", "100"},
		{"1.0", "1"},
		{"1e0", "1"},
		{"10e-1", "1"},
		{"0.1e1", "1"},
		{"1E+2", "100"},
		{"123.456e1", "1234.56"},
		{"-1.5", "-1.5"},
		{"0.5", "0.5"},
		{"12345678901234567890", "12345678901234567000"},
		{"999999999999999", "999999999999999"},
		{"-999999999999999", "-999999999999999"},
		{"1.2e22", "1.2e+22"},
		{"4.35", "4.35"},
		{"0.1", "0.1"},
	} {
		got, err := Canonical([]byte(tc.in), &Options{InexactNumbers: true})
		if tc.want == "" {
			require.ErrorIs(t, err, ErrNumberRange, tc.in)
			continue
		}
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.want, string(got), tc.in)
	}
	a, b := 0.1, 0.2 // variables: Go folds constants exactly
	require.Equal(t, "0.30000000000000004", string(appendNumber(nil, a+b)))
	require.Equal(t, "-1e+21", string(appendNumber(nil, -1e21)))
}

// TestRFC8785Examples canonicalizes the RFC's sample object (section
// 3.2.2, output in 3.2.3) and its sorting example (3.2.3).
func TestRFC8785Examples(t *testing.T) {
	in := `{
  "numbers": [333333333.33333329, 1E30, 4.50,
              2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}`
	want := `{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],` +
		`"string":"€$\u000f\nA'B\"\\\\\"/"}`
	// 333333333.33333329 is not exact in a double: RFC 8785 rounds it,
	// which is what InexactNumbers allows.
	got, err := Canonical([]byte(in), &Options{InexactNumbers: true})
	require.NoError(t, err)
	require.Equal(t, want, string(got))
	_, err = Canonical([]byte(in), nil)
	require.ErrorIs(t, err, ErrInexactNumber)

	in = `{
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis"
}`
	want = `{"\r":"Carriage Return","1":"One","` + "\u0080" + `":"Control",` +
		`"ö":"Latin Small Letter O With Diaeresis","€":"Euro Sign",` +
		`"😀":"Emoji: Grinning Face","` + "\ufb33" + `":"Hebrew Letter Dalet With Dagesh"}`
	got, err = Canonical([]byte(in), nil)
	require.NoError(t, err)
	require.Equal(t, want, string(got))
}

func TestCanonical(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`null`, `null`},
		{` true `, `true`},
		{"\t\n\r false", `false`},
		{`[]`, `[]`},
		{`{}`, `{}`},
		{`[ 1 , [ ] , { } ]`, `[1,[],{}]`},
		{`{"b":1,"a":2}`, `{"a":2,"b":1}`},
		{`{"a":{"d":1,"c":[{"f":1,"e":2}]},"B":0}`, `{"B":0,"a":{"c":[{"e":2,"f":1}],"d":1}}`},
		{`"\/"`, `"/"`},
		{`"\u0041\u00e9\u20AC"`, `"Aé€"`},
		{`"\u007f\u001F\u0000"`, "\"\x7f\\u001f\\u0000\""},
		{`"\b\f\n\r\t"`, `"\b\f\n\r\t"`},
		{`"\u0008\u000c"`, `"\b\f"`},
		{`"\u2028\u2029"`, "\"\u2028\u2029\""},
		{`"\ud83d\ude00"`, `"😀"`},
		{`"😀"`, `"😀"`},
		// Names compare after unescaping, by UTF-16 code units: U+FF61 is
		// above U+1F600 in code points, below it in UTF-16.
		{`{"\uff61":1,"😀":2,"a":3}`, `{"a":3,"😀":2,"｡":1}`},
		{`{"\u0061b":1,"a":2}`, `{"a":2,"ab":1}`},
		{`{"":1," ":2}`, `{"":1," ":2}`},
	} {
		got, err := Canonical([]byte(tc.in), nil)
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.want, string(got), tc.in)
	}
}

func TestCanonicalErrors(t *testing.T) {
	for _, tc := range []struct {
		in     string
		kind   error
		offset int
		detail string
	}{
		{``, ErrMalformed, 0, "unexpected end of input"},
		{`   `, ErrMalformed, 3, "unexpected end of input"},
		{`{"a":1,}`, ErrMalformed, 7, "looking for a member name"},
		{`[1,]`, ErrMalformed, 3, "looking for a value"},
		{`[1 2]`, ErrMalformed, 3, "want ',' or ']'"},
		{`{"a" 1}`, ErrMalformed, 5, "want ':'"},
		{`{"a":1 "b":2}`, ErrMalformed, 7, "want ',' or '}'"},
		{`{a:1}`, ErrMalformed, 1, "member name"},
		{`01`, ErrMalformed, 1, "after the top-level value"},
		{`1.`, ErrMalformed, 2, "unexpected end of input"},
		{`1.e5`, ErrMalformed, 2, "decimal point"},
		{`.5`, ErrMalformed, 0, "looking for a value"},
		{`+1`, ErrMalformed, 0, "looking for a value"},
		{`-`, ErrMalformed, 1, "unexpected end of input"},
		{`-x`, ErrMalformed, 1, "'x' in a number (want a digit)"},
		{`1e`, ErrMalformed, 2, "exponent"},
		{`1e+`, ErrMalformed, 3, "exponent"},
		{`NaN`, ErrMalformed, 0, "'N'"},
		{`Infinity`, ErrMalformed, 0, "'I'"},
		{`-Infinity`, ErrMalformed, 1, "'I'"},
		{`tru`, ErrMalformed, 3, "unexpected end of input"},
		{`nul1`, ErrMalformed, 3, "'1' in literal null"},
		{`true false`, ErrMalformed, 5, "after the top-level value"},
		{`"abc`, ErrMalformed, 4, "string that starts at offset 0"},
		{"\"a\tb\"", ErrMalformed, 2, "control character 0x09"},
		{`"\x"`, ErrMalformed, 1, "invalid escape character 'x'"},
		{`"\u12"`, ErrMalformed, 1, "\\u escape"},
		{`"\u12G4"`, ErrMalformed, 1, "\\u escape"},
		{"\xef\xbb\xbf{}", ErrMalformed, 0, "0xef"}, // a byte order mark is not JSON
		{`{"a":1,"b":2,"a":3}`, ErrDuplicateName, 13, `"a"`},
		{`{"b":1,"a":2,"\u0061":3}`, ErrDuplicateName, 13, `"a"`},
		{`{"a":{"x":1,"x":2}}`, ErrDuplicateName, 12, `"x"`},
		{"\"a\xffb\"", ErrInvalidUnicode, 2, "invalid UTF-8 byte 0xff"},
		{"\"\xed\xa0\x80\"", ErrInvalidUnicode, 1, "0xed"}, // a surrogate in UTF-8
		{"\"\xc0\xaf\"", ErrInvalidUnicode, 1, "0xc0"},     // overlong
		{"{\"\xff\":1}", ErrInvalidUnicode, 2, ""},
		{`"\ud800"`, ErrInvalidUnicode, 1, `lone surrogate \ud800`},
		{`"\ud800\u0041"`, ErrInvalidUnicode, 1, `lone surrogate \ud800`},
		{`"\ude00\ud83d"`, ErrInvalidUnicode, 1, `lone surrogate \ude00`},
		{`[1e309]`, ErrNumberRange, 1, "1e309 is beyond the range"},
		{`-1.8e308`, ErrNumberRange, 0, ""},
		{strings.Repeat("[", 65) + strings.Repeat("]", 65), ErrTooDeep, 64, "more than 64"},
		{strings.Repeat(`{"a":`, 65) + "1" + strings.Repeat("}", 65), ErrTooDeep, 320, ""},
	} {
		_, err := Canonical([]byte(tc.in), nil)
		require.Error(t, err, "%q", tc.in)
		require.ErrorIs(t, err, ErrInvalidBody, "%q", tc.in)
		require.ErrorIs(t, err, tc.kind, "%q: %v", tc.in, err)
		var be *BodyError
		require.True(t, errors.As(err, &be))
		require.Equal(t, tc.offset, be.Offset, "%q: %v", tc.in, err)
		require.Contains(t, err.Error(), tc.detail, "%q", tc.in)
		require.True(t, strings.HasPrefix(err.Error(), "fingerprint: "), err.Error())
	}
}

func TestCanonicalLimits(t *testing.T) {
	deep := strings.Repeat("[", 64) + strings.Repeat("]", 64)
	_, err := Canonical([]byte(deep), nil)
	require.NoError(t, err, "64 levels are within the default")
	_, err = Canonical([]byte(deep), &Options{MaxDepth: 63})
	require.ErrorIs(t, err, ErrTooDeep)
	_, err = Canonical([]byte(strings.Repeat("[", 20000)), &Options{MaxDepth: MaxMaxDepth})
	require.ErrorIs(t, err, ErrTooDeep)

	_, err = Canonical([]byte(`"12345"`), &Options{MaxBodySize: 7})
	require.NoError(t, err)
	_, err = Canonical([]byte(`"123456"`), &Options{MaxBodySize: 7})
	require.ErrorIs(t, err, ErrTooLarge)
	require.ErrorIs(t, err, ErrInvalidBody)
	require.EqualError(t, err, "fingerprint: body too large: 8 bytes, limit 7")

	_, err = Canonical([]byte(`1`), &Options{MaxDepth: -1})
	require.ErrorIs(t, err, ErrInvalidOptions)
	require.NotErrorIs(t, err, ErrInvalidBody)
}

func TestCompareUTF16(t *testing.T) {
	// In code point order: a < é < U+FF61 < U+1F600. In UTF-16 order the
	// emoji (D83D DE00) sorts before U+FF61.
	names := []string{"", "a", "ab", "b", "é", "😀", "😁", "｡"}
	for i, a := range names {
		for j, b := range names {
			got := compareUTF16([]byte(a), []byte(b))
			switch {
			case i < j:
				require.Negative(t, got, "%q < %q", a, b)
			case i > j:
				require.Positive(t, got, "%q > %q", a, b)
			default:
				require.Zero(t, got)
			}
		}
	}
}

// TestLongMantissas: a number spelled with more digits than strconv reads
// whole (800) canonicalizes as its value does, exact or not: the value 1
// written with a thousand zeros is 1, in either mode.
func TestLongMantissas(t *testing.T) {
	zeros := strings.Repeat("0", 1000)
	ones := strings.Repeat("1", 1000)
	for _, tc := range []struct {
		in, want string
		inexact  bool
	}{
		{"1" + zeros + "e-1000", "1", false},
		{"0." + zeros + "1e1001", "1", false},
		{"-1" + zeros + "e-1000", "-1", false},
		{"1" + zeros + "e-1000", "1", true},
		{"1." + ones, "1.1111111111111112", true},
		{"1" + ones + "e-999", "11.11111111111111", true},
		{"0." + ones + "e1", "1.1111111111111112", true},
	} {
		got, err := Canonical([]byte(tc.in), &Options{InexactNumbers: tc.inexact})
		require.NoError(t, err, "%.40s...", tc.in)
		require.Equal(t, tc.want, string(got), "%.40s... (inexact %v)", tc.in, tc.inexact)
	}
	_, err := Canonical([]byte("1."+ones), nil)
	require.ErrorIs(t, err, ErrInexactNumber)

	// Digits that move the point further than an exponent of a million:
	// still the value 1.
	million := strings.Repeat("0", 1_000_010)
	for _, in := range []string{"0." + million + "1e1000011", "1" + million + "e-1000010"} {
		got, err := Canonical([]byte(in), &Options{MaxBodySize: 2 << 20})
		require.NoError(t, err)
		require.Equal(t, "1", string(got))
	}
}
