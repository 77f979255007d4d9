package engine

// A porcupine linearizability check of the engine: many goroutines claim,
// complete, release, mark uncertain and abandon leases on a handful of
// overlapping keys while a fake clock makes their leases run out, and
// several reconcilers settle, concurrently, whatever turns uncertain. Every
// call is recorded with its invocation and response instants, and the
// history must linearize against a sequential model of one idempotency
// record per key.
//
// The model (linStep) is a deterministic state machine per key:
//
//	absent                  -> held(T)       Claim acquired, with a token above every earlier one
//	held(T, mode, until)    -> held(T')      takeover: Claim acquired T' > T at engine time >= until,
//	                                         by any claim if the holder is local, only by a Resumable
//	                                         remote claim (same OperationID) if the holder is remote
//	held(T, remote, until)  -> uncertain(T)  Claim answered Reconciling at engine time >= until:
//	                                         a local or non-Resumable claim found the remote lease expired
//	held(T)                 -> completed(R)  Complete(T, R) ok
//	held(T)                 -> absent        Release(T) ok
//	held(T)                 -> uncertain(T)  MarkUncertain(T) ok
//	uncertain(T)            -> absent        Resolve(T, NoEffect) ok
//	uncertain(T)            -> completed(R)  Resolve(T, R) ok
//
// and every other answer is allowed only where it is the one the contract
// permits: InProgress only while held and with the holder's token, Replay
// only of exactly the completed result (and the winner's token), Reconciling
// only while uncertain, Mismatch only for another fingerprint, Acquired
// never on a completed or uncertain record; Complete, Release and
// MarkUncertain succeed if and only if the token is the holder's and are
// ErrFenced otherwise; Resolve is ErrNotFound on an absent record,
// ErrWrongState on a held or completed one, ErrFenced on an uncertain one
// with another token, and succeeds otherwise; Get returns the model's
// record.
//
// Time is not part of the linearization, but the model does not ignore it:
// an Acquired lease tells the engine's clock at the claim (Expires - Lease),
// a Reconciling record made by a claim tells it too (Expires - Retention),
// so a takeover or a turn to uncertain before the lease ran out is illegal.
//
// The model is strict: each call takes effect at one instant between its
// invocation and its response, and nothing else is tolerated. In particular
// a holder may be fenced only once the change that fences it (a takeover,
// the turn of its expired remote lease to uncertain, its own earlier
// Complete, Release or MarkUncertain) has taken effect, so a reader that
// sees the record still held under that token after the fence is a
// violation. What makes the engine pass: while a write to a key is in
// flight, Claims and Gets answer from the state before it (in progress),
// and holder operations and Resolve wait for the write to end and then
// decide on the state it left.
//
// Both modes take part. Remote claims are Resumable three times out of
// four, so remote leases are taken over (keeping their OperationID) and
// also turn uncertain. linReconcilers reconcilers run at once, each reading
// a key (Get) and resolving it if it is uncertain; they prefer the key one
// of them last found uncertain, so that two resolutions of one record race.
// The loser must be told what the state the winner left calls for:
// ErrNotFound if the winner resolved with no effect, ErrWrongState if it
// completed the record (or a claim has acquired it since), ErrFenced if the
// record has turned uncertain again under another token. Some resolutions
// deliberately use a token that is not the one just read (an earlier
// holder's, or a forged one), and a few target a record the reconciler did
// not find uncertain.
//
// Completed records are final, so each of the linSlots slots retires its
// key once a client sees it settled (Replay, or Mismatch) and the slot's
// traffic moves to a fresh key: at any moment all clients fight over
// linSlots keys, and the run keeps acquiring rather than replaying. A round
// uses about a hundred keys, far below the count at which the engine reaps
// expired slots (which would drop an abandoned local lease, a transition
// the model does not have).

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/idemkv/idemkv"
	"github.com/stretchr/testify/require"
)

const (
	linSlots        = 4  // keys in play at any moment, so that clients collide constantly
	linClients      = 16 // claimants
	linReconcilers  = 3  // reconcilers, which race to resolve the same records
	linOpsPerClient = 150
	linRounds       = 16
	linShortRounds  = 3
	// A client advances the fake clock by 5-15 s before one operation in
	// linAdvanceOneIn, so that 10 s and 30 s leases run out a few times per
	// round and stale holders come back after their lease was taken over.
	linAdvanceOneIn = 4
	linCheckTimeout = 15 * time.Second
)

var linLeases = [...]time.Duration{10 * time.Second, 30 * time.Second}

// Operations and answers, as the model sees them.

type linKind uint8

const (
	linClaim linKind = iota + 1
	linComplete
	linRelease
	linMarkUncertain
	linResolve
	linGet
)

// linErr classifies an error. linOther (anything the contract does not
// list for the call) is never legal.
type linErr uint8

const (
	linOK linErr = iota
	linFenced
	linNotFound
	linWrongState
	linOther
)

// linResult is an idemkv.Result in comparable form.
type linResult struct {
	Status  int
	Pointer string
	Body    string
}

func linResultOf(r idemkv.Result) linResult {
	return linResult{Status: r.Status, Pointer: r.Pointer, Body: string(r.Body)}
}

func (r linResult) result() idemkv.Result {
	return idemkv.Result{Status: r.Status, Pointer: r.Pointer, Body: []byte(r.Body)}
}

type linInput struct {
	Kind linKind
	Key  string
	// Claim.
	FP        string
	Mode      idemkv.Mode
	Resumable bool
	Lease     time.Duration
	// Complete, Release, MarkUncertain: the lease's token. Resolve: the
	// token the reconciler read.
	Token uint64
	// Complete, Resolve.
	Result   linResult
	NoEffect bool
}

type linOutput struct {
	Err     linErr
	ErrText string // for the visualization only
	// Claim.
	Outcome idemkv.Outcome
	// Acquired: the lease's token, attempt, mode and operation id.
	// Other claim outcomes and Get: the record's token, attempt and mode.
	Token   uint64
	Attempt uint32
	Mode    idemkv.Mode
	OpID    idemkv.OperationID
	// At is the engine's clock (as an offset from t0) when a claim decided,
	// known for Acquired and Reconciling only.
	At time.Duration
	// The record returned by a claim (other than Acquired) or Get.
	State  idemkv.State
	FP     string
	Result linResult
}

// The model.

type linPhase uint8

const (
	linAbsent linPhase = iota
	linHeld
	linCompleted
	linUncertain
)

// linState is one key's record. Fields that do not matter in a phase are
// zero, so that == is the right equality.
type linState struct {
	Phase    linPhase
	FP       string
	Token    uint64 // holder's (held) or the record's (completed, uncertain)
	Attempt  uint32 // held
	Mode     idemkv.Mode
	OpID     idemkv.OperationID
	LeaseEnd time.Duration // held: the engine time the lease runs out
	Result   linResult     // completed
	MaxToken uint64        // the highest token ever acquired on this key
}

func linStep(st linState, in linInput, out linOutput) (bool, linState) {
	switch in.Kind {
	case linClaim:
		return linStepClaim(st, in, out)
	case linComplete, linRelease, linMarkUncertain:
		if st.Phase != linHeld || st.Token != in.Token {
			return out.Err == linFenced, st
		}
		if out.Err != linOK {
			// The current holder is never refused, not even while a claim
			// that found its lease expired is turning the record uncertain:
			// until that change has taken effect, the holder still holds.
			return false, st
		}
		switch in.Kind {
		case linComplete:
			return true, linState{Phase: linCompleted, FP: st.FP, Token: st.Token, Result: in.Result, MaxToken: st.MaxToken}
		case linRelease:
			return true, linState{MaxToken: st.MaxToken}
		}
		return true, linState{Phase: linUncertain, FP: st.FP, Token: st.Token, MaxToken: st.MaxToken}
	case linResolve:
		// A Resolve that lost a race to another is judged like any other:
		// on the state the winner left.
		switch {
		case st.Phase == linAbsent:
			return out.Err == linNotFound, st
		case st.Phase != linUncertain:
			return out.Err == linWrongState, st
		case in.Token != st.Token:
			return out.Err == linFenced, st
		case out.Err != linOK:
			return false, st
		case in.NoEffect:
			return true, linState{MaxToken: st.MaxToken}
		}
		return true, linState{Phase: linCompleted, FP: st.FP, Token: st.Token, Result: in.Result, MaxToken: st.MaxToken}
	case linGet:
		if st.Phase == linAbsent {
			return out.Err == linNotFound, st
		}
		if out.Err != linOK || out.Token != st.Token || out.FP != st.FP {
			return false, st
		}
		switch st.Phase {
		case linHeld:
			return out.State == idemkv.StateInProgress && out.Attempt == st.Attempt &&
				out.Mode == st.Mode && out.OpID == st.OpID, st
		case linUncertain:
			return out.State == idemkv.StateUncertain, st
		}
		return out.State == idemkv.StateCompleted && out.Result == st.Result, st
	}
	return false, st
}

func linStepClaim(st linState, in linInput, out linOutput) (bool, linState) {
	if out.Err != linOK {
		return false, st
	}
	// A fresh acquisition: a new token above all earlier ones, the
	// requested mode, and an operation id exactly for remote claims.
	fresh := out.Token > st.MaxToken && out.Mode == in.Mode &&
		(in.Mode == idemkv.ModeRemote) != out.OpID.IsZero()
	next := linState{Phase: linHeld, FP: in.FP, Token: out.Token, Attempt: out.Attempt, Mode: out.Mode,
		OpID: out.OpID, LeaseEnd: out.At + in.Lease, MaxToken: out.Token}
	if st.Phase == linAbsent {
		return out.Outcome == idemkv.Acquired && out.Attempt == 1 && fresh, next
	}
	if in.FP != st.FP {
		return out.Outcome == idemkv.Mismatch && out.Token == st.Token && out.FP == st.FP, st
	}
	switch st.Phase {
	case linCompleted:
		return out.Outcome == idemkv.Replay && out.State == idemkv.StateCompleted &&
			out.Token == st.Token && out.FP == st.FP && out.Result == st.Result, st
	case linUncertain:
		return out.Outcome == idemkv.Reconciling && out.State == idemkv.StateUncertain &&
			out.Token == st.Token && out.FP == st.FP, st
	}
	// Held.
	resumes := in.Mode == idemkv.ModeRemote && in.Resumable
	expired := out.At >= st.LeaseEnd
	switch out.Outcome {
	case idemkv.InProgress:
		return out.State == idemkv.StateInProgress && out.Token == st.Token, st
	case idemkv.Acquired:
		if !expired || out.Attempt != st.Attempt+1 || out.Token <= st.MaxToken || out.Mode != in.Mode {
			return false, st
		}
		switch {
		case st.Mode == idemkv.ModeLocal:
			// The stale local attempt is fenced; the new one starts afresh.
			return fresh, next
		case resumes:
			// The downstream identity survives the takeover.
			return out.OpID == st.OpID, next
		}
		return false, st // a remote lease taken over by a claim that cannot resume it
	case idemkv.Reconciling:
		ok := st.Mode == idemkv.ModeRemote && !resumes && expired &&
			out.State == idemkv.StateUncertain && out.Token == st.Token && out.FP == st.FP
		return ok, linState{Phase: linUncertain, FP: st.FP, Token: st.Token, MaxToken: st.MaxToken}
	}
	return false, st
}

// linTok shortens a token to its sequence part, for reading.
func linTok(t uint64) string { return "#" + strconv.FormatUint(t&(1<<tokenSeqBits-1), 10) }

func linDescribeOp(in linInput, out linOutput) string {
	var b strings.Builder
	switch in.Kind {
	case linClaim:
		mode := in.Mode.String()
		if in.Resumable {
			mode += "+resumable"
		}
		fmt.Fprintf(&b, "claim(%s, %s, %s, lease %v)", in.Key, mode, in.FP, in.Lease)
	case linComplete:
		fmt.Fprintf(&b, "complete(%s, %s, %q)", in.Key, linTok(in.Token), in.Result.Body)
	case linRelease:
		fmt.Fprintf(&b, "release(%s, %s)", in.Key, linTok(in.Token))
	case linMarkUncertain:
		fmt.Fprintf(&b, "mark-uncertain(%s, %s)", in.Key, linTok(in.Token))
	case linResolve:
		if in.NoEffect {
			fmt.Fprintf(&b, "resolve(%s, %s, no effect)", in.Key, linTok(in.Token))
		} else {
			fmt.Fprintf(&b, "resolve(%s, %s, %q)", in.Key, linTok(in.Token), in.Result.Body)
		}
	case linGet:
		fmt.Fprintf(&b, "get(%s)", in.Key)
	}
	b.WriteString(" -> ")
	switch {
	case out.Err != linOK:
		b.WriteString(out.ErrText)
	case in.Kind == linClaim && out.Outcome == idemkv.Acquired:
		fmt.Fprintf(&b, "acquired %s attempt %d %s at %v", linTok(out.Token), out.Attempt, out.Mode, out.At)
		if !out.OpID.IsZero() {
			fmt.Fprintf(&b, " op %s", out.OpID.String()[:8])
		}
	case in.Kind == linClaim:
		fmt.Fprintf(&b, "%s (%s %s", out.Outcome, out.State, linTok(out.Token))
		switch out.Outcome {
		case idemkv.Replay:
			fmt.Fprintf(&b, " %q", out.Result.Body)
		case idemkv.Reconciling:
			fmt.Fprintf(&b, " at %v", out.At)
		}
		b.WriteString(")")
	case in.Kind == linGet:
		fmt.Fprintf(&b, "%s %s", out.State, linTok(out.Token))
		if out.State == idemkv.StateCompleted {
			fmt.Fprintf(&b, " %q", out.Result.Body)
		}
	default:
		b.WriteString("ok")
	}
	return b.String()
}

func linDescribeState(s linState) string {
	switch s.Phase {
	case linHeld:
		return fmt.Sprintf("held by %s (attempt %d, %s, until %v)", linTok(s.Token), s.Attempt, s.Mode, s.LeaseEnd)
	case linCompleted:
		return fmt.Sprintf("completed by %s: %q", linTok(s.Token), s.Result.Body)
	case linUncertain:
		return fmt.Sprintf("uncertain (%s)", linTok(s.Token))
	}
	return fmt.Sprintf("absent (last token %s)", linTok(s.MaxToken))
}

var linModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		for _, op := range history {
			k := op.Input.(linInput).Key
			byKey[k] = append(byKey[k], op)
		}
		return linPartitions(byKey)
	},
	PartitionEvent: func(history []porcupine.Event) [][]porcupine.Event {
		keyOf := map[int]string{}
		byKey := map[string][]porcupine.Event{}
		for _, ev := range history {
			if ev.Kind == porcupine.CallEvent {
				keyOf[ev.Id] = ev.Value.(linInput).Key
			}
			k := keyOf[ev.Id]
			byKey[k] = append(byKey[k], ev)
		}
		return linPartitions(byKey)
	},
	Init: func() any { return linState{} },
	Step: func(state, input, output any) (bool, any) {
		return linStep(state.(linState), input.(linInput), output.(linOutput))
	},
	DescribeOperation: func(input, output any) string {
		return linDescribeOp(input.(linInput), output.(linOutput))
	},
	DescribeState: func(state any) string { return linDescribeState(state.(linState)) },
}

func linPartitions[T any](byKey map[string][]T) [][]T {
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([][]T, 0, len(keys))
	for _, k := range keys {
		out = append(out, byKey[k])
	}
	return out
}

// The workload.

// linRun drives one engine and records its history.
type linRun struct {
	t         *testing.T
	v         *env
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
		r.t.Errorf("client %d: %s: unexpected error", client, linDescribeOp(in, out))
	}
	r.mu.Lock()
	r.ops = append(r.ops, porcupine.Operation{ClientId: client, Input: in, Call: start, Output: out, Return: end, Metadata: meta})
	r.mu.Unlock()
	return out
}

func (r *linRun) advance(client int, d time.Duration) {
	at := r.now.Add(1)
	r.v.clock.Advance(d)
	r.mu.Lock()
	r.advanced += d
	total := r.advanced
	r.annotations = append(r.annotations, porcupine.Annotation{Tag: "fake clock", Start: at,
		Description: fmt.Sprintf("+%v", d), Details: fmt.Sprintf("client %d advanced the clock to t0+%v", client, total)})
	r.mu.Unlock()
}

func (r *linRun) claim(client int, in linInput, plan string) (linOutput, idemkv.Lease) {
	var lease idemkv.Lease
	out := r.record(client, in, plan, func() linOutput {
		c, err := r.v.e.Claim(ctx, idemkv.ClaimRequest{ID: id(in.Key), Fingerprint: []byte(in.FP),
			Mode: in.Mode, Lease: in.Lease, Resumable: in.Resumable})
		if err != nil {
			return linErrOutput(err)
		}
		o := linOutput{Outcome: c.Outcome}
		if c.Outcome == idemkv.Acquired {
			lease = c.Lease
			o.Token, o.Attempt, o.Mode, o.OpID = c.Lease.Token, c.Lease.Attempt, c.Lease.Mode, c.Lease.OperationID
			o.At = c.Lease.Expires.Sub(t0) - in.Lease
			return o
		}
		rec := c.Record
		o.Token, o.Attempt, o.Mode, o.OpID = rec.Token, rec.Attempt, rec.Mode, rec.OperationID
		o.State, o.FP, o.Result = rec.State, string(rec.Fingerprint), linResultOf(rec.Result)
		if c.Outcome == idemkv.Reconciling {
			o.At = rec.Expires.Sub(t0) - r.retention
		}
		return o
	})
	return out, lease
}

// linEffectKey is where a Complete writes its effect: the winner's body.
func linEffectKey(key string) []byte { return []byte("winner/" + key) }

// finish ends a held lease: "complete", "release" or "mark-uncertain".
func (r *linRun) finish(client int, how string, l idemkv.Lease, meta any) {
	in := linInput{Key: l.ID.Key, Token: l.Token}
	var call func() error
	switch how {
	case "complete":
		in.Kind = linComplete
		in.Result = linResult{Status: 200 + client, Pointer: "/v1/payments/" + l.ID.Key,
			Body: fmt.Sprintf("client %d token %d", client, l.Token)}
		call = func() error {
			return r.v.e.Complete(ctx, l, in.Result.result(), func(w idemkv.Effects) error {
				return w.Set(linEffectKey(l.ID.Key), []byte(in.Result.Body))
			})
		}
	case "release":
		in.Kind = linRelease
		call = func() error { return r.v.e.Release(ctx, l) }
	case "mark-uncertain":
		in.Kind = linMarkUncertain
		call = func() error { return r.v.e.MarkUncertain(ctx, l, fmt.Sprintf("client %d lost track", client)) }
	default:
		panic(how)
	}
	r.record(client, in, meta, func() linOutput {
		err := call()
		if err != nil {
			return linErrOutput(err)
		}
		return linOutput{}
	})
}

func (r *linRun) get(client int, key string, meta any) linOutput {
	return r.record(client, linInput{Kind: linGet, Key: key}, meta, func() linOutput {
		rec, err := r.v.e.Get(ctx, id(key))
		if err != nil {
			return linErrOutput(err)
		}
		return linOutput{Token: rec.Token, Attempt: rec.Attempt, Mode: rec.Mode, OpID: rec.OperationID,
			State: rec.State, FP: string(rec.Fingerprint), Result: linResultOf(rec.Result)}
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
		var plan string
		switch p := rng.IntN(100); {
		case p < 35:
			plan = "complete"
		case p < 45:
			plan = "release"
		case p < 50:
			plan = "mark-uncertain"
		case p < 70:
			plan = "give up"
		default:
			plan = "stall"
		}
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
		r.record(c, in, meta, func() linOutput {
			err := r.v.e.Resolve(ctx, idemkv.ResolveRequest{ID: id(key), Token: in.Token,
				NoEffect: in.NoEffect, Result: in.Result.result()})
			if err != nil {
				return linErrOutput(err)
			}
			return linOutput{}
		})
		if hot != nil {
			r.hot.CompareAndSwap(hot, nil)
		}
	}
}

func linSeed(t *testing.T) uint64 {
	if s := os.Getenv("IDEMKV_LIN_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, "IDEMKV_LIN_SEED")
		return seed
	}
	return uint64(time.Now().UnixNano())
}

// TestLinearizability runs several rounds, each on a fresh engine in a
// temporary directory, and checks each round's history with porcupine. The
// seed fixes every client's choices (set IDEMKV_LIN_SEED to repeat them);
// the interleaving is up to the scheduler.
func TestLinearizability(t *testing.T) {
	seed := linSeed(t)
	rounds := linRounds
	if testing.Short() {
		rounds = linShortRounds
	}
	t.Logf("seed %d (IDEMKV_LIN_SEED=%d to reuse), %d rounds of %d clients x %d operations on %d keys",
		seed, seed, rounds, linClients, linOpsPerClient, linSlots)
	var total map[string]int
	for round := range rounds {
		t.Run(fmt.Sprintf("round%d", round), func(t *testing.T) {
			counts := linRound(t, seed, round)
			if total == nil {
				total = map[string]int{}
			}
			for k, n := range counts {
				total[k] += n
			}
		})
	}
	if t.Failed() {
		return
	}
	t.Logf("all rounds: %v", total)
	if testing.Short() {
		return
	}
	// The workload must actually have exercised what the check is about.
	// (Each of these happens several times in a typical round.)
	for _, what := range []string{"acquired", "takeover", "remote resume", "in-progress", "replay", "mismatch",
		"reconciling (expired remote)", "complete ok", "complete fenced", "release ok", "release fenced",
		"mark-uncertain ok", "resolve ok", "resolve not found", "resolve wrong state", "resolve fenced",
		"resolve race lost"} {
		require.Positive(t, total[what], "no %q in %d rounds: the workload is not exercising the engine", what, rounds)
	}
}

func linRound(t *testing.T, seed uint64, round int) map[string]int {
	began := time.Now()
	v := newEnv(t)
	r := &linRun{t: t, v: v, retention: v.e.opts.Retention}
	tick := make(chan struct{}, linReconcilers)
	var clients, recs sync.WaitGroup
	for c := range linClients + linReconcilers {
		rng := rand.New(rand.NewPCG(seed, uint64(round)<<32|uint64(c)))
		if c < linClients {
			clients.Go(func() { r.client(c, rng, tick) })
		} else {
			recs.Go(func() { r.reconciler(c, rng, tick) })
		}
	}
	clients.Wait()
	close(tick)
	recs.Wait()
	// A last look at every key, after all the dust has settled.
	keys := r.keys()
	final := make([]linOutput, len(keys))
	for i, key := range keys {
		final[i] = r.get(linClients, key, "final")
	}
	require.Less(t, r.advanced, r.retention, "the model assumes no completed record outlives its retention")
	ran := time.Since(began)

	checkStart := time.Now()
	res, info := porcupine.CheckOperationsVerbose(linModel, r.ops, linCheckTimeout)
	if res != porcupine.Ok {
		info.AddAnnotations(r.annotations)
		if f, err := os.CreateTemp("", fmt.Sprintf("idemkv-linearizability-seed%d-round%d-*.html", seed, round)); err != nil {
			t.Logf("cannot write the visualization: %v", err)
		} else {
			path := f.Name()
			_ = f.Close()
			if err := porcupine.VisualizePath(linModel, info, path); err != nil {
				t.Logf("cannot write the visualization: %v", err)
			} else {
				t.Logf("visualization of the history: %s", path)
			}
		}
	}
	if res == porcupine.Illegal {
		linLogIllegal(t, r.ops)
	}
	require.Equal(t, porcupine.Ok, res, "seed %d round %d: history of %d operations is not linearizable (or the check timed out)",
		seed, round, len(r.ops))

	// Effects commit with their outcome and only with it: the winner's
	// effect is there if and only if a Complete won the key.
	for i, key := range keys {
		f := final[i]
		data, err := v.e.GetData(linEffectKey(key))
		if f.Err == linOK && f.State == idemkv.StateCompleted && strings.HasPrefix(f.Result.Body, "client ") {
			require.NoError(t, err, "key %s completed by %q but its effect is missing", key, f.Result.Body)
			require.Equal(t, f.Result.Body, string(data), "key %s: the effect is not the winner's", key)
		} else {
			require.ErrorIs(t, err, idemkv.ErrNotFound, "key %s is %+v but has an effect %q", key, f, data)
		}
	}

	counts := linCount(r.ops)
	t.Logf("%d operations on %d keys in %v, checked in %v: %v", len(r.ops), len(keys), ran.Round(time.Millisecond),
		time.Since(checkStart).Round(time.Millisecond), counts)
	return counts
}

// linLogIllegal logs, as text, the history of every key whose history does
// not linearize, in invocation order.
func linLogIllegal(t *testing.T, ops []porcupine.Operation) {
	for _, part := range linModel.Partition(ops) {
		if porcupine.CheckOperationsTimeout(linModel, part, 5*time.Second) != porcupine.Illegal {
			continue
		}
		part = append([]porcupine.Operation(nil), part...)
		sort.Slice(part, func(i, j int) bool { return part[i].Call < part[j].Call })
		var b strings.Builder
		for _, op := range part {
			fmt.Fprintf(&b, "\n  [%6d,%6d] client %2d: %s", op.Call, op.Return, op.ClientId,
				linDescribeOp(op.Input.(linInput), op.Output.(linOutput)))
			if op.Metadata != nil {
				fmt.Fprintf(&b, " (%v)", op.Metadata)
			}
		}
		t.Logf("key %s does not linearize; its history:%s", part[0].Input.(linInput).Key, b.String())
	}
}

func linCount(ops []porcupine.Operation) map[string]int {
	// Operation ids are random, so one seen again on a takeover was resumed;
	// a Reconciling token that no MarkUncertain made uncertain was turned
	// uncertain by a claim that found its remote lease expired. A Resolve
	// invoked while another of the same key was in flight raced it ("resolve
	// race"); if one of the two succeeded and the other was refused
	// ("resolve race lost"), the refusal had to fit the state on whichever
	// side of the winner it linearized.
	sorted := append([]porcupine.Operation(nil), ops...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Call < sorted[j].Call })
	opIDs := map[idemkv.OperationID]bool{}
	marked := map[uint64]bool{}
	for _, op := range sorted {
		in, out := op.Input.(linInput), op.Output.(linOutput)
		if in.Kind == linMarkUncertain && out.Err == linOK {
			marked[in.Token] = true
		}
	}
	converted := map[uint64]bool{}
	resolves := map[string][]porcupine.Operation{} // per key, the Resolves so far
	counts := map[string]int{}
	for _, op := range sorted {
		in, out := op.Input.(linInput), op.Output.(linOutput)
		verdict := "ok"
		if out.Err != linOK {
			verdict = out.ErrText
		}
		switch in.Kind {
		case linClaim:
			counts[out.Outcome.String()]++
			switch {
			case out.Outcome == idemkv.Acquired:
				if out.Attempt > 1 {
					counts["takeover"]++
					if opIDs[out.OpID] {
						counts["remote resume"]++
					}
				}
				if !out.OpID.IsZero() {
					opIDs[out.OpID] = true
				}
			case out.Outcome == idemkv.Reconciling && !marked[out.Token] && !converted[out.Token]:
				converted[out.Token] = true
				counts["reconciling (expired remote)"]++
			}
		case linComplete:
			counts["complete "+verdict]++
		case linRelease:
			counts["release "+verdict]++
		case linMarkUncertain:
			counts["mark-uncertain "+verdict]++
		case linResolve:
			counts["resolve "+verdict]++
			raced, lost := false, false
			for _, prev := range resolves[in.Key] {
				if prev.Return > op.Call {
					raced = true
					won := prev.Output.(linOutput).Err == linOK
					lost = lost || won != (out.Err == linOK)
				}
			}
			if raced {
				counts["resolve race"]++
			}
			if lost {
				counts["resolve race lost"]++
			}
			resolves[in.Key] = append(resolves[in.Key], op)
		case linGet:
			counts["get"]++
		}
	}
	return counts
}

// TestLinearizabilityModelHasTeeth feeds the model hand-built histories:
// each illegal one must be reported Illegal, and its legal twin Ok, both
// through operations and through events (which exercises PartitionEvent).
func TestLinearizabilityModelHasTeeth(t *testing.T) {
	const lease = 30 * time.Second
	L, R := idemkv.ModeLocal, idemkv.ModeRemote
	claim := func(key string, mode idemkv.Mode, resumable bool) linInput {
		return linInput{Kind: linClaim, Key: key, FP: "fp/" + key, Mode: mode, Resumable: resumable, Lease: lease}
	}
	acquired := func(tok uint64, attempt uint32, mode idemkv.Mode, op byte, at time.Duration) linOutput {
		o := linOutput{Outcome: idemkv.Acquired, Token: tok, Attempt: attempt, Mode: mode, At: at}
		o.OpID[0] = op
		return o
	}
	res := func(s string) linResult { return linResult{Status: 200, Body: s} }
	complete := func(key string, tok uint64, body string) linInput {
		return linInput{Kind: linComplete, Key: key, Token: tok, Result: res(body)}
	}
	replay := func(tok uint64, key, body string) linOutput {
		return linOutput{Outcome: idemkv.Replay, State: idemkv.StateCompleted, Token: tok, FP: "fp/" + key, Result: res(body)}
	}
	fenced := linOutput{Err: linFenced, ErrText: "fenced"}
	notFound := linOutput{Err: linNotFound, ErrText: "not found"}
	wrongState := linOutput{Err: linWrongState, ErrText: "wrong state"}
	markUncertain := func(tok uint64) linInput { return linInput{Kind: linMarkUncertain, Key: "k", Token: tok} }
	resolveNoEffect := func(tok uint64) linInput {
		return linInput{Kind: linResolve, Key: "k", Token: tok, NoEffect: true}
	}
	resolveWith := func(tok uint64, body string) linInput {
		return linInput{Kind: linResolve, Key: "k", Token: tok, Result: res(body)}
	}
	reconciling := func(tok uint64, key string, at time.Duration) linOutput {
		return linOutput{Outcome: idemkv.Reconciling, State: idemkv.StateUncertain, Token: tok, FP: "fp/" + key, At: at}
	}
	get := linInput{Kind: linGet, Key: "k"}
	inProgress := func(tok uint64, mode idemkv.Mode, op byte) linOutput {
		o := linOutput{State: idemkv.StateInProgress, Token: tok, Attempt: 1, Mode: mode, FP: "fp/k"}
		o.OpID[0] = op
		return o
	}
	uncertain := func(tok uint64, op byte) linOutput {
		o := linOutput{State: idemkv.StateUncertain, Token: tok, Attempt: 1, Mode: R, FP: "fp/k"}
		o.OpID[0] = op
		return o
	}
	ok := linOutput{}
	op := func(client int, call, ret int64, in linInput, out linOutput) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret}
	}
	// Traffic on another key, which must not disturb the verdict on "k".
	other := []porcupine.Operation{
		op(2, 0, 20, claim("j", L, false), acquired(100, 1, L, 0, 0)),
		op(3, 1, 2, claim("j", L, false), linOutput{Outcome: idemkv.InProgress, State: idemkv.StateInProgress, Token: 100}),
	}

	for _, tc := range []struct {
		name          string
		illegal, twin []porcupine.Operation
	}{{
		name: "two holders both complete",
		illegal: []porcupine.Operation{
			op(0, 0, 1, claim("k", L, false), acquired(1, 1, L, 0, 0)),
			op(1, 2, 3, claim("k", L, false), acquired(2, 2, L, 0, 31*time.Second)),
			op(0, 4, 7, complete("k", 1, "client 0"), ok),
			op(1, 5, 6, complete("k", 2, "client 1"), ok),
		},
		twin: []porcupine.Operation{
			op(0, 0, 1, claim("k", L, false), acquired(1, 1, L, 0, 0)),
			op(1, 2, 3, claim("k", L, false), acquired(2, 2, L, 0, 31*time.Second)),
			op(0, 4, 7, complete("k", 1, "client 0"), fenced),
			op(1, 5, 6, complete("k", 2, "client 1"), ok),
		},
	}, {
		name: "replay of a result nobody completed",
		illegal: []porcupine.Operation{
			op(0, 0, 1, claim("k", L, false), acquired(1, 1, L, 0, 0)),
			op(0, 2, 3, complete("k", 1, "client 0"), ok),
			op(1, 4, 5, claim("k", L, false), replay(1, "k", "client 1")),
		},
		twin: []porcupine.Operation{
			op(0, 0, 1, claim("k", L, false), acquired(1, 1, L, 0, 0)),
			op(0, 2, 3, complete("k", 1, "client 0"), ok),
			op(1, 4, 5, claim("k", L, false), replay(1, "k", "client 0")),
		},
	}, {
		name: "a completed key acquired again",
		illegal: []porcupine.Operation{
			op(0, 0, 1, claim("k", R, true), acquired(1, 1, R, 7, 0)),
			op(0, 2, 3, complete("k", 1, "client 0"), ok),
			op(1, 4, 5, claim("k", R, true), acquired(2, 2, R, 7, time.Hour)),
		},
		twin: []porcupine.Operation{
			op(0, 0, 1, claim("k", R, true), acquired(1, 1, R, 7, 0)),
			op(0, 2, 3, complete("k", 1, "client 0"), ok),
			op(1, 4, 5, claim("k", R, true), replay(1, "k", "client 0")),
		},
	}, {
		name: "a live lease taken over",
		illegal: []porcupine.Operation{
			op(0, 0, 1, claim("k", L, false), acquired(1, 1, L, 0, 0)),
			op(1, 2, 3, claim("k", L, false), acquired(2, 2, L, 0, 29*time.Second)),
		},
		twin: []porcupine.Operation{
			op(0, 0, 1, claim("k", L, false), acquired(1, 1, L, 0, 0)),
			op(1, 2, 3, claim("k", L, false), acquired(2, 2, L, 0, 30*time.Second)),
		},
	}, {
		name: "two concurrent first claims both acquire",
		illegal: []porcupine.Operation{
			op(0, 0, 3, claim("k", L, false), acquired(1, 1, L, 0, 0)),
			op(1, 1, 2, claim("k", R, false), acquired(2, 1, R, 9, 0)),
		},
		twin: []porcupine.Operation{
			op(0, 0, 3, claim("k", L, false), acquired(1, 1, L, 0, 0)),
			op(1, 1, 2, claim("k", R, false), linOutput{Outcome: idemkv.InProgress, State: idemkv.StateInProgress, Token: 1}),
		},
	}, {
		name: "a resumed remote operation changes its OperationID",
		illegal: []porcupine.Operation{
			op(0, 0, 1, claim("k", R, true), acquired(1, 1, R, 7, 0)),
			op(1, 2, 3, claim("k", R, true), acquired(2, 2, R, 8, time.Minute)),
		},
		twin: []porcupine.Operation{
			op(0, 0, 1, claim("k", R, true), acquired(1, 1, R, 7, 0)),
			op(1, 2, 3, claim("k", R, true), acquired(2, 2, R, 7, time.Minute)),
		},
	}, {
		name: "an expired remote lease re-run blind by a local claim",
		illegal: []porcupine.Operation{
			op(0, 0, 1, claim("k", R, false), acquired(1, 1, R, 7, 0)),
			op(1, 2, 3, claim("k", L, false), acquired(2, 2, L, 0, time.Minute)),
		},
		twin: []porcupine.Operation{
			op(0, 0, 1, claim("k", R, false), acquired(1, 1, R, 7, 0)),
			op(1, 2, 3, claim("k", L, false), reconciling(1, "k", time.Minute)),
		},
	}, {
		name: "a local holder fenced while nobody took its lease",
		illegal: []porcupine.Operation{
			op(0, 0, 1, claim("k", L, false), acquired(1, 1, L, 0, 0)),
			op(0, 2, 3, complete("k", 1, "client 0"), fenced),
		},
		twin: []porcupine.Operation{
			op(0, 0, 1, claim("k", L, false), acquired(1, 1, L, 0, 0)),
			op(0, 2, 3, complete("k", 1, "client 0"), ok),
		},
	}, {
		name: "a remote holder fenced while nobody took its lease",
		illegal: []porcupine.Operation{
			op(0, 0, 1, claim("k", R, false), acquired(1, 1, R, 7, 0)),
			op(0, 2, 3, complete("k", 1, "client 0"), fenced),
		},
		twin: []porcupine.Operation{
			op(0, 0, 1, claim("k", R, false), acquired(1, 1, R, 7, 0)),
			op(1, 2, 6, claim("k", L, false), reconciling(1, "k", 31*time.Second)),
			op(0, 3, 4, complete("k", 1, "client 0"), fenced),
		},
	}, {
		// The engine used to do this: a claim that found the remote lease
		// expired was still writing the record uncertain when the holder
		// was told it was fenced, and readers after the fence still saw the
		// record in progress under the holder's token.
		name: "an early fence: the holder fenced before the turn to uncertain is visible",
		illegal: []porcupine.Operation{
			op(0, 0, 1, claim("k", R, false), acquired(1, 1, R, 7, 0)),
			op(1, 2, 9, claim("k", L, false), reconciling(1, "k", time.Minute)),
			op(0, 3, 4, complete("k", 1, "client 0"), fenced),
			op(2, 5, 6, get, inProgress(1, R, 7)),
		},
		twin: []porcupine.Operation{
			op(0, 0, 1, claim("k", R, false), acquired(1, 1, R, 7, 0)),
			op(1, 2, 9, claim("k", L, false), reconciling(1, "k", time.Minute)),
			op(0, 3, 4, complete("k", 1, "client 0"), fenced),
			op(2, 5, 6, get, uncertain(1, 7)),
		},
	}, {
		name: "an early fence: the holder fenced, every later read sees it hold the record, nothing changed",
		illegal: []porcupine.Operation{
			op(0, 0, 1, claim("k", R, false), acquired(1, 1, R, 7, 0)),
			op(0, 2, 3, complete("k", 1, "client 0"), fenced),
			op(2, 4, 5, get, inProgress(1, R, 7)),
			op(1, 6, 7, claim("k", L, false), linOutput{Outcome: idemkv.InProgress, State: idemkv.StateInProgress, Token: 1}),
			op(2, 8, 9, get, inProgress(1, R, 7)),
		},
		twin: []porcupine.Operation{
			op(0, 0, 1, claim("k", R, false), acquired(1, 1, R, 7, 0)),
			op(0, 2, 3, complete("k", 1, "client 0"), ok),
			op(2, 4, 5, get, linOutput{State: idemkv.StateCompleted, Token: 1, FP: "fp/k", Result: res("client 0")}),
			op(1, 6, 7, claim("k", L, false), replay(1, "k", "client 0")),
			op(2, 8, 9, get, linOutput{State: idemkv.StateCompleted, Token: 1, FP: "fp/k", Result: res("client 0")}),
		},
	}, {
		name: "a remote holder fenced, then its record taken over by a resumed claim",
		illegal: []porcupine.Operation{
			op(0, 0, 1, claim("k", R, false), acquired(1, 1, R, 7, 0)),
			op(0, 2, 3, complete("k", 1, "client 0"), fenced),
			op(1, 4, 5, claim("k", R, true), acquired(2, 2, R, 7, time.Minute)),
		},
		twin: []porcupine.Operation{
			op(0, 0, 1, claim("k", R, false), acquired(1, 1, R, 7, 0)),
			op(0, 2, 5, complete("k", 1, "client 0"), fenced),
			op(1, 3, 4, claim("k", R, true), acquired(2, 2, R, 7, time.Minute)),
		},
	}, {
		name: "two concurrent Resolves both succeed",
		illegal: []porcupine.Operation{
			op(0, 0, 1, claim("k", R, false), acquired(1, 1, R, 7, 0)),
			op(0, 2, 3, markUncertain(1), ok),
			op(1, 4, 7, resolveNoEffect(1), ok),
			op(2, 5, 6, resolveWith(1, "reconciler 2"), ok),
		},
		twin: []porcupine.Operation{
			op(0, 0, 1, claim("k", R, false), acquired(1, 1, R, 7, 0)),
			op(0, 2, 3, markUncertain(1), ok),
			op(1, 4, 7, resolveNoEffect(1), ok),
			op(2, 5, 6, resolveWith(1, "reconciler 2"), notFound),
		},
	}, {
		name: "two concurrent Resolves both succeed with results",
		illegal: []porcupine.Operation{
			op(0, 0, 1, claim("k", R, false), acquired(1, 1, R, 7, 0)),
			op(0, 2, 3, markUncertain(1), ok),
			op(1, 4, 7, resolveWith(1, "reconciler 1"), ok),
			op(2, 5, 6, resolveWith(1, "reconciler 2"), ok),
			op(3, 8, 9, get, linOutput{State: idemkv.StateCompleted, Token: 1, FP: "fp/k", Result: res("reconciler 1")}),
		},
		twin: []porcupine.Operation{
			op(0, 0, 1, claim("k", R, false), acquired(1, 1, R, 7, 0)),
			op(0, 2, 3, markUncertain(1), ok),
			op(1, 4, 7, resolveWith(1, "reconciler 1"), ok),
			op(2, 5, 6, resolveWith(1, "reconciler 2"), wrongState),
			op(3, 8, 9, get, linOutput{State: idemkv.StateCompleted, Token: 1, FP: "fp/k", Result: res("reconciler 1")}),
		},
	}, {
		name: "a Resolve that lost to a completing one told ErrNotFound",
		illegal: []porcupine.Operation{
			op(0, 0, 1, claim("k", R, false), acquired(1, 1, R, 7, 0)),
			op(0, 2, 3, markUncertain(1), ok),
			op(1, 4, 7, resolveWith(1, "reconciler 1"), ok),
			op(2, 5, 6, resolveNoEffect(1), notFound),
		},
		twin: []porcupine.Operation{
			op(0, 0, 1, claim("k", R, false), acquired(1, 1, R, 7, 0)),
			op(0, 2, 3, markUncertain(1), ok),
			op(1, 4, 7, resolveWith(1, "reconciler 1"), ok),
			op(2, 5, 6, resolveNoEffect(1), wrongState),
		},
	}, {
		name: "a Resolve that lost to a no-effect one told ErrWrongState",
		illegal: []porcupine.Operation{
			op(0, 0, 1, claim("k", R, false), acquired(1, 1, R, 7, 0)),
			op(0, 2, 3, markUncertain(1), ok),
			op(1, 4, 7, resolveNoEffect(1), ok),
			op(2, 5, 6, resolveWith(1, "reconciler 2"), wrongState),
		},
		twin: []porcupine.Operation{
			op(0, 0, 1, claim("k", R, false), acquired(1, 1, R, 7, 0)),
			op(0, 2, 3, markUncertain(1), ok),
			op(1, 4, 7, resolveNoEffect(1), ok),
			op(2, 5, 6, resolveWith(1, "reconciler 2"), notFound),
		},
	}, {
		name: "a stale Resolve after the record was resolved away told ErrFenced",
		illegal: []porcupine.Operation{
			op(0, 0, 1, claim("k", R, false), acquired(1, 1, R, 7, 0)),
			op(0, 2, 3, markUncertain(1), ok),
			op(1, 4, 5, resolveNoEffect(1), ok),
			op(2, 6, 7, resolveWith(9, "reconciler 2"), fenced),
		},
		twin: []porcupine.Operation{
			op(0, 0, 1, claim("k", R, false), acquired(1, 1, R, 7, 0)),
			op(0, 2, 3, markUncertain(1), ok),
			op(1, 4, 5, resolveNoEffect(1), ok),
			op(2, 6, 7, resolveWith(9, "reconciler 2"), notFound),
		},
	}, {
		name: "a Resolve with a token that is not the record's succeeds",
		illegal: []porcupine.Operation{
			op(0, 0, 1, claim("k", R, false), acquired(1, 1, R, 7, 0)),
			op(0, 2, 3, markUncertain(1), ok),
			op(1, 4, 5, resolveNoEffect(2), ok),
		},
		twin: []porcupine.Operation{
			op(0, 0, 1, claim("k", R, false), acquired(1, 1, R, 7, 0)),
			op(0, 2, 3, markUncertain(1), ok),
			op(1, 4, 5, resolveNoEffect(2), fenced),
		},
	}, {
		name: "a held record resolved",
		illegal: []porcupine.Operation{
			op(0, 0, 1, claim("k", L, false), acquired(1, 1, L, 0, 0)),
			op(1, 2, 3, resolveNoEffect(1), ok),
		},
		twin: []porcupine.Operation{
			op(0, 0, 1, claim("k", L, false), acquired(1, 1, L, 0, 0)),
			op(1, 2, 3, resolveNoEffect(1), wrongState),
		},
	}, {
		name: "a completion lost",
		illegal: []porcupine.Operation{
			op(0, 0, 1, claim("k", L, false), acquired(1, 1, L, 0, 0)),
			op(0, 2, 3, complete("k", 1, "client 0"), ok),
			op(1, 4, 5, linInput{Kind: linGet, Key: "k"}, linOutput{Err: linNotFound, ErrText: "not found"}),
		},
		twin: []porcupine.Operation{
			op(0, 0, 1, claim("k", L, false), acquired(1, 1, L, 0, 0)),
			op(0, 2, 3, complete("k", 1, "client 0"), ok),
			op(1, 4, 5, linInput{Kind: linGet, Key: "k"}, linOutput{State: idemkv.StateCompleted, Token: 1, FP: "fp/k", Result: res("client 0")}),
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			for _, c := range []struct {
				want porcupine.CheckResult
				ops  []porcupine.Operation
			}{{porcupine.Illegal, tc.illegal}, {porcupine.Ok, tc.twin}} {
				h := append(append([]porcupine.Operation(nil), other...), c.ops...)
				require.Equal(t, c.want, porcupine.CheckOperationsTimeout(linModel, h, 5*time.Second), "operations")
				require.Equal(t, c.want, porcupine.CheckEventsTimeout(linModel, linEvents(h), 5*time.Second), "events")
			}
		})
	}
}

// linEvents turns operations into the equivalent event history.
func linEvents(ops []porcupine.Operation) []porcupine.Event {
	type stamped struct {
		at int64
		ev porcupine.Event
	}
	var all []stamped
	for i, op := range ops {
		all = append(all,
			stamped{op.Call, porcupine.Event{ClientId: op.ClientId, Kind: porcupine.CallEvent, Value: op.Input, Id: i}},
			stamped{op.Return, porcupine.Event{ClientId: op.ClientId, Kind: porcupine.ReturnEvent, Value: op.Output, Id: i}})
	}
	sort.SliceStable(all, func(i, j int) bool {
		if all[i].at != all[j].at {
			return all[i].at < all[j].at
		}
		return all[i].ev.Kind == porcupine.CallEvent && all[j].ev.Kind == porcupine.ReturnEvent
	})
	evs := make([]porcupine.Event, len(all))
	for i, s := range all {
		evs[i] = s.ev
	}
	return evs
}
