package admin_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/admin"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/reconcile"
	"github.com/stretchr/testify/require"
)

// The application above the store is faked: a Settler and a Reconciler
// whose answers write a row (applied) or give back a hold (not applied),
// as the payments service's do, in the data the engine keeps beside its
// records.

type settlerFunc func(ctx context.Context, rec idemkv.Record, v reconcile.Verdict, res idemkv.Result) (reconcile.Answer, error)

func (f settlerFunc) Settle(ctx context.Context, rec idemkv.Record, v reconcile.Verdict, res idemkv.Result) (reconcile.Answer, error) {
	return f(ctx, rec, v, res)
}

func rowKey(key string) []byte  { return []byte("row/" + key) }
func holdKey(key string) []byte { return []byte("hold/" + key) }

// writeRow is an applied answer's Apply: the row, and the hold converted.
func writeRow(key, row string) func(idemkv.Effects) error {
	return func(fx idemkv.Effects) error {
		if err := fx.Set(rowKey(key), []byte(row)); err != nil {
			return err
		}
		return fx.Delete(holdKey(key))
	}
}

// giveBack is a not-applied answer's Apply: the hold goes.
func giveBack(key string) func(idemkv.Effects) error {
	return func(fx idemkv.Effects) error { return fx.Delete(holdKey(key)) }
}

// fixture is an engine with an audit log, and an uncertain payment
// "p1" that holds its amount.
type fixture struct {
	e     *engine.Engine
	audit *admin.AuditLog
	path  string
	rec   idemkv.Record
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	e, err := engine.Open(t.TempDir(), &engine.Options{NoBackgroundSweep: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	path := filepath.Join(t.TempDir(), "audit.log")
	audit, err := admin.OpenAuditLog(path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = audit.Close() })
	f := &fixture{e: e, audit: audit, path: path}
	uncertain(t, e, "p1")
	require.NoError(t, e.Update(ctx, func(fx idemkv.Effects) error { return fx.Set(holdKey("p1"), []byte("5000")) }))
	f.rec, err = e.Get(ctx, id("p1"))
	require.NoError(t, err)
	return f
}

// data reads key from the engine's data; "" if absent.
func (f *fixture) data(t *testing.T, key []byte) string {
	t.Helper()
	v, err := f.e.GetData(ctx, key)
	if errors.Is(err, idemkv.ErrNotFound) {
		return ""
	}
	require.NoError(t, err)
	return string(v)
}

// unchanged checks that p1 is as it was: uncertain, same token, its hold
// kept, no row.
func (f *fixture) unchanged(t *testing.T) {
	t.Helper()
	rec, err := f.e.Get(ctx, id("p1"))
	require.NoError(t, err)
	require.Equal(t, idemkv.StateUncertain, rec.State)
	require.Equal(t, f.rec.Token, rec.Token)
	require.Equal(t, "5000", f.data(t, holdKey("p1")), "the hold is kept")
	require.Empty(t, f.data(t, rowKey("p1")), "no row written")
}

// entries reads the audit log's entries.
func (f *fixture) entries(t *testing.T) []admin.AuditEntry {
	t.Helper()
	h, err := f.audit.History(id("p1"))
	require.NoError(t, err)
	return h
}

func applied(note string) admin.ResolveRequest {
	return admin.ResolveRequest{Tenant: "acct_1", Endpoint: "POST /v1/payments", Key: "p1", Status: 201,
		Pointer: "/v1/payments/pay_op", Note: note}
}

func noEffect(note string) admin.ResolveRequest {
	return admin.ResolveRequest{Tenant: "acct_1", Endpoint: "POST /v1/payments", Key: "p1", NoEffect: true, Note: note}
}

// TestResolveThroughTheSettler: an applied resolution asks the Settler
// with the operator's result and commits the Answer's Result and writes
// with it; a no-effect one asks with NotApplied and commits its writes
// (the hold given back) with the record's removal; and the writes go only
// with the resolution: when the store refuses it, none is made.
func TestResolveThroughTheSettler(t *testing.T) {
	t.Run("applied", func(t *testing.T) {
		f := newFixture(t)
		var asked []string
		s := settlerFunc(func(_ context.Context, rec idemkv.Record, v reconcile.Verdict, res idemkv.Result) (reconcile.Answer, error) {
			asked = append(asked, fmt.Sprintf("%s %v %d %s", rec.ID.Key, v, res.Status, res.Pointer))
			return reconcile.Answer{Verdict: reconcile.Applied, Result: idemkv.Result{Status: 201, Pointer: "/v1/payments/pay_svc"},
				Apply: writeRow("p1", "pay_svc")}, nil
		})
		entry, err := admin.Resolve(ctx, f.e, f.audit, applied("ops: seen"), &admin.ResolveOptions{Settler: s})
		require.NoError(t, err)
		require.Equal(t, []string{"p1 applied 201 /v1/payments/pay_op"}, asked)
		rec, err := f.e.Get(ctx, id("p1"))
		require.NoError(t, err)
		require.Equal(t, idemkv.StateCompleted, rec.State)
		require.Equal(t, "/v1/payments/pay_svc", rec.Result.Pointer, "the Answer's result, which the service rebuilt")
		require.Equal(t, "pay_svc", f.data(t, rowKey("p1")), "the service's row, with the resolution")
		require.Empty(t, f.data(t, holdKey("p1")), "its hold converted")
		require.Equal(t, 1, rec.Effects)
		require.Contains(t, entry.Outcome, "through the service")
		require.False(t, entry.Verified)
	})
	t.Run("applied, the Answer without a result", func(t *testing.T) {
		f := newFixture(t)
		s := settlerFunc(func(context.Context, idemkv.Record, reconcile.Verdict, idemkv.Result) (reconcile.Answer, error) {
			return reconcile.Answer{Apply: writeRow("p1", "pay_op")}, nil
		})
		_, err := admin.Resolve(ctx, f.e, f.audit, applied("ops: seen"), &admin.ResolveOptions{Settler: s})
		require.NoError(t, err)
		rec, err := f.e.Get(ctx, id("p1"))
		require.NoError(t, err)
		require.Equal(t, "/v1/payments/pay_op", rec.Result.Pointer, "the operator's result")
		require.Equal(t, "pay_op", f.data(t, rowKey("p1")))
	})
	t.Run("no effect", func(t *testing.T) {
		f := newFixture(t)
		var asked []string
		s := settlerFunc(func(_ context.Context, rec idemkv.Record, v reconcile.Verdict, res idemkv.Result) (reconcile.Answer, error) {
			asked = append(asked, fmt.Sprintf("%s %v %+v", rec.ID.Key, v, res))
			return reconcile.Answer{Verdict: reconcile.NotApplied, Apply: giveBack("p1")}, nil
		})
		entry, err := admin.Resolve(ctx, f.e, f.audit, noEffect("ops: no charge"), &admin.ResolveOptions{Settler: s})
		require.NoError(t, err)
		require.Equal(t, []string{"p1 not applied {Status:0 Pointer: Body:[]}"}, asked)
		_, err = f.e.Get(ctx, id("p1"))
		require.ErrorIs(t, err, idemkv.ErrNotFound)
		require.Empty(t, f.data(t, holdKey("p1")), "the hold given back with the removal")
		require.Contains(t, entry.Outcome, "through the service")
	})
	t.Run("the writes go only with the resolution", func(t *testing.T) {
		f := newFixture(t)
		// While the Settler answers, the reconciler settles the record:
		// the operator's resolution then loses, and its writes with it.
		s := settlerFunc(func(ctx context.Context, rec idemkv.Record, _ reconcile.Verdict, _ idemkv.Result) (reconcile.Answer, error) {
			require.NoError(t, f.e.Resolve(ctx, idemkv.ResolveRequest{ID: rec.ID, Token: rec.Token, Result: idemkv.Result{Status: 201}}))
			return reconcile.Answer{Apply: writeRow("p1", "pay_op")}, nil
		})
		_, err := admin.Resolve(ctx, f.e, f.audit, applied("ops: seen"), &admin.ResolveOptions{Settler: s})
		require.Error(t, err)
		require.Empty(t, f.data(t, rowKey("p1")), "no row without the resolution")
		require.Equal(t, "5000", f.data(t, holdKey("p1")))
		rep, err := f.e.Check(ctx)
		require.NoError(t, err)
		require.Zero(t, rep.ProblemCount)
	})
	t.Run("a completed record is not asked about", func(t *testing.T) {
		f := newFixture(t)
		complete(t, f.e, "c1")
		s := settlerFunc(func(context.Context, idemkv.Record, reconcile.Verdict, idemkv.Result) (reconcile.Answer, error) {
			t.Error("the Settler was asked about a completed record")
			return reconcile.Answer{}, nil
		})
		req := noEffect("ops: undo")
		req.Key = "c1"
		_, err := admin.Resolve(ctx, f.e, f.audit, req, &admin.ResolveOptions{Settler: s})
		require.ErrorIs(t, err, idemkv.ErrWrongState)
		rec, err := f.e.Get(ctx, id("c1"))
		require.NoError(t, err)
		require.Equal(t, idemkv.StateCompleted, rec.State)
	})
}

// TestSettlerRefusals: an error or a panic in Settle, an error or a
// panic in its Apply, and an Answer of the opposite verdict each refuse
// the resolution: nothing is written, the record is as it was, and the
// audit log records the attempt as failed with the reason.
func TestSettlerRefusals(t *testing.T) {
	for _, tc := range []struct {
		name   string
		req    admin.ResolveRequest
		answer func() (reconcile.Answer, error)
		want   string
	}{
		{"settle fails", applied("a"), func() (reconcile.Answer, error) {
			return reconcile.Answer{}, errors.New("no charge under this key")
		}, "no charge under this key"},
		{"settle panics", applied("b"), func() (reconcile.Answer, error) { panic("boom in settle") }, "settle panicked: boom in settle"},
		{"apply fails", applied("c"), func() (reconcile.Answer, error) {
			return reconcile.Answer{Apply: func(fx idemkv.Effects) error {
				if err := fx.Set(rowKey("p1"), []byte("half")); err != nil {
					return err
				}
				return errors.New("ledger closed")
			}}, nil
		}, "ledger closed"},
		{"apply panics", noEffect("d"), func() (reconcile.Answer, error) {
			return reconcile.Answer{Apply: func(fx idemkv.Effects) error {
				if err := fx.Delete(holdKey("p1")); err != nil {
					return err
				}
				panic("boom in apply")
			}}, nil
		}, "apply panicked: boom in apply"},
		{"the opposite verdict", noEffect("e"), func() (reconcile.Answer, error) {
			return reconcile.Answer{Verdict: reconcile.Applied, Apply: giveBack("p1")}, nil
		}, "asked to settle it not applied, it answered applied"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			s := settlerFunc(func(context.Context, idemkv.Record, reconcile.Verdict, idemkv.Result) (reconcile.Answer, error) {
				return tc.answer()
			})
			_, err := admin.Resolve(ctx, f.e, f.audit, tc.req, &admin.ResolveOptions{Settler: s})
			require.ErrorIs(t, err, admin.ErrServiceRefused)
			require.ErrorContains(t, err, tc.want)
			f.unchanged(t)
			h := f.entries(t)
			require.Len(t, h, 2)
			require.Equal(t, admin.PhaseBegun, h[0].Phase)
			require.Equal(t, admin.PhaseFailed, h[1].Phase)
			require.Contains(t, h[1].Outcome, tc.want)
		})
	}
}

// recFunc adapts a function to a Reconciler, counting its calls.
func recFunc(calls *atomic.Int32, a reconcile.Answer, err error) reconcile.Reconciler {
	return reconcile.ReconcilerFunc(func(context.Context, idemkv.Record) (reconcile.Answer, error) {
		calls.Add(1)
		return a, err
	})
}

// TestVerify: a verified resolution asks the reconciler and commits its
// Answer if it agrees (its result, not the operator's, and its writes);
// it is refused, with nothing written, when the reconciler says the
// opposite, cannot say, fails, panics or does not answer in time, or
// when there is none; the Settler is not asked; the audit log says it
// was verified and what the downstream answered.
func TestVerify(t *testing.T) {
	appliedAnswer := reconcile.Answer{Verdict: reconcile.Applied,
		Result: idemkv.Result{Status: 201, Pointer: "/v1/payments/pay_real"}, Apply: writeRow("p1", "pay_real")}
	notApplied := reconcile.Answer{Verdict: reconcile.NotApplied, Apply: giveBack("p1")}
	for _, tc := range []struct {
		name       string
		req        admin.ResolveRequest
		r          func(calls *atomic.Int32) reconcile.Reconciler
		err        error  // nil: resolved
		detail     string // in the error, and the failed entry
		downstream string
	}{
		{name: "agrees it happened", req: applied("ops: seen"), downstream: "applied",
			r: func(c *atomic.Int32) reconcile.Reconciler { return recFunc(c, appliedAnswer, nil) }},
		{name: "agrees it did not", req: noEffect("ops: not seen"), downstream: "not applied",
			r: func(c *atomic.Int32) reconcile.Reconciler { return recFunc(c, notApplied, nil) }},
		{name: "says it happened", req: noEffect("ops: not seen"), downstream: "applied",
			err: admin.ErrDownstreamDisagrees, detail: "says the operation happened",
			r: func(c *atomic.Int32) reconcile.Reconciler { return recFunc(c, appliedAnswer, nil) }},
		{name: "says it did not", req: applied("ops: seen"), downstream: "not applied",
			err: admin.ErrDownstreamDisagrees, detail: "says the operation did not happen",
			r: func(c *atomic.Int32) reconcile.Reconciler { return recFunc(c, notApplied, nil) }},
		{name: "cannot say", req: noEffect("ops: not seen"), downstream: "unknown",
			err: admin.ErrDownstreamUnknown, detail: "processor down",
			r: func(c *atomic.Int32) reconcile.Reconciler {
				return recFunc(c, reconcile.Answer{Reason: "processor down", Apply: giveBack("p1")}, nil)
			}},
		{name: "fails", req: applied("ops: seen"), downstream: "unknown",
			err: admin.ErrDownstreamUnknown, detail: "lookup: connection refused",
			r: func(c *atomic.Int32) reconcile.Reconciler {
				return recFunc(c, appliedAnswer, errors.New("lookup: connection refused"))
			}},
		{name: "answers out of range", req: applied("ops: seen"), downstream: "unknown",
			err: admin.ErrDownstreamUnknown, detail: "answered Verdict(7)",
			r: func(c *atomic.Int32) reconcile.Reconciler { return recFunc(c, reconcile.Answer{Verdict: 7}, nil) }},
		{name: "panics", req: noEffect("ops: not seen"), downstream: "unknown",
			err: admin.ErrDownstreamUnknown, detail: "reconcile panicked: boom",
			r: func(c *atomic.Int32) reconcile.Reconciler {
				return reconcile.ReconcilerFunc(func(context.Context, idemkv.Record) (reconcile.Answer, error) {
					c.Add(1)
					panic("boom")
				})
			}},
		{name: "does not answer in time", req: noEffect("ops: not seen"), downstream: "unknown",
			err: admin.ErrDownstreamUnknown, detail: "no answer within 10s",
			r: func(c *atomic.Int32) reconcile.Reconciler {
				return reconcile.ReconcilerFunc(func(ctx context.Context, _ idemkv.Record) (reconcile.Answer, error) {
					c.Add(1)
					<-ctx.Done() // the clock below runs the timeout at once
					return notApplied, ctx.Err()
				})
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			var calls atomic.Int32
			settler := settlerFunc(func(context.Context, idemkv.Record, reconcile.Verdict, idemkv.Result) (reconcile.Answer, error) {
				t.Error("a verified resolution asks the reconciler, not the Settler")
				return reconcile.Answer{}, errors.New("not asked")
			})
			tc.req.Verify = true
			entry, err := admin.Resolve(ctx, f.e, f.audit, tc.req,
				&admin.ResolveOptions{Settler: settler, Reconciler: tc.r(&calls), Clock: immediateClock{}})
			require.EqualValues(t, 1, calls.Load())
			h := f.entries(t)
			require.Len(t, h, 2)
			require.True(t, h[0].Verified)
			require.Empty(t, h[0].Downstream, "not asked yet when the change begins")
			require.True(t, h[1].Verified)
			require.Equal(t, tc.downstream, h[1].Downstream)
			if tc.err != nil {
				require.ErrorIs(t, err, tc.err)
				require.ErrorContains(t, err, tc.detail)
				f.unchanged(t)
				require.Equal(t, admin.PhaseFailed, h[1].Phase)
				require.Contains(t, h[1].Outcome, tc.detail)
				return
			}
			require.NoError(t, err)
			require.Equal(t, h[1], entry)
			require.Equal(t, admin.PhaseDone, entry.Phase)
			require.Empty(t, f.data(t, holdKey("p1")), "the hold converted or given back")
			rec, err := f.e.Get(ctx, id("p1"))
			if tc.req.NoEffect {
				require.ErrorIs(t, err, idemkv.ErrNotFound)
				require.Contains(t, entry.Outcome, "downstream confirms")
				return
			}
			require.NoError(t, err)
			require.Equal(t, idemkv.Result{Status: 201, Pointer: "/v1/payments/pay_real"}, rec.Result,
				"the downstream's answer, not the operator's /v1/payments/pay_op")
			require.Equal(t, "pay_real", f.data(t, rowKey("p1")))
			require.Equal(t, "completed with the downstream's answer, status 201 /v1/payments/pay_real", entry.Outcome)
		})
	}

	t.Run("no reconciler", func(t *testing.T) {
		f := newFixture(t)
		req := noEffect("ops: not seen")
		req.Verify = true
		_, err := admin.Resolve(ctx, f.e, f.audit, req, nil)
		require.ErrorIs(t, err, admin.ErrNoReconciler)
		f.unchanged(t)
		require.Empty(t, f.entries(t), "refused before anything was begun")
	})
}

// immediateClock runs every AfterFunc at once: a timeout that has
// already passed, without waiting for it.
type immediateClock struct{}

func (immediateClock) Now() time.Time { return time.Now() }

func (immediateClock) AfterFunc(_ time.Duration, f func()) func() bool {
	f()
	return func() bool { return false }
}

// TestResolveAPIThroughTheService: the admin API resolves through
// Options.Settler and verifies with Options.Reconciler, and answers each
// refusal with its problem type: 409 admin-downstream-disagrees, 502
// admin-downstream-unknown, 409 admin-service-refused, 500 for a panic
// (logged without the key), 404 for verify without a reconciler.
func TestResolveAPIThroughTheService(t *testing.T) {
	body := func(extra string) string {
		return `{"tenant":"acct_1","endpoint":"POST /v1/payments","key":"p1","note":"ops: api"` + extra + `}`
	}
	serveWith := func(t *testing.T, o admin.Options) (*fixture, *httptest.Server) {
		f := newFixture(t)
		o.Token, o.Audit = token, f.audit
		h, err := admin.New(f.e, &o)
		require.NoError(t, err)
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		return f, srv
	}
	var calls atomic.Int32
	charged := recFunc(&calls, reconcile.Answer{Verdict: reconcile.Applied,
		Result: idemkv.Result{Status: 201, Pointer: "/v1/payments/pay_real"}, Apply: writeRow("p1", "pay_real")}, nil)

	for _, tc := range []struct {
		name, body string
		o          admin.Options
		status     int
		problem    string
	}{
		{"verify without a reconciler", body(`,"no_effect":true,"verify":true`), admin.Options{}, 404, "admin-not-found"},
		{"the downstream says it happened", body(`,"no_effect":true,"verify":true`), admin.Options{Reconciler: charged}, 409, "admin-downstream-disagrees"},
		{"the downstream cannot say", body(`,"verify":true`), admin.Options{
			Reconciler: recFunc(&calls, reconcile.Answer{Reason: "processor down"}, nil)}, 502, "admin-downstream-unknown"},
		{"the service refuses", body(`,"status":201`), admin.Options{
			Settler: settlerFunc(func(context.Context, idemkv.Record, reconcile.Verdict, idemkv.Result) (reconcile.Answer, error) {
				return reconcile.Answer{}, errors.New("no charge under this key")
			})}, 409, "admin-service-refused"},
		{"the service panics", body(`,"status":201`), admin.Options{
			Settler: settlerFunc(func(context.Context, idemkv.Record, reconcile.Verdict, idemkv.Result) (reconcile.Answer, error) {
				panic(`settling "p1" went wrong`)
			})}, 500, "admin-internal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logged bytes.Buffer
			tc.o.Logger = slog.New(slog.NewTextHandler(&logged, nil))
			f, srv := serveWith(t, tc.o)
			status, out, _ := call(t, srv, "POST", "/admin/v1/resolve", tc.body, token)
			require.Equal(t, tc.status, status, out)
			require.True(t, strings.HasSuffix(out["type"].(string), tc.problem), out)
			f.unchanged(t)
			require.NotContains(t, logged.String(), `"p1"`, "the log names no key")
			if tc.status == 500 {
				require.Contains(t, logged.String(), "panicked")
			}
		})
	}

	t.Run("verified", func(t *testing.T) {
		f, srv := serveWith(t, admin.Options{Reconciler: charged})
		status, out, _ := call(t, srv, "POST", "/admin/v1/resolve", body(`,"verify":true`), token)
		require.Equal(t, http.StatusOK, status, out)
		require.Equal(t, true, out["verified"])
		require.Equal(t, "applied", out["downstream"])
		rec, err := f.e.Get(ctx, id("p1"))
		require.NoError(t, err)
		require.Equal(t, "/v1/payments/pay_real", rec.Result.Pointer)
		require.Equal(t, "pay_real", f.data(t, rowKey("p1")))
	})
}
