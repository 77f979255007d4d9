package idemkv

import (
	"context"
	"errors"
)

// ErrCannotWatch is returned by a Watcher that cannot watch a record now:
// its store was opened without notifications, or it has lost them for a
// while. The caller answers as if it could not wait.
var ErrCannotWatch = errors.New("idemkv: the store cannot watch records now")

// A Watcher is a Store shared by several processes that can tell one of
// them when an attempt held by another settles, so that a duplicate
// request waits for the first attempt's outcome instead of being answered
// at once that it is in progress. The layers above a store use it when the
// store has it (httpidem, Route.Wait); a store used by one process needs
// none, because its callers can wait for each other in memory.
type Watcher interface {
	// Watch returns a channel that is closed once the attempt holding id
	// under token (a Claim's Record.Token, when it answered InProgress)
	// has settled: completed, released or marked uncertain. It is closed
	// at once if the record is no longer held under token. A closed
	// channel means only that claiming again is worth it: the caller
	// claims again, and may find the record held by a new attempt.
	//
	// The caller must call stop once it stops waiting. A watch does not
	// end when the lease does: a caller waits no longer than the
	// InProgress claim's RetryAfter, and then claims again.
	Watch(ctx context.Context, id ID, token uint64) (settled <-chan struct{}, stop func(), err error)
}

// A LocalRunner is a Store that can run a local operation in one step:
// it runs apply first, collecting its writes, then claims req and, if it
// acquires the key, commits the outcome r (or the result apply set
// through ResultSetter) with those writes, in one commit. It answers as
// Claim would; a claim that does not acquire writes nothing of apply's.
// apply runs before the claim is known, even for a duplicate, so it must
// act only through Effects; one that reads (Effects.Get) makes the store
// run it as Claim and Complete instead. pgstore has it (one round trip
// and one commit where Claim and Complete take two of each); once.Do
// uses it for a Call with WritesOnly.
type LocalRunner interface {
	RunLocal(ctx context.Context, req ClaimRequest, r Result, apply func(Effects) error) (Claim, error)
}
