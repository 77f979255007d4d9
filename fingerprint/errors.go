package fingerprint

import (
	"errors"
	"fmt"
)

// Errors. Match them with errors.Is.
//
// Every error about the request body (malformed JSON, a duplicate member, bad
// Unicode, a number out of range or not exact, too deep, too large) is a *BodyError that
// matches both ErrInvalidBody and its own kind: an HTTP layer answers all of
// them with 400 by testing for ErrInvalidBody alone. The other errors are the
// caller's or the store's fault, not the client's.
var (
	// ErrInvalidBody matches every *BodyError: the client sent a body that
	// cannot be fingerprinted. Answer 400 (or 413 for ErrTooLarge).
	ErrInvalidBody = errors.New("fingerprint: invalid body")

	// ErrMalformed: the body is not JSON (RFC 8259): a syntax error, a raw
	// control character in a string, trailing data.
	ErrMalformed = errors.New("fingerprint: malformed JSON")
	// ErrDuplicateName: an object has two members with the same name (after
	// unescaping). JCS cannot pick one without guessing the client's intent.
	ErrDuplicateName = errors.New("fingerprint: duplicate member name")
	// ErrInvalidUnicode: a byte sequence that is not UTF-8, or an escaped
	// lone surrogate (\ud800 without its pair).
	ErrInvalidUnicode = errors.New("fingerprint: invalid Unicode")
	// ErrNumberRange: a number whose magnitude is beyond float64 (about
	// 1.8e308). One that underflows is an ErrInexactNumber.
	ErrNumberRange = errors.New("fingerprint: number out of range")
	// ErrInexactNumber: a number whose value changes on its way through a
	// 64-bit float, such as 9007199254740993 or 5000.0000000000001 (or one
	// that underflows to 0): its canonical form would denote another
	// number, so two different requests could share a fingerprint. I-JSON
	// (RFC 7493, 2.2) asks senders not to use such numbers; send them as
	// strings. 0.1 and 5000.0 are exact in this sense: their canonical
	// forms, 0.1 and 5000, denote the same values.
	ErrInexactNumber = errors.New("fingerprint: number not exact in a 64-bit float")
	// ErrTooDeep: arrays and objects nested deeper than Options.MaxDepth.
	ErrTooDeep = errors.New("fingerprint: JSON nested too deeply")
	// ErrTooLarge: the body is longer than Options.MaxBodySize.
	ErrTooLarge = errors.New("fingerprint: body too large")

	// ErrInvalidOptions: the Options cannot be used (an unknown mode, a bad
	// JSON Pointer, a negative limit). A configuration bug, not the client's.
	ErrInvalidOptions = errors.New("fingerprint: invalid options")
	// ErrInvalidStored: a stored fingerprint or diagnostics value is not one
	// this package produced (wrong length, truncated, corrupt).
	ErrInvalidStored = errors.New("fingerprint: invalid stored value")
	// ErrUnknownVersion: a stored value names an algorithm version this
	// build does not know, for example one written by a newer release
	// before a rollback. It cannot be checked, either way.
	ErrUnknownVersion = errors.New("fingerprint: unknown version")
)

// A BodyError describes why a body cannot be fingerprinted. It matches
// ErrInvalidBody and its Kind with errors.Is.
type BodyError struct {
	// Kind is ErrMalformed, ErrDuplicateName, ErrInvalidUnicode,
	// ErrNumberRange, ErrInexactNumber, ErrTooDeep or ErrTooLarge.
	Kind error
	// Offset is the byte offset in the body where the problem was found,
	// or -1 when the problem has no position (ErrTooLarge).
	Offset int
	// Detail says what was found there, for a human.
	Detail string
}

// Error returns, for example,
// "fingerprint: malformed JSON at offset 17: invalid character 'x'".
func (e *BodyError) Error() string {
	s := e.Kind.Error()
	if e.Offset >= 0 {
		s += fmt.Sprintf(" at offset %d", e.Offset)
	}
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// Unwrap lets errors.Is match both ErrInvalidBody and e.Kind.
func (e *BodyError) Unwrap() []error { return []error{ErrInvalidBody, e.Kind} }

func bodyError(kind error, offset int, format string, args ...any) *BodyError {
	return &BodyError{Kind: kind, Offset: offset, Detail: fmt.Sprintf(format, args...)}
}
