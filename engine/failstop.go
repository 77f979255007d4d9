package engine

import (
	"errors"
	"fmt"
	"strings"

	"github.com/cockroachdb/pebble/v2"
)

// Pebble stops the process (Logger.Fatalf) when a commit fails, a failed
// write or sync of its log among the causes: its commit pipeline cannot go
// on, and a batch whose sync failed is already visible to reads. (A commit
// that does not wait for a sync is not told of a failed log write; the
// next commit is, by a panic: see commitBatch.) The
// engine can do better than exit. Every commit it makes runs on a
// goroutine of its own that recovers, so the engine's logger turns that
// one fatal message into a panic carrying the error (commitFailure), the
// commit site recovers it (commitBatch), and the engine fails: every call
// from then on returns ErrFailed, reads included, so nothing reads the
// batch that was not made durable. The HTTP layer answers 503, the process
// stays up to say so, and a restart (a new process) reopens the store from
// what is durable. Likewise a failure to write the first MANIFEST of a new
// store becomes an error from Open. Every other fatal message still stops
// the process.
//
// After such a failure Close does not close Pebble, whose pipeline may be
// stuck behind the failed batch; the process must exit to release the
// store.

// fatalCommitPrefix starts the message Pebble logs through Fatalf when a
// commit fails (DB.Apply). TestFailedLogSyncFailsTheEngine fails if a
// Pebble upgrade changes it.
const fatalCommitPrefix = "pebble: fatal commit error"

// commitFailure is the panic value that failStopLogger raises for a failed
// commit.
type commitFailure struct{ err error }

// errCommitFailed wraps every error recovered from a failed commit.
var errCommitFailed = errors.New("pebble commit failed; the store must be reopened by a new process")

// failStopLogger is the Logger the engine gives Pebble: the wrapped
// logger's, except that a failed commit panics with commitFailure instead
// of stopping the process.
type failStopLogger struct{ pebble.Logger }

func (l failStopLogger) Fatalf(format string, args ...any) {
	switch {
	case strings.HasPrefix(format, fatalCommitPrefix):
		l.Logger.Errorf(format, args...)
		panic(commitFailure{fmt.Errorf("%w: %s", errCommitFailed, fmt.Sprintf(format, args...))})
	case fatalCreateFormats[format]:
		// Only while pebble.Open creates a new store, on the goroutine
		// that called Open: openPebble recovers it as Open's error.
		l.Logger.Errorf(format, args...)
		panic(fmt.Sprintf(format, args...))
	}
	l.Logger.Fatalf(format, args...)
}

// fatalCreateFormats are the formats of the fatal messages Pebble logs
// when it cannot write the first MANIFEST of a new store (only while
// pebble.Open creates it). The same failures later in a store's life are
// logged with the format "%s" and still stop the process.
var fatalCreateFormats = map[string]bool{
	"MANIFEST flush failed: %v":       true,
	"MANIFEST sync failed: %v":        true,
	"MANIFEST set current failed: %v": true,
}

// commitBatch commits b, returning a failed commit as an error instead of
// letting Pebble stop the process (see failStopLogger). Any other panic
// out of Pebble's commit is a failed commit too: once a write of its log
// has failed, Pebble remembers the error and panics with it on a later
// commit, one that may not even wait for a sync, and it does so holding
// its commit pipeline's mutex. Either way no commit may follow, which is
// the committer's rule after any error from here.
func commitBatch(b *pebble.Batch, o *pebble.WriteOptions) (err error) {
	defer func() {
		if r := recover(); r != nil {
			if f, ok := r.(commitFailure); ok {
				err = f.err
			} else {
				err = fmt.Errorf("%w: pebble panicked: %v", errCommitFailed, r)
			}
		}
	}()
	return b.Commit(o)
}
