package reconcile_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/logtest"
	"github.com/idemkv/idemkv/reconcile"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// logged returns the records of g with message msg.
func logged(t *testing.T, g *logtest.Log, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, m := range g.Records(t) {
		if m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// panickingApply answers Applied with an Apply that writes, then panics:
// a bug in the application's ledger code.
func panickingApply(_ context.Context, rec idemkv.Record) (reconcile.Answer, error) {
	return reconcile.Answer{Verdict: reconcile.Applied, Result: idemkv.Result{Status: 201},
		Apply: func(fx idemkv.Effects) error {
			if err := fx.Set([]byte("pay/"+rec.ID.Key), []byte("charged")); err != nil {
				return err
			}
			panic("ledger bug")
		}}, nil
}

// TestPanicInApplyIsRecovered: Answer.Apply runs inside the store's
// Resolve. A panic in it is recovered there: nothing is written, the
// record stays uncertain, the panic is counted and logged with its stack,
// and the record is asked about again after the backoff, then escalated
// after MaxAttempts, as for an Unknown answer.
func TestPanicInApplyIsRecovered(t *testing.T) {
	v := newEnv(t)
	l := v.uncertain("k")
	logs, logger := logtest.New(slog.LevelDebug)
	var escalated []string
	w := v.worker(reconcile.ReconcilerFunc(panickingApply), reconcile.Options{MaxAttempts: 2,
		MinBackoff: time.Second, MaxBackoff: time.Second,
		OnEscalate: func(_ idemkv.Record, note string) { escalated = append(escalated, note) },
		Logger:     logger})

	require.NotPanics(t, func() { require.NoError(t, w.Pass(ctx)) })
	rec, ok := v.state("k")
	require.True(t, ok)
	assert.Equal(t, idemkv.StateUncertain, rec.State)
	assert.False(t, rec.Escalated)
	assert.Equal(t, l.Token, rec.Token)
	_, err := v.e.GetData(ctx, []byte("pay/k"))
	require.ErrorIs(t, err, idemkv.ErrNotFound, "nothing the panicking Apply wrote is stored")
	st := w.Stats()
	assert.Equal(t, [5]int64{1, 1, 1, 1, 0}, [5]int64{st.Asked, st.Panics, st.Errors, st.Unknown, st.Applied})
	lines := logged(t, logs, "reconcile: the application's code panicked")
	require.Len(t, lines, 1)
	assert.Equal(t, "ERROR", lines[0]["level"])
	assert.Equal(t, "Answer.Apply", lines[0]["in"])
	assert.Equal(t, "ledger bug", lines[0]["panic"])
	assert.Contains(t, lines[0]["stack"], "reconcile_test.panickingApply", "the stack of the panic, not of the recovery")

	require.NoError(t, w.Pass(ctx))
	assert.Equal(t, int64(1), w.Stats().Asked, "backing off, as after an Unknown answer")
	v.clock.Advance(time.Second)
	require.NotPanics(t, func() { require.NoError(t, w.Pass(ctx)) })
	rec, _ = v.state("k")
	assert.True(t, rec.Escalated, "escalated after MaxAttempts")
	require.Len(t, escalated, 1)
	assert.Contains(t, escalated[0], "Answer.Apply panicked: ledger bug")
	assert.Equal(t, int64(2), w.Stats().Panics)
	v.requireSound()
}

// TestPanicInHooksIsRecovered: a panic in OnResolve or OnEscalate is
// recovered and counted; the record stays settled. OnResolve is called
// once per record this worker resolved, with the verdict.
func TestPanicInHooksIsRecovered(t *testing.T) {
	v := newEnv(t)
	d := newDownstream()
	v.uncertain("applied")
	d.set("applied", reconcile.Applied)
	v.uncertain("gone")
	d.set("gone", reconcile.NotApplied)
	v.uncertain("unknown")
	var mu sync.Mutex
	resolved := map[string]reconcile.Verdict{}
	w := v.worker(d, reconcile.Options{MaxAttempts: 1,
		OnResolve: func(_ context.Context, rec idemkv.Record, verdict reconcile.Verdict) {
			mu.Lock()
			resolved[rec.ID.Key] = verdict
			mu.Unlock()
			panic(errors.New("hook bug"))
		},
		OnEscalate: func(idemkv.Record, string) { panic("pager bug") }})
	require.NotPanics(t, func() { require.NoError(t, w.Pass(ctx)) })
	assert.Equal(t, map[string]reconcile.Verdict{"applied": reconcile.Applied, "gone": reconcile.NotApplied}, resolved)
	rec, ok := v.state("applied")
	require.True(t, ok)
	assert.Equal(t, idemkv.StateCompleted, rec.State)
	_, ok = v.state("gone")
	assert.False(t, ok)
	rec, _ = v.state("unknown")
	assert.True(t, rec.Escalated)
	st := w.Stats()
	assert.Equal(t, [4]int64{3, 1, 1, 1}, [4]int64{st.Panics, st.Applied, st.NotApplied, st.Escalated})
	assert.Zero(t, st.Errors, "the answers were fine")
	v.requireSound()
}

// TestPanicInHandlesIsRecovered: a Handles that panics on a record takes
// nothing of it: the panic is counted, the record left alone, and the
// others are settled.
func TestPanicInHandlesIsRecovered(t *testing.T) {
	v := newEnv(t)
	d := newDownstream()
	v.uncertain("bad")
	d.set("bad", reconcile.Applied)
	v.uncertain("good")
	d.set("good", reconcile.Applied)
	w := v.worker(d, reconcile.Options{Handles: func(rec idemkv.Record) bool {
		if rec.ID.Key == "bad" {
			panic("handles bug")
		}
		return true
	}})
	require.NotPanics(t, func() { require.NoError(t, w.Pass(ctx)) })
	rec, _ := v.state("good")
	assert.Equal(t, idemkv.StateCompleted, rec.State)
	rec, _ = v.state("bad")
	assert.Equal(t, idemkv.StateUncertain, rec.State, "left alone")
	assert.Equal(t, int64(1), w.Stats().Panics)
	_, _, asks := w.Due(rec)
	assert.False(t, asks)
}
