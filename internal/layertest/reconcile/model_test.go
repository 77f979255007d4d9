package reconcile_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/internal/tier"
	"github.com/idemkv/idemkv/reconcile"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// modelOp is the model's view of one operation.
type modelOp struct {
	lease idemkv.Lease
	truth reconcile.Verdict // what the downstream says about it
	// held: its holder is alive (may complete late); settled: how it
	// ended, once it has ("holder", "applied", "not applied", "escalated").
	held    bool
	settled string
}

// TestReconcileModel drives operations that end uncertain, abandoned or
// completed by their holder, passes of one or two workers at once, clock
// advances and restarts (a reopen, and fresh workers that have forgotten
// their attempts), and checks after every step that no record was settled
// against what the downstream says; at the end, with time, every record
// is settled by the downstream's answer or escalated.
//
// The runs share one store (opening one per run is most of a run's
// cost); each run's keys are new, and each run ends with every record
// settled or escalated.
func TestReconcileModel(t *testing.T) {
	v := &env{t: t, dir: t.TempDir(), clock: fakeclock.New(t0)}
	v.open()
	defer func() { _ = v.e.Close() }()
	n := 0
	tier.LimitRapid()
	rapid.Check(t, func(rt *rapid.T) {
		if raceEnabled && rapid.IntRange(0, 2).Draw(rt, "skip") != 0 {
			return // the race detector makes a run several times slower
		}
		d := newDownstream()
		ops := map[string]*modelOp{}
		o := reconcile.Options{Grace: time.Second, MinBackoff: time.Second, MaxBackoff: 4 * time.Second,
			MaxAttempts: 3, MaxAge: 24 * time.Hour}
		workers := func() [2]*reconcile.Worker {
			return [2]*reconcile.Worker{v.worker(d, o), v.worker(d, o)}
		}
		ws := workers()
		rt.Repeat(map[string]func(*rapid.T){
			"op": func(rt *rapid.T) {
				key := fmt.Sprintf("k%d", n)
				n++
				op := &modelOp{lease: v.remote(key), held: true}
				op.truth = reconcile.Verdict(rapid.IntRange(0, 2).Draw(rt, "truth"))
				d.set(key, op.truth)
				ops[key] = op
				switch rapid.IntRange(0, 2).Draw(rt, "end") {
				case 0:
					require.NoError(t, v.e.MarkUncertain(ctx, op.lease, "timeout"))
					op.held = false
				case 1: // the holder crashes, or stalls
					op.held = rapid.Bool().Draw(rt, "stalls")
				}
			},
			"late": func(rt *rapid.T) {
				for key, op := range ops {
					if !op.held {
						continue
					}
					op.held = false
					if v.e.Complete(ctx, op.lease, idemkv.Result{Status: 201, Pointer: "holder"}, nil) == nil {
						require.Empty(t, op.settled, key)
						op.settled = "holder"
					}
					return
				}
			},
			"advance": func(rt *rapid.T) {
				v.clock.Advance(rapid.SampledFrom([]time.Duration{time.Second, 5 * time.Second, lease}).Draw(rt, "d"))
			},
			"pass": func(rt *rapid.T) {
				both := rapid.Bool().Draw(rt, "both")
				var wg sync.WaitGroup
				for i, w := range ws {
					if i == 1 && !both {
						break
					}
					wg.Add(1)
					go func() { defer wg.Done(); require.NoError(t, w.Pass(ctx)) }()
				}
				wg.Wait()
			},
			"restart": func(rt *rapid.T) {
				if rapid.IntRange(0, 3).Draw(rt, "restart") != 0 {
					return // a reopen is most of a run's cost: one step in four of these
				}
				v.reopen()
				ws = workers()
				for _, op := range ops {
					op.held = false // its process is gone
				}
			},
			"": func(rt *rapid.T) { checkModel(t, v, ops) },
		})
		// With time, every record settles or is escalated.
		for range 2 * o.MaxAttempts {
			v.clock.Advance(time.Minute)
			require.NoError(t, ws[0].Pass(ctx))
		}
		checkModel(t, v, ops)
		for key, op := range ops {
			want := map[reconcile.Verdict]string{reconcile.Applied: "applied", reconcile.NotApplied: "not applied",
				reconcile.Unknown: "escalated"}[op.truth]
			if op.settled != "holder" && !op.held {
				require.Equal(t, want, op.settled, key)
			}
		}
		v.requireSound()
	})
}

// checkModel reads every operation's record and checks it against the
// downstream's truth, recording how each has settled.
func checkModel(t *testing.T, v *env, ops map[string]*modelOp) {
	for key, op := range ops {
		rec, ok := v.state(key)
		var now string
		switch {
		case !ok:
			now = "not applied"
		case rec.State == idemkv.StateCompleted && rec.Result.Pointer == "holder":
			now = "holder"
		case rec.State == idemkv.StateCompleted:
			now = "applied"
		case rec.Escalated:
			now = "escalated"
		default:
			require.Empty(t, op.settled, "%s was %s and is %v again", key, op.settled, rec.State)
			continue
		}
		if op.settled != "" {
			require.Equal(t, op.settled, now, "%s changed after it settled", key)
			continue
		}
		switch now {
		case "applied":
			require.Equal(t, reconcile.Applied, op.truth, key)
		case "not applied":
			require.Equal(t, reconcile.NotApplied, op.truth, key)
		case "escalated":
			require.Equal(t, reconcile.Unknown, op.truth, key)
		}
		op.settled = now
	}
}
