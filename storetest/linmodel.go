package storetest

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/idemkv/idemkv"
)

// The sequential model Linearizable checks histories against: one
// idempotency record per key (see the comment on Linearizable for its
// transitions). This file holds the model and how it prints; the workload
// that records the histories is in linearizable.go.

// Operations and answers, as the model sees them.

type linKind uint8

const (
	linClaim linKind = iota + 1
	linComplete
	linRelease
	linMarkUncertain
	linResolve
	linGet
	linEscalate
)

func (k linKind) String() string {
	switch k {
	case linClaim:
		return "claim"
	case linComplete:
		return "complete"
	case linRelease:
		return "release"
	case linMarkUncertain:
		return "mark-uncertain"
	case linResolve:
		return "resolve"
	case linGet:
		return "get"
	case linEscalate:
		return "escalate"
	}
	return fmt.Sprintf("linKind(%d)", uint8(k))
}

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
	// Resolve, Escalate: it carried a Since. The model keeps no times,
	// so it lets the store refuse such a settling write as fenced (its
	// record's attempt renewed or marked it since); resolveSince checks
	// that the store refuses only then.
	Since bool
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
	// At is the store's clock (as an offset from the start of the run)
	// when a claim decided, known for Acquired and Reconciling only.
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
	LeaseEnd time.Duration // held: the store time the lease runs out
	Result   linResult     // completed
	MaxToken uint64        // the highest token ever acquired on this key
}

func linStep(st linState, in linInput, out linOutput) (bool, linState) {
	switch in.Kind {
	case linClaim:
		return linStepClaim(st, in, out)
	case linComplete, linRelease, linMarkUncertain:
		return linStepHolder(st, in, out)
	case linResolve:
		return linStepResolve(st, in, out)
	case linEscalate:
		return linStepEscalate(st, in, out)
	case linGet:
		return linStepGet(st, out)
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

// linStepHolder steps Complete, Release and MarkUncertain.
func linStepHolder(st linState, in linInput, out linOutput) (bool, linState) {
	if st.Phase != linHeld || st.Token != in.Token {
		return out.Err == linFenced, st
	}
	if out.Err != linOK {
		// The current holder is never refused, not even while a claim that
		// found its lease expired is turning the record uncertain: until
		// that change has taken effect, the holder still holds.
		return false, st
	}
	switch in.Kind {
	case linComplete:
		return true, linState{Phase: linCompleted, FP: st.FP, Token: st.Token, Result: in.Result, MaxToken: st.MaxToken}
	case linRelease:
		return true, linState{MaxToken: st.MaxToken}
	}
	return true, linState{Phase: linUncertain, FP: st.FP, Token: st.Token, MaxToken: st.MaxToken}
}

// linStepResolve steps a Resolve. One that lost a race to another is
// judged like any other: on the state the winner left. A remote record
// held past its lease is abandoned and may be resolved too; the history
// does not say when a resolution read the clock, so one that answers
// ErrWrongState on a held remote record is taken as having found its
// lease live.
func linStepResolve(st linState, in linInput, out linOutput) (bool, linState) {
	if decided, ok := linSettleRefused(st, in, out); decided {
		return ok, st
	}
	if in.NoEffect {
		return true, linState{MaxToken: st.MaxToken}
	}
	return true, linState{Phase: linCompleted, FP: st.FP, Token: st.Token, Result: in.Result, MaxToken: st.MaxToken}
}

// linStepEscalate steps an Escalate: what it may settle and how it fails
// are a Resolve's; an escalated record is uncertain to every claim and
// read, so the model keeps it uncertain.
func linStepEscalate(st linState, in linInput, out linOutput) (bool, linState) {
	if decided, ok := linSettleRefused(st, in, out); decided {
		return ok, st
	}
	return true, linState{Phase: linUncertain, FP: st.FP, Token: st.Token, MaxToken: st.MaxToken}
}

// linSettleRefused judges a Resolve or Escalate that may not settle st:
// decided says it was refused (or had to be), ok whether its answer was
// the one the refusal calls for. Not decided: it settled, and ok.
func linSettleRefused(st linState, in linInput, out linOutput) (decided, ok bool) {
	switch {
	case st.Phase == linAbsent:
		return true, out.Err == linNotFound
	case st.Phase == linHeld && st.Mode == idemkv.ModeRemote && out.Err == linWrongState:
		return true, true
	case st.Phase == linCompleted, st.Phase == linHeld && st.Mode != idemkv.ModeRemote:
		return true, out.Err == linWrongState
	case in.Token != st.Token:
		return true, out.Err == linFenced
	case in.Since && out.Err == linFenced:
		return true, true
	case out.Err != linOK:
		return true, false
	}
	return false, true
}

func linStepGet(st linState, out linOutput) (bool, linState) {
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

// linModel is the porcupine model of the store contract, partitioned by
// key, printing tokens with p.
func linModel(p linPrinter) porcupine.Model {
	return porcupine.Model{
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
			return p.op(input.(linInput), output.(linOutput))
		},
		DescribeState: func(state any) string { return p.state(state.(linState)) },
	}
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

// linPrinter prints operations and states for reading. The contract says
// only that tokens grow, and a store's may be large (the engine's carry
// the store's epoch in their high bits), so a token is printed relative to
// the run's first one: #1 is the lowest token any claim acquired, #2 the
// next integer above it, and so on. A token below the first (0 from an
// absent record, or a forged one) is printed in full, without the #.
type linPrinter struct {
	first uint64 // the lowest token acquired in the run; 0: print in full
}

// linPrinterFor returns the printer for a history.
func linPrinterFor(ops []porcupine.Operation) linPrinter {
	var p linPrinter
	for _, op := range ops {
		in, out := op.Input.(linInput), op.Output.(linOutput)
		if in.Kind == linClaim && out.Outcome == idemkv.Acquired && (p.first == 0 || out.Token < p.first) {
			p.first = out.Token
		}
	}
	return p
}

func (p linPrinter) tok(t uint64) string {
	if p.first == 0 || t < p.first {
		return strconv.FormatUint(t, 10)
	}
	return "#" + strconv.FormatUint(t-p.first+1, 10)
}

func (p linPrinter) op(in linInput, out linOutput) string {
	var b strings.Builder
	switch in.Kind {
	case linClaim:
		mode := in.Mode.String()
		if in.Resumable {
			mode += "+resumable"
		}
		fmt.Fprintf(&b, "claim(%s, %s, %s, lease %v)", in.Key, mode, in.FP, in.Lease)
	case linComplete:
		fmt.Fprintf(&b, "complete(%s, %s, %q)", in.Key, p.tok(in.Token), in.Result.Body)
	case linRelease:
		fmt.Fprintf(&b, "release(%s, %s)", in.Key, p.tok(in.Token))
	case linMarkUncertain:
		fmt.Fprintf(&b, "mark-uncertain(%s, %s)", in.Key, p.tok(in.Token))
	case linResolve:
		if in.NoEffect {
			fmt.Fprintf(&b, "resolve(%s, %s, no effect)", in.Key, p.tok(in.Token))
		} else {
			fmt.Fprintf(&b, "resolve(%s, %s, %q)", in.Key, p.tok(in.Token), in.Result.Body)
		}
	case linGet:
		fmt.Fprintf(&b, "get(%s)", in.Key)
	case linEscalate:
		fmt.Fprintf(&b, "escalate(%s, %s)", in.Key, p.tok(in.Token))
	}
	b.WriteString(" -> ")
	p.answer(&b, in, out)
	return b.String()
}

func (p linPrinter) answer(b *strings.Builder, in linInput, out linOutput) {
	switch {
	case out.Err != linOK:
		b.WriteString(out.ErrText)
	case in.Kind == linClaim && out.Outcome == idemkv.Acquired:
		fmt.Fprintf(b, "acquired %s attempt %d %s at %v", p.tok(out.Token), out.Attempt, out.Mode, out.At)
		if !out.OpID.IsZero() {
			fmt.Fprintf(b, " op %s", out.OpID.String()[:8])
		}
	case in.Kind == linClaim:
		fmt.Fprintf(b, "%s (%s %s", out.Outcome, out.State, p.tok(out.Token))
		switch out.Outcome {
		case idemkv.Replay:
			fmt.Fprintf(b, " %q", out.Result.Body)
		case idemkv.Reconciling:
			fmt.Fprintf(b, " at %v", out.At)
		}
		b.WriteString(")")
	case in.Kind == linGet:
		fmt.Fprintf(b, "%s %s", out.State, p.tok(out.Token))
		if out.State == idemkv.StateCompleted {
			fmt.Fprintf(b, " %q", out.Result.Body)
		}
	default:
		b.WriteString("ok")
	}
}

func (p linPrinter) state(s linState) string {
	switch s.Phase {
	case linHeld:
		return fmt.Sprintf("held by %s (attempt %d, %s, until %v)", p.tok(s.Token), s.Attempt, s.Mode, s.LeaseEnd)
	case linCompleted:
		return fmt.Sprintf("completed by %s: %q", p.tok(s.Token), s.Result.Body)
	case linUncertain:
		return fmt.Sprintf("uncertain (%s)", p.tok(s.Token))
	}
	return fmt.Sprintf("absent (last token %s)", p.tok(s.MaxToken))
}

// linLogIllegal logs, as text, the history of every key whose history does
// not linearize, in invocation order.
func linLogIllegal(t *testing.T, ops []porcupine.Operation) {
	p := linPrinterFor(ops)
	model := linModel(p)
	for _, part := range model.Partition(ops) {
		if porcupine.CheckOperationsTimeout(model, part, 5*time.Second) != porcupine.Illegal {
			continue
		}
		part = append([]porcupine.Operation(nil), part...)
		sort.Slice(part, func(i, j int) bool { return part[i].Call < part[j].Call })
		var b strings.Builder
		for _, op := range part {
			fmt.Fprintf(&b, "\n  [%6d,%6d] client %2d: %s", op.Call, op.Return, op.ClientId,
				p.op(op.Input.(linInput), op.Output.(linOutput)))
			if op.Metadata != nil {
				fmt.Fprintf(&b, " (%v)", op.Metadata)
			}
		}
		t.Logf("key %s does not linearize; its history:%s", part[0].Input.(linInput).Key, b.String())
	}
}
