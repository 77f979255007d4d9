package storetest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/idemkv/idemkv"
)

// The workload Linearizable records: clients that claim and finish leases,
// reconcilers that resolve what turns uncertain, and the clock they move.

// linRun drives one store and records its history.
type linRun struct {
	t         *testing.T
	h         Harness
	t0        time.Time // the clock at the start of the round
	retention time.Duration

	// now stamps invocations and responses: taken right before a call and
	// right after it returns, it orders them as real time does.
	now atomic.Int64

	// gens[s] is the generation of slot s's key in play. Once a key is
	// settled for good (completed, or taken by another fingerprint) the next
	// client to notice retires it, and the slot's clients move on to a new
	// key, so that the run keeps acquiring instead of replaying.
	gens [linSlots]atomic.Int32

	// hot is the key a reconciler last found uncertain, until its
	// resolution returns: the other reconcilers look at it first, so that
	// resolutions of one record race.
	hot atomic.Pointer[string]

	mu          sync.Mutex
	ops         []porcupine.Operation
	annotations []porcupine.Annotation
	advanced    time.Duration
}

func linID(key string) idemkv.ID {
	return idemkv.ID{Tenant: "acct_1", Endpoint: "POST /v1/payments", Key: key}
}

func linErrOutput(err error) linOutput {
	o := linOutput{Err: linOther, ErrText: err.Error()}
	switch {
	case errors.Is(err, idemkv.ErrFenced):
		o.Err, o.ErrText = linFenced, "fenced"
	case errors.Is(err, idemkv.ErrNotFound):
		o.Err, o.ErrText = linNotFound, "not found"
	case errors.Is(err, idemkv.ErrWrongState):
		o.Err, o.ErrText = linWrongState, "wrong state"
	}
	return o
}

func (r *linRun) record(client int, in linInput, meta any, call func() linOutput) linOutput {
	start := r.now.Add(1)
	out := call()
	end := r.now.Add(1)
	if out.Err == linOther {
		r.t.Errorf("client %d: %s: unexpected error", client, linPrinter{}.op(in, out))
	}
	r.mu.Lock()
	r.ops = append(r.ops, porcupine.Operation{ClientId: client, Input: in, Call: start, Output: out, Return: end, Metadata: meta})
	r.mu.Unlock()
	return out
}

func (r *linRun) advance(client int, d time.Duration) {
	at := r.now.Add(1)
	r.h.Advance(d)
	r.mu.Lock()
	r.advanced += d
	total := r.advanced
	r.annotations = append(r.annotations, porcupine.Annotation{Tag: "clock", Start: at,
		Description: fmt.Sprintf("+%v", d), Details: fmt.Sprintf("client %d advanced the clock to t0+%v", client, total)})
	r.mu.Unlock()
}

func (r *linRun) claim(client int, in linInput, plan string) (linOutput, idemkv.Lease) {
	var lease idemkv.Lease
	var before, after time.Duration // the clock around the call
	out := r.record(client, in, plan, func() linOutput {
		before = r.h.Now().Sub(r.t0)
		c, err := r.h.Store().Claim(ctx, idemkv.ClaimRequest{ID: linID(in.Key), Fingerprint: []byte(in.FP),
			Mode: in.Mode, Lease: in.Lease, Resumable: in.Resumable})
		after = r.h.Now().Sub(r.t0)
		if err != nil {
			return linErrOutput(err)
		}
		o := linOutput{Outcome: c.Outcome}
		if c.Outcome == idemkv.Acquired {
			lease = c.Lease
			o.Token, o.Attempt, o.Mode, o.OpID = c.Lease.Token, c.Lease.Attempt, c.Lease.Mode, c.Lease.OperationID
			o.At = c.Lease.Expires.Sub(r.t0) - in.Lease
			return o
		}
		rec := c.Record
		o.Token, o.Attempt, o.Mode, o.OpID = rec.Token, rec.Attempt, rec.Mode, rec.OperationID
		o.State, o.FP, o.Result = rec.State, string(rec.Fingerprint), linResultOf(rec.Result)
		if c.Outcome == idemkv.Reconciling {
			o.At = rec.Expires.Sub(r.t0) - r.retention
		}
		return o
	})
	switch {
	case out.Err != linOK:
	case out.Outcome == idemkv.Acquired && (out.At < before || out.At > after):
		r.t.Errorf("client %d: %s: Lease.Expires less the lease says the claim decided at %v, but the clock read %v and %v around it",
			client, linPrinter{}.op(in, out), out.At, before, after)
	case out.Outcome == idemkv.Reconciling && out.At > after:
		r.t.Errorf("client %d: %s: Record.Expires less Config.Retention says the record turned uncertain at %v, after the claim returned at %v",
			client, linPrinter{}.op(in, out), out.At, after)
	}
	return out, lease
}

// linEffectKey is where a Complete writes its effect: the winner's body.
func linEffectKey(key string) []byte { return []byte("winner/" + key) }

// finish ends a held lease: "complete", "release" or "mark-uncertain".
func (r *linRun) finish(client int, how string, l idemkv.Lease, meta any) {
	s := r.h.Store()
	in := linInput{Key: l.ID.Key, Token: l.Token}
	var call func() error
	switch how {
	case "complete":
		in.Kind = linComplete
		in.Result = linResult{Status: 200 + client, Pointer: "/v1/payments/" + l.ID.Key,
			Body: fmt.Sprintf("client %d token %d", client, l.Token)}
		call = func() error {
			return s.Complete(ctx, l, in.Result.result(), func(w idemkv.Effects) error {
				return w.Set(linEffectKey(l.ID.Key), []byte(in.Result.Body))
			})
		}
	case "release":
		in.Kind = linRelease
		call = func() error { return s.Release(ctx, l, nil) }
	case "mark-uncertain":
		in.Kind = linMarkUncertain
		call = func() error { return s.MarkUncertain(ctx, l, fmt.Sprintf("client %d lost track", client)) }
	default:
		panic(how)
	}
	r.record(client, in, meta, func() linOutput {
		if err := call(); err != nil {
			return linErrOutput(err)
		}
		return linOutput{}
	})
}

func (r *linRun) get(client int, key string, meta any) linOutput {
	return r.record(client, linInput{Kind: linGet, Key: key}, meta, func() linOutput {
		rec, err := r.h.Store().Get(ctx, linID(key))
		if err != nil {
			return linErrOutput(err)
		}
		return linOutput{Token: rec.Token, Attempt: rec.Attempt, Mode: rec.Mode, OpID: rec.OperationID,
			State: rec.State, FP: string(rec.Fingerprint), Result: linResultOf(rec.Result)}
	})
}

func (r *linRun) resolve(client int, in linInput, meta any) {
	r.record(client, in, meta, func() linOutput {
		err := r.h.Store().Resolve(ctx, idemkv.ResolveRequest{ID: linID(in.Key), Token: in.Token,
			NoEffect: in.NoEffect, Result: in.Result.result()})
		if err != nil {
			return linErrOutput(err)
		}
		return linOutput{}
	})
}

func linKey(slot int, gen int32) string { return fmt.Sprintf("k%d.%d", slot, gen) }

// pick returns a random slot's key in play.
func (r *linRun) pick(rng *rand.Rand) (slot int, gen int32) {
	slot = rng.IntN(linSlots)
	return slot, r.gens[slot].Load()
}

func (r *linRun) retire(slot int, gen int32) { r.gens[slot].CompareAndSwap(gen, gen+1) }

// keys lists every key used so far.
func (r *linRun) keys() []string {
	var keys []string
	for s := range linSlots {
		for g := range r.gens[s].Load() + 1 {
			keys = append(keys, linKey(s, g))
		}
	}
	return keys
}

// client claims random keys and does what it planned with what it got:
// complete at once, release, mark uncertain, give up (drop the lease and
// let it expire), or stall (keep the lease and finish it later, perhaps
// long after it was taken over). tick paces the reconcilers.
func (r *linRun) client(c int, rng *rand.Rand, tick chan<- struct{}) {
	var stalled []idemkv.Lease
	for range linOpsPerClient {
		select {
		case tick <- struct{}{}:
		default:
		}
		if rng.IntN(linAdvanceOneIn) == 0 {
			r.advance(c, time.Duration(5+rng.IntN(11))*time.Second)
		}
		if len(stalled) > 0 && rng.IntN(3) == 0 {
			j := rng.IntN(len(stalled))
			l := stalled[j]
			stalled = append(stalled[:j], stalled[j+1:]...)
			how := [...]string{"complete", "complete", "complete", "release", "mark-uncertain"}[rng.IntN(5)]
			r.finish(c, how, l, "late")
			continue
		}
		slot, gen := r.pick(rng)
		in := linInput{Kind: linClaim, Key: linKey(slot, gen), Lease: linLeases[rng.IntN(len(linLeases))]}
		in.FP = "fp/" + in.Key
		if rng.IntN(25) == 0 {
			in.FP = "fp/other" // a reused key with another body
		}
		if rng.IntN(2) == 0 {
			in.Mode, in.Resumable = idemkv.ModeRemote, rng.IntN(4) != 0
		}
		plan := linPlan(rng)
		out, l := r.claim(c, in, "then "+plan)
		if out.Outcome == idemkv.Replay || out.Outcome == idemkv.Mismatch {
			r.retire(slot, gen)
		}
		if out.Outcome != idemkv.Acquired {
			continue
		}
		switch plan {
		case "give up":
		case "stall":
			stalled = append(stalled, l)
		default:
			r.finish(c, plan, l, nil)
		}
	}
	// Whatever is still stalled completes at the very end.
	for _, l := range stalled {
		r.finish(c, "complete", l, "late")
	}
}

// linPlan draws what a client will do with a lease if it acquires one.
func linPlan(rng *rand.Rand) string {
	switch p := rng.IntN(100); {
	case p < 35:
		return "complete"
	case p < 45:
		return "release"
	case p < 50:
		return "mark-uncertain"
	case p < 70:
		return "give up"
	}
	return "stall"
}

// reconciler reads a key on each tick, often the one another reconciler
// has just found uncertain, and settles it if it is uncertain: with no
// effect or with a result, and now and then with a token other than the one
// it read (one it read on the key earlier, or a forged one). Once in a while
// it resolves a record it did not find uncertain, too.
func (r *linRun) reconciler(c int, rng *rand.Rand, tick <-chan struct{}) {
	seen := map[string][]uint64{} // the tokens read on each key, oldest first
	for range tick {
		key := linKey(r.pick(rng))
		if hot := r.hot.Load(); hot != nil && rng.IntN(3) != 0 {
			key = *hot
		}
		got := r.get(c, key, nil)
		if toks := seen[key]; got.Err == linOK && (len(toks) == 0 || toks[len(toks)-1] != got.Token) {
			seen[key] = append(toks, got.Token)
		}
		var hot *string
		switch {
		case got.Err == linOK && got.State == idemkv.StateUncertain:
			hot = &key
			r.hot.Store(hot)
		case rng.IntN(10) != 0:
			continue
		}
		in := linInput{Kind: linResolve, Key: key, Token: got.Token}
		var meta any
		switch p := rng.IntN(10); {
		case p == 0:
			in.Token, meta = got.Token+1, "forged token"
		case p == 1:
			var stale []uint64
			for _, tok := range seen[key] {
				if tok != got.Token {
					stale = append(stale, tok)
				}
			}
			if len(stale) > 0 {
				in.Token, meta = stale[rng.IntN(len(stale))], "stale token"
			}
		}
		if rng.IntN(2) == 0 {
			in.NoEffect = true
		} else {
			in.Result = linResult{Status: 201, Pointer: "/v1/payments/" + key,
				Body: fmt.Sprintf("reconciler %d token %d", c, in.Token)}
		}
		r.resolve(c, in, meta)
		if hot != nil {
			r.hot.CompareAndSwap(hot, nil)
		}
	}
}

// checkEffects checks, against the last Get of every key, that effects
// commit with their outcome and only with it: the winner's effect is there
// if and only if a Complete won the key.
func (r *linRun) checkEffects(keys []string, final []linOutput) {
	for i, key := range keys {
		f := final[i]
		data, err := r.h.ReadEffect(linEffectKey(key))
		if f.Err == linOK && f.State == idemkv.StateCompleted && strings.HasPrefix(f.Result.Body, "client ") {
			if err != nil || string(data) != f.Result.Body {
				r.t.Fatalf("key %s completed by %q, but its effect reads %q, %v", key, f.Result.Body, data, err)
			}
		} else if !errors.Is(err, idemkv.ErrNotFound) {
			r.t.Fatalf("key %s is %+v but its effect reads %q, %v; want ErrNotFound", key, f, data, err)
		}
	}
}
