package fingerprint

import (
	"bytes"
	"slices"
	"strconv"
)

// Numbers: JCS prints a number as ECMAScript prints the IEEE-754 double it
// parses to, so a number whose value the double cannot hold would share
// its canonical form with another; the canonicalizer refuses those unless
// Options.InexactNumbers allows the rounding.

// number reads the number at c.pos and appends its canonical form.
func (c *canon) number() error {
	start, i := c.pos, c.pos
	in := c.in
	if in[i] == '-' {
		i++
	}
	digits := i
	switch {
	case i < len(in) && in[i] == '0':
		i++
	case i < len(in) && '1' <= in[i] && in[i] <= '9':
		for i < len(in) && '0' <= in[i] && in[i] <= '9' {
			i++
		}
	default:
		c.pos = i
		return c.unexpected("in a number (want a digit)")
	}
	intDigits := i - digits
	plain := true
	if i < len(in) && in[i] == '.' {
		plain = false
		i++
		if i >= len(in) || in[i] < '0' || in[i] > '9' {
			c.pos = i
			return c.unexpected("after a decimal point (want a digit)")
		}
		for i < len(in) && '0' <= in[i] && in[i] <= '9' {
			i++
		}
	}
	if i < len(in) && (in[i] == 'e' || in[i] == 'E') {
		plain = false
		i++
		if i < len(in) && (in[i] == '+' || in[i] == '-') {
			i++
		}
		if i >= len(in) || in[i] < '0' || in[i] > '9' {
			c.pos = i
			return c.unexpected("in an exponent (want a digit)")
		}
		for i < len(in) && '0' <= in[i] && in[i] <= '9' {
			i++
		}
	}
	c.pos = i
	lex := in[start:i]
	// An integer of at most 15 digits is exact in a float64 and ECMAScript
	// prints it as written; only -0 changes.
	if plain && intDigits <= 15 {
		if len(lex) == 2 && lex[0] == '-' && lex[1] == '0' {
			lex = lex[1:]
		}
		c.out = append(c.out, lex...)
		return nil
	}
	f, err := parseFloat(lex)
	if err != nil {
		// The grammar was checked above: only a range error is left.
		shown := lex
		if len(shown) > 40 {
			shown = append(slices.Clip(shown[:40]), "..."...)
		}
		return bodyError(ErrNumberRange, start, "%s is beyond the range of a 64-bit float", shown)
	}
	at := len(c.out)
	c.out = appendNumber(c.out, f)
	if !c.inexact && !sameDecimal(lex, c.out[at:]) {
		shown := lex
		if len(shown) > 40 {
			shown = append(slices.Clip(shown[:40]), "..."...)
		}
		return bodyError(ErrInexactNumber, start, "%s is not exact in a 64-bit float (it would be %s); send it as a string", shown, c.out[at:])
	}
	return nil
}

// maxExponent bounds the exponent a number writes, as decimalOf reads it.
const maxExponent = 1 << 50

// maxFloatDigits is the most significant digits a number needs to round
// to a float64 as its whole mantissa would: 767 for the longest exact
// value of a float64, one more for a point halfway between two, and a
// last that stands for every digit dropped after them.
const maxFloatDigits = 769

// parseFloat is strconv.ParseFloat of the JSON number lex (grammar
// checked). strconv misreads a mantissa longer than 800 digits, so a
// long one is read from its significant digits alone, the 768 first and
// a last 1 for the rest, which are not all zero: the float they round
// to is the same.
func parseFloat(lex []byte) (float64, error) {
	if len(lex) <= maxFloatDigits {
		return strconv.ParseFloat(string(lex), 64)
	}
	neg, digits, exp := decimalOf(lex, nil)
	if len(digits) > maxFloatDigits {
		digits = append(digits[:maxFloatDigits-1], '1')
	}
	b := make([]byte, 0, len(digits)+16)
	if neg {
		b = append(b, '-')
	}
	b = append(b, "0."...)
	b = append(b, digits...)
	if len(digits) == 0 {
		b = append(b, '0')
	}
	b = append(b, 'e')
	b = strconv.AppendInt(b, int64(exp), 10)
	return strconv.ParseFloat(string(b), 64)
}

// sameDecimal reports whether the JSON numbers a and b (grammar checked)
// denote the same decimal value.
func sameDecimal(a, b []byte) bool {
	var abuf, bbuf [40]byte
	an, ad, ae := decimalOf(a, abuf[:0])
	bn, bd, be := decimalOf(b, bbuf[:0])
	if len(ad) == 0 || len(bd) == 0 {
		return len(ad) == len(bd) // zero is zero, whatever its sign
	}
	return an == bn && ae == be && bytes.Equal(ad, bd)
}

// decimalOf splits the JSON number lex into its sign and its value as
// 0.digits × 10^exp, digits without leading or trailing zeros (none for
// zero), appended to buf. A written exponent beyond maxExponent
// saturates there: the digits of a number cannot move its point that far
// back (a body is far shorter), so such a number is still beyond a
// float's range, and the sum of the two stays exact.
func decimalOf(lex, buf []byte) (neg bool, digits []byte, exp int) {
	i := 0
	if lex[0] == '-' {
		neg, i = true, 1
	}
	intDigits, fraction := 0, false
	for ; i < len(lex) && lex[i] != 'e' && lex[i] != 'E'; i++ {
		d := lex[i]
		if d == '.' {
			fraction = true
			continue
		}
		if !fraction {
			intDigits++
		}
		if d == '0' && len(buf) == 0 {
			exp-- // a leading zero moves the point, not the digits
			continue
		}
		buf = append(buf, d)
	}
	e := 0
	if i < len(lex) {
		i++
		sign := 1
		if lex[i] == '+' || lex[i] == '-' {
			if lex[i] == '-' {
				sign = -1
			}
			i++
		}
		for ; i < len(lex); i++ {
			e = min(e*10+int(lex[i]-'0'), maxExponent)
		}
		e *= sign
	}
	for len(buf) > 0 && buf[len(buf)-1] == '0' {
		buf = buf[:len(buf)-1]
	}
	return neg, buf, exp + intDigits + e
}

// appendNumber appends f (finite) the way ECMAScript's Number::toString
// (ECMA-262, 6.1.6.1.20) prints it, which is how JCS serializes numbers.
// strconv finds the shortest digits that round-trip, which are the digits
// ECMAScript requires; only their layout differs from Go's 'g' format.
func appendNumber(dst []byte, f float64) []byte {
	if f == 0 {
		return append(dst, '0') // also -0
	}
	if f < 0 {
		dst = append(dst, '-')
		f = -f
	}
	var buf [32]byte
	e := strconv.AppendFloat(buf[:0], f, 'e', -1, 64) // d[.ddd]e±XX
	x := bytes.IndexByte(e, 'e')
	exp, _ := strconv.Atoi(string(e[x+1:]))
	// The digits s (k of them) and n such that f = s × 10^(n-k).
	var s [24]byte
	k := copy(s[:], e[:1])
	if x > 1 {
		k += copy(s[k:], e[2:x])
	}
	n := exp + 1
	switch {
	case k <= n && n <= 21: // an integer: the digits, then zeros
		dst = append(dst, s[:k]...)
		for range n - k {
			dst = append(dst, '0')
		}
	case 0 < n && n <= 21: // a decimal point inside the digits
		dst = append(dst, s[:n]...)
		dst = append(dst, '.')
		dst = append(dst, s[n:k]...)
	case -6 < n && n <= 0: // 0.000ddd
		dst = append(dst, '0', '.')
		for range -n {
			dst = append(dst, '0')
		}
		dst = append(dst, s[:k]...)
	default: // exponential: d[.ddd]e±x
		dst = append(dst, s[0])
		if k > 1 {
			dst = append(dst, '.')
			dst = append(dst, s[1:k]...)
		}
		dst = append(dst, 'e')
		if n-1 > 0 {
			dst = append(dst, '+')
		}
		dst = strconv.AppendInt(dst, int64(n-1), 10)
	}
	return dst
}
