package storetest

import (
	"sort"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/idemkv/idemkv"
	"github.com/stretchr/testify/require"
)

// TestLinearizabilityModelHasTeeth feeds the model hand-built histories:
// each illegal one must be reported Illegal, and its legal twin Ok, both
// through operations and through events (which exercises PartitionEvent).
func TestLinearizabilityModelHasTeeth(t *testing.T) {
	model := linModel(linPrinter{})
	other, cases := linTeethCases()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, c := range []struct {
				want porcupine.CheckResult
				ops  []porcupine.Operation
			}{{porcupine.Illegal, tc.illegal}, {porcupine.Ok, tc.twin}} {
				h := append(append([]porcupine.Operation(nil), other...), c.ops...)
				require.Equal(t, c.want, porcupine.CheckOperationsTimeout(model, h, 5*time.Second), "operations")
				require.Equal(t, c.want, porcupine.CheckEventsTimeout(model, linEvents(h), 5*time.Second), "events")
			}
		})
	}
}

// linTeethCase is an illegal history and its legal twin.
type linTeethCase struct {
	name          string
	illegal, twin []porcupine.Operation
}

// linTeethCases returns the histories: traffic on another key, which must
// not disturb the verdict on key "k", and the cases, on "k". Tokens are
// small integers, the store clock's offsets (At) are from 0.
func linTeethCases() (other []porcupine.Operation, cases []linTeethCase) {
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
	other = []porcupine.Operation{
		op(2, 0, 20, claim("j", L, false), acquired(100, 1, L, 0, 0)),
		op(3, 1, 2, claim("j", L, false), linOutput{Outcome: idemkv.InProgress, State: idemkv.StateInProgress, Token: 100}),
	}

	return other, []linTeethCase{{
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
		// The engine once did this: a claim that found the remote lease
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
	}}
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
