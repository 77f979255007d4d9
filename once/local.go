package once

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/idemkv/idemkv"
)

// The local result.
//
// A local Func both reads and writes through the commit's Effects and
// computes its result, often from what it read ("the balance is now 40").
// Its reads are checked only if it runs inside the commit, as
// Store.Complete's apply; but Complete takes the result before apply runs,
// so the result stored must come from inside the run that commits.
//
// Do calls Complete with the zero Result and runs the Func as its apply.
// A run whose result is the one given to Complete commits as it is. A run
// whose result differs hands it to the store through the commit's Effects
// when they implement idemkv.ResultSetter (the engine's do): the result
// then commits with exactly that run's writes, its reads checked. If the
// store finds a conflict it runs the Func again within the same Complete,
// and that run sets its own result. So the Func runs once per commit
// attempt, and the record holds the result of the run that committed.
//
// A store whose Effects do not implement ResultSetter cannot take the
// result from inside the commit. For it Do falls back to offering a
// result and letting the run check it: a run whose result differs from
// the offer returns errResultChanged, which makes Complete write
// nothing, and Do calls Complete again offering the new result. A commit
// happens only when a run's result equals the result offered, so the
// record again holds the committing run's result; but any result other
// than the zero one costs one more run, the first, whose writes are
// discarded, and runs repeat while the data read keeps changing, up to
// maxResultRounds commits.

// maxResultRounds bounds, on a store without idemkv.ResultSetter, the
// calls of Complete whose run computed a result other than the one
// offered. Under contention every conflict the store finds ends a round
// (the re-run's result differs), and a round's window for conflicts runs
// from the previous round's reads to this one's commit, about twice a
// single commit's. Measured with 8 writers incrementing one counter on
// the engine (its ResultSetter hidden), 16 rounds failed about 3% of
// operations with ErrConflict, as the engine alone does with a zero
// result (16 runs); 32 failed none. A result that never settles (a clock
// reading) costs that many runs, and then ErrConflict.
const maxResultRounds = 32

var (
	// errResultChanged: the run's result is not the one offered to
	// Complete, and the store cannot take another, so its writes must
	// not commit with it.
	errResultChanged = errors.New("once: the result differs from the one offered")
	// errPanicked: the run panicked; the panic is raised again by Do,
	// outside the store.
	errPanicked = errors.New("once: the function panicked")
	// errFuncFailed: a writes-only function run before its claim failed or
	// panicked; Do claims first instead (runOneStep).
	errFuncFailed = errors.New("once: the function failed before its claim")
)

// localRun is what one run of a local Func did.
type localRun struct {
	result   idemkv.Result // its result; its body copied if it is not the offer's
	err      error         // its error
	panicked bool
	value    any // what it panicked with
}

// runLocal runs a local Func inside the commit of its result (see above)
// and settles the key.
func (x *Exec) runLocal(ctx context.Context, fn Func) (Outcome, error) {
	bg := context.WithoutCancel(ctx) // a cancelled ctx must not leave the key held
	settled := false
	defer func() {
		x.ended = true
		if !settled { // the Func called runtime.Goexit (t.FailNow, say)
			_ = x.release(bg, slog.String("note", "the function exited its goroutine (runtime.Goexit)"))
		}
	}()
	var offer idemkv.Result
	for round := 1; ; round++ {
		var last localRun
		err := x.store.Complete(ctx, x.Lease, offer, func(fx idemkv.Effects) error {
			last = x.runInCommit(ctx, fx, offer, fn)
			switch {
			case last.panicked:
				return errPanicked
			case last.err != nil:
				return last.err
			case sameResult(&last.result, &offer):
				return nil
			}
			if rs, ok := fx.(idemkv.ResultSetter); ok {
				return rs.SetResult(last.result) // ErrInvalidResult if the store would refuse it
			}
			return errResultChanged
		})
		x.Effects = nil
		settled = true
		switch {
		case err == nil:
			// The last run is the one that committed: its result is the
			// offer's or the one it set.
			x.log.log(bg, slog.LevelInfo, msgStored, token(x.Lease),
				slog.Int("status", last.result.Status), slog.Int("runs", x.Run))
			return Outcome{Result: last.result}, nil
		case last.panicked:
			_ = x.release(bg, slog.String("note", "the function panicked"))
			panic(last.value)
		case last.err != nil && errors.Is(err, last.err):
			// Complete returns apply's error as it is: fn's, nothing
			// written, the lease still held. (Another error is the
			// store's: a run of fn whose read failed to serialize and
			// whose runs ran out, ErrConflict, say.)
			return Outcome{}, x.giveUp(bg, last.err)
		case errors.Is(err, errResultChanged) && round < maxResultRounds:
			settled = false
			offer = last.result
		case errors.Is(err, errResultChanged):
			err = fmt.Errorf("once: %s: %w: its result changed in %d commits in a row",
				name(x.Lease.ID), idemkv.ErrConflict, round)
			x.logCommitFailed(bg, err)
			return Outcome{}, x.giveUp(bg, err)
		default:
			// The store's failure: it refused the result (SetResult's
			// error, or the offer's), ErrConflict, ErrFenced, ctx's end.
			// Nothing was written, unless the error is ErrFailed (or an
			// I/O error): then the store refuses all work until it is
			// reopened, and holds, reopened, the result and its writes
			// or neither.
			err = fmt.Errorf("once: %s: committing the result: %w", name(x.Lease.ID), err)
			x.logCommitFailed(bg, err)
			return Outcome{}, x.giveUp(bg, err)
		}
	}
}

// logCommitFailed logs a local commit that the store refused: Error, or
// Warn for a conflict (the data read kept changing: contention, not a
// failure). A lost lease is logged by the release that follows.
func (x *Exec) logCommitFailed(ctx context.Context, err error) {
	level := slog.LevelError
	switch {
	case errors.Is(err, idemkv.ErrFenced):
		return
	case errors.Is(err, idemkv.ErrConflict):
		level = slog.LevelWarn
	}
	x.log.log(ctx, level, msgStoreFailed, token(x.Lease), errAttr(err))
}

// runInCommit is one run of fn inside Complete, on the commit's Effects.
// It stops a panic there, so that it never unwinds through the store.
func (x *Exec) runInCommit(ctx context.Context, fx idemkv.Effects, offer idemkv.Result, fn Func) (r localRun) {
	x.Run++
	x.Effects = fx
	defer func() {
		if v := recover(); v != nil {
			r = localRun{panicked: true, value: v}
		}
	}()
	res, err := fn(ctx, x)
	if err != nil {
		return localRun{err: err}
	}
	if !sameResult(&res, &offer) {
		res.Body = bytes.Clone(res.Body) // fn may reuse its buffer in the next run
	}
	return localRun{result: res}
}

func sameResult(a, b *idemkv.Result) bool {
	return a.Status == b.Status && a.Pointer == b.Pointer && bytes.Equal(a.Body, b.Body)
}

// runOneStep runs a local Func that only writes (Call.WritesOnly) through
// the store's RunLocal: fn runs first, with no lease, on Effects that
// collect its writes and take its result (idemkv.ResultSetter); then the
// key is claimed and, if acquired, the result and the writes commit with
// the claim. It returns the claim, and the outcome if it acquired. If fn
// fails or panics, nothing is claimed (or, for a function that read,
// which the store ran as a claim and a commit, the store gave the key
// up), and it returns errFuncFailed: Do then claims first and runs fn
// again under the claim, where its error or panic is Do's, and a
// completed key replays, or a reused one is a mismatch, whatever fn did.
func runOneStep(ctx context.Context, lr idemkv.LocalRunner, req idemkv.ClaimRequest, fn Func, log *callLog) (Outcome, idemkv.Claim, error) {
	x := &Exec{log: log}
	var last localRun
	cl, err := lr.RunLocal(ctx, req, idemkv.Result{}, func(fx idemkv.Effects) error {
		last = x.runInCommit(ctx, fx, idemkv.Result{}, fn)
		switch {
		case last.panicked:
			return errPanicked
		case last.err != nil:
			return last.err
		}
		rs, ok := fx.(idemkv.ResultSetter)
		if !ok {
			return fmt.Errorf("%w: once: the store's RunLocal takes no result (idemkv.ResultSetter)", idemkv.ErrInvalidArgument)
		}
		return rs.SetResult(last.result)
	})
	x.Effects, x.ended = nil, true
	switch {
	case last.panicked, last.err != nil && errors.Is(err, last.err):
		return Outcome{}, idemkv.Claim{}, errFuncFailed
	case err != nil:
		err = fmt.Errorf("once: %s: %w", name(req.ID), err)
		log.log(ctx, slog.LevelError, msgClaimFailed, errAttr(err))
		return Outcome{}, idemkv.Claim{}, err
	case cl.Outcome == idemkv.Acquired:
		log.log(ctx, slog.LevelInfo, msgStored, token(cl.Lease), slog.Int("status", last.result.Status), slog.Int("runs", x.Run))
		return Outcome{Result: last.result}, cl, nil
	}
	return Outcome{}, cl, nil
}
