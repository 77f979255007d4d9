package inbox

import (
	"errors"
	"strings"
)

// ErrRejected marks a handler's error as a permanent refusal of its
// event: a payload that is malformed or violates the handler's rules, and
// would be refused on every delivery (Reject wraps one). Process then
// drops the handler's writes, records the refusal as the event's outcome
// (with the position), and returns Outcome.Rejected with a nil error, so
// that the caller acknowledges the message: a poison event is settled
// once and never handled again.
//
// Reject only what no later delivery could accept. A failure that may
// pass (a conflict, a store or a network error) is an ordinary error:
// nothing is written and the message is redelivered.
var ErrRejected = errors.New("inbox: event rejected")

// Reject marks err as a permanent refusal of the event (see ErrRejected),
// and returns an error matching both ErrRejected and err (with errors.Is
// and errors.As) whose message is err's; it is the rejection's stored
// reason. Reject(nil) is nil. Returning ErrRejected itself, or an error
// wrapping it, has the same meaning.
func Reject(err error) error {
	if err == nil {
		return nil
	}
	return &rejected{err: err}
}

type rejected struct{ err error }

func (e *rejected) Error() string   { return e.err.Error() }
func (e *rejected) Unwrap() []error { return []error{ErrRejected, e.err} }

// clip shortens a reason to at most maxReason bytes without splitting a
// UTF-8 sequence (and drops invalid ones: the stored reason is text).
func clip(s string) string {
	if len(s) > maxReason {
		s = s[:maxReason]
	}
	return strings.ToValidUTF8(s, "")
}
