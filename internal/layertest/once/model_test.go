package once_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/tier"
	"github.com/idemkv/idemkv/once"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// What a model function does once it has written.
const (
	behaveOK       = iota // returns a result
	behaveZero            // returns the zero result
	behaveNoEffect        // fails, marked NoEffect
	behaveFail            // fails
	behavePanic           // panics
	behaviours
)

var errModel = errors.New("model: the function failed")

// modelRec is the model's view of one key's record.
type modelRec struct {
	state  idemkv.State // 0: absent
	fp     string
	result idemkv.Result
	data   string // the value the function wrote with its result ("" if none)
}

// TestDoModel plays random sequences of Do calls (local or remote, on the
// engine or on a store without idemkv.ResultSetter, with one of two
// fingerprints, by functions that succeed, succeed with the
// zero result, fail with or without NoEffect, or panic), reconciler
// resolutions and restarts, against a model of what the store must show:
// each key's state, stored result and business writes, and a counter that
// every completed run increments, so that a run whose writes committed
// without its result, or twice, is seen.
//
// The runs share one store; each run's keys are new.
func TestDoModel(t *testing.T) {
	v := newEnv(t, nil)
	run := 0
	tier.LimitRapid()
	rapid.Check(t, func(rt *rapid.T) {
		if raceEnabled && rapid.IntRange(0, 2).Draw(rt, "skip") != 0 {
			return // the race detector makes a run several times slower
		}
		run++
		keys := make([]string, 4)
		for i := range keys {
			keys[i] = fmt.Sprintf("r%d-k%d", run, i)
		}
		total := fmt.Sprintf("r%d/total", run)
		model := map[string]*modelRec{}
		for _, k := range keys {
			model[k] = &modelRec{}
		}
		completions, step := 0, 0

		rt.Repeat(map[string]func(*rapid.T){
			"do": func(rt *rapid.T) {
				key := rapid.SampledFrom(keys).Draw(rt, "key")
				mode := rapid.SampledFrom([]idemkv.Mode{idemkv.ModeLocal, idemkv.ModeRemote}).Draw(rt, "mode")
				fp := rapid.SampledFrom([]string{"A", "B"}).Draw(rt, "fp")
				behave := rapid.IntRange(0, behaviours-1).Draw(rt, "behave")
				fallback := rapid.Bool().Draw(rt, "fallback") // a store without idemkv.ResultSetter
				step++
				res := idemkv.Result{Status: 200 + step%100, Pointer: "/p/" + strconv.Itoa(step), Body: []byte("s" + strconv.Itoa(step))}
				runs := 0
				fn := func(_ context.Context, x *once.Exec) (idemkv.Result, error) {
					runs++
					if err := x.Effects.Set([]byte("fx/"+key), res.Body); err != nil {
						return idemkv.Result{}, err
					}
					if err := x.Apply(func(fx idemkv.Effects) error { return addTo(fx, total, 1) }); err != nil {
						return idemkv.Result{}, err
					}
					switch behave {
					case behaveOK:
						return res, nil
					case behaveZero:
						return idemkv.Result{}, nil
					case behaveNoEffect:
						return idemkv.Result{}, once.NoEffect(errModel)
					case behaveFail:
						return idemkv.Result{}, errModel
					}
					panic("model panic")
				}
				c := once.Call{ID: id(key), Fingerprint: []byte(fp), Mode: mode}
				var (
					out      once.Outcome
					err      error
					panicked any
				)
				func() {
					defer func() { panicked = recover() }()
					out, err = once.Do(ctx, v.store(fallback), c, fn)
				}()

				m := model[key]
				if m.state != 0 {
					require.Nil(t, panicked)
					require.Zero(t, runs, "a key with a record runs nothing")
					switch {
					case m.fp != fp:
						require.ErrorIs(t, err, once.ErrMismatch)
					case m.state == idemkv.StateUncertain:
						require.ErrorIs(t, err, once.ErrReconciling)
					default:
						require.NoError(t, err)
						require.True(t, out.Replayed)
						requireResult(t, m.result, out.Result)
					}
					return
				}
				remote := mode == idemkv.ModeRemote
				if remote {
					require.Equal(t, 1, runs, "a remote function runs once")
				}
				uncertain := func() { *m = modelRec{state: idemkv.StateUncertain, fp: fp} }
				switch behave {
				case behaveOK, behaveZero:
					require.NoError(t, err)
					require.Nil(t, panicked)
					require.False(t, out.Replayed)
					want := res
					if behave == behaveZero {
						want = idemkv.Result{}
					}
					requireResult(t, want, out.Result)
					require.Equal(t, remote, !out.OperationID.IsZero())
					if !remote {
						// The zero result commits on the first run, and
						// so does any other where the commit takes it; the
						// fallback costs a first run to learn it.
						want := 1
						if fallback && behave != behaveZero {
							want = 2
						}
						require.Equal(t, want, runs)
					}
					*m = modelRec{state: idemkv.StateCompleted, fp: fp, result: want, data: string(res.Body)}
					completions++
				case behaveNoEffect:
					require.ErrorIs(t, err, once.ErrNoEffect)
					require.ErrorIs(t, err, errModel)
				case behaveFail:
					if remote {
						require.ErrorIs(t, err, once.ErrUncertain)
						require.ErrorIs(t, err, errModel)
						uncertain()
					} else {
						require.Equal(t, errModel, err)
					}
				case behavePanic:
					require.Equal(t, "model panic", panicked)
					if remote {
						uncertain()
					}
				}
			},
			"resolve": func(rt *rapid.T) {
				key := rapid.SampledFrom(keys).Draw(rt, "key")
				m := model[key]
				if m.state != idemkv.StateUncertain {
					rt.Skip("not uncertain")
				}
				rec, err := v.e.Get(ctx, id(key))
				require.NoError(t, err)
				if rapid.Bool().Draw(rt, "noEffect") {
					require.NoError(t, v.e.Resolve(ctx, idemkv.ResolveRequest{ID: id(key), Token: rec.Token, NoEffect: true}))
					*m = modelRec{}
					return
				}
				r := idemkv.Result{Status: 201, Pointer: "/resolved"}
				require.NoError(t, v.e.Resolve(ctx, idemkv.ResolveRequest{ID: id(key), Token: rec.Token, Result: r}))
				*m = modelRec{state: idemkv.StateCompleted, fp: m.fp, result: r}
			},
			"restart": func(rt *rapid.T) {
				if rapid.IntRange(0, 3).Draw(rt, "restart") != 0 {
					rt.Skip("restarts are slow: one in four") // a reopen is most of a run's cost
				}
				v.reopen()
			},
			"": func(rt *rapid.T) {
				for _, key := range keys {
					m := model[key]
					rec, err := v.e.Get(ctx, id(key))
					if m.state == 0 {
						require.ErrorIs(t, err, idemkv.ErrNotFound, key)
					} else {
						require.NoError(t, err, key)
						require.Equal(t, m.state, rec.State, key)
						require.Equal(t, m.fp, string(rec.Fingerprint), key)
						if m.state == idemkv.StateCompleted {
							requireResult(t, m.result, rec.Result)
						}
					}
					require.Equal(t, m.data, v.data("fx/"+key), key)
				}
				want := ""
				if completions > 0 {
					want = strconv.Itoa(completions)
				}
				require.Equal(t, want, v.data(total), "one increment per completed run")
			},
		})
	})
}

func requireResult(t *testing.T, want, got idemkv.Result) {
	t.Helper()
	require.Equal(t, want.Status, got.Status)
	require.Equal(t, want.Pointer, got.Pointer)
	require.Equal(t, string(want.Body), string(got.Body))
}
