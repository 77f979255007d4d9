package engine

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/idemkv/idemkv"
)

// TestScenarios replays the transcripts in testdata/scenarios. Each command
// acts on a real engine on disk with a fake clock; its output is compared
// with the expected text. Regenerate with -rewrite after a deliberate change.
//
// Commands:
//
//	claim id=T/K fp=X [ep=E] [mode=remote] [resumable] [lease=D] [as=NAME]
//	complete lease=NAME [status=N] [ptr=P] [body=B] [effect=K=V ...]
//	release lease=NAME | uncertain lease=NAME [note=...] | renew lease=NAME [d=D]
//	resolve id=T/K [ep=E] (noeffect | status=N [ptr=P]) [stale]
//	get id=T/K [ep=E] | data key=K | advance D | reopen | census
//
// Tokens are printed as t1, t2, ... in order of first appearance, because
// their absolute values depend on the store's epoch.
func TestScenarios(t *testing.T) {
	datadriven.Walk(t, "testdata/scenarios", func(t *testing.T, path string) {
		v := newEnv(t)
		s := &scenario{v: v, leases: map[string]idemkv.Lease{}, tokens: map[uint64]string{}}
		datadriven.RunTest(t, path, func(t *testing.T, td *datadriven.TestData) string {
			out, err := s.run(t, td)
			if err != nil {
				return "error: " + errName(err) + "\n"
			}
			return out
		})
	})
}

type scenario struct {
	v      *env
	leases map[string]idemkv.Lease
	tokens map[uint64]string
}

func (s *scenario) tok(tok uint64) string {
	if n, ok := s.tokens[tok]; ok {
		return n
	}
	n := fmt.Sprintf("t%d", len(s.tokens)+1)
	s.tokens[tok] = n
	return n
}

// errName reduces an error to the sentinel it wraps, so transcripts do not
// depend on message wording.
func errName(err error) string {
	for _, e := range []error{idemkv.ErrFenced, idemkv.ErrNotFound, idemkv.ErrWrongState,
		idemkv.ErrInvalidKey, idemkv.ErrInvalidScope, idemkv.ErrInvalidFingerprint,
		idemkv.ErrInvalidResult, idemkv.ErrInvalidArgument, idemkv.ErrClosed, idemkv.ErrFailed} {
		if errors.Is(err, e) {
			return strings.TrimPrefix(e.Error(), "idemkv: ")
		}
	}
	return err.Error()
}

func arg(td *datadriven.TestData, key string) (string, bool) {
	for _, a := range td.CmdArgs {
		if a.Key == key {
			if len(a.Vals) == 0 {
				return "", true
			}
			return strings.Join(a.Vals, ","), true
		}
	}
	return "", false
}

func (s *scenario) id(t *testing.T, td *datadriven.TestData) idemkv.ID {
	raw, ok := arg(td, "id")
	if !ok {
		td.Fatalf(t, "missing id=TENANT/KEY")
	}
	tenant, key, _ := strings.Cut(raw, "/")
	ep := "POST /v1/payments"
	if e, ok := arg(td, "ep"); ok {
		ep = e
	}
	return idemkv.ID{Tenant: tenant, Endpoint: ep, Key: key}
}

func (s *scenario) lease(t *testing.T, td *datadriven.TestData) idemkv.Lease {
	name, _ := arg(td, "lease")
	l, ok := s.leases[name]
	if !ok {
		td.Fatalf(t, "unknown lease %q", name)
	}
	return l
}

func duration(t *testing.T, td *datadriven.TestData, s string) time.Duration {
	d, err := time.ParseDuration(s)
	if err != nil {
		td.Fatalf(t, "bad duration %q: %v", s, err)
	}
	return d
}

func result(td *datadriven.TestData) idemkv.Result {
	var r idemkv.Result
	if v, ok := arg(td, "status"); ok {
		fmt.Sscan(v, &r.Status)
	}
	r.Pointer, _ = arg(td, "ptr")
	if b, ok := arg(td, "body"); ok {
		r.Body = []byte(b)
	}
	return r
}

func fmtResult(r idemkv.Result) string {
	s := fmt.Sprintf("status=%d", r.Status)
	if r.Pointer != "" {
		s += " ptr=" + r.Pointer
	}
	if r.Body != nil {
		s += fmt.Sprintf(" body=%q", r.Body)
	}
	return s
}

func (s *scenario) run(t *testing.T, td *datadriven.TestData) (string, error) {
	v := s.v
	now := v.clock.Now()
	rel := func(at time.Time) string { return "+" + at.Sub(now).String() }
	switch td.Cmd {
	case "claim":
		req := idemkv.ClaimRequest{ID: s.id(t, td)}
		fp, _ := arg(td, "fp")
		if fp != "" {
			req.Fingerprint = []byte(fp)
		}
		if m, _ := arg(td, "mode"); m == "remote" {
			req.Mode = idemkv.ModeRemote
		}
		_, req.Resumable = arg(td, "resumable")
		if d, ok := arg(td, "lease"); ok {
			req.Lease = duration(t, td, d)
		}
		c, err := v.e.Claim(ctx, req)
		if err != nil {
			return "", err
		}
		switch c.Outcome {
		case idemkv.Acquired:
			if name, ok := arg(td, "as"); ok {
				s.leases[name] = c.Lease
			}
			out := fmt.Sprintf("acquired token=%s attempt=%d mode=%s expires=%s", s.tok(c.Lease.Token),
				c.Lease.Attempt, c.Lease.Mode, rel(c.Lease.Expires))
			if c.Lease.Takeover() {
				out += " takeover"
			}
			if !c.Lease.OperationID.IsZero() {
				out += " opid=set"
			}
			return out + "\n", nil
		case idemkv.InProgress:
			return fmt.Sprintf("in-progress retry-after=%s\n", c.RetryAfter), nil
		case idemkv.Replay:
			return "replay " + fmtResult(c.Record.Result) + "\n", nil
		case idemkv.Mismatch:
			return fmt.Sprintf("mismatch stored-fp=%s\n", c.Record.Fingerprint), nil
		case idemkv.Reconciling:
			return fmt.Sprintf("reconciling token=%s note=%q\n", s.tok(c.Record.Token), c.Record.Note), nil
		}
		return c.Outcome.String() + "\n", nil
	case "complete":
		l := s.lease(t, td)
		var effs [][2]string
		for _, a := range td.CmdArgs {
			if a.Key == "effect" {
				for _, kv := range a.Vals {
					k, val, _ := strings.Cut(kv, "=")
					effs = append(effs, [2]string{k, val})
				}
			}
		}
		err := v.e.Complete(ctx, l, result(td), func(w idemkv.Effects) error {
			for _, e := range effs {
				if err := w.Set([]byte(e[0]), []byte(e[1])); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return "", err
		}
		return "ok\n", nil
	case "release":
		if err := v.e.Release(ctx, s.lease(t, td), nil); err != nil {
			return "", err
		}
		return "ok\n", nil
	case "uncertain":
		note, _ := arg(td, "note")
		if err := v.e.MarkUncertain(ctx, s.lease(t, td), note); err != nil {
			return "", err
		}
		return "ok\n", nil
	case "renew":
		var d time.Duration
		if ds, ok := arg(td, "d"); ok {
			d = duration(t, td, ds)
		}
		name, _ := arg(td, "lease")
		l, err := v.e.Renew(ctx, s.lease(t, td), d)
		if err != nil {
			return "", err
		}
		s.leases[name] = l
		return fmt.Sprintf("ok expires=%s\n", rel(l.Expires)), nil
	case "resolve":
		id := s.id(t, td)
		rec, err := v.e.Get(ctx, id)
		if err != nil && !errors.Is(err, idemkv.ErrNotFound) {
			return "", err
		}
		req := idemkv.ResolveRequest{ID: id, Token: rec.Token, Result: result(td)}
		_, req.NoEffect = arg(td, "noeffect")
		if _, stale := arg(td, "stale"); stale {
			req.Token--
		}
		if err := v.e.Resolve(ctx, req); err != nil {
			return "", err
		}
		return "ok\n", nil
	case "get":
		rec, err := v.e.Get(ctx, s.id(t, td))
		if err != nil {
			return "", err
		}
		out := fmt.Sprintf("%s mode=%s token=%s attempt=%d fp=%s", rec.State, rec.Mode, s.tok(rec.Token),
			rec.Attempt, rec.Fingerprint)
		switch rec.State {
		case idemkv.StateInProgress:
			out += " lease=" + rel(rec.LeaseExpires)
		case idemkv.StateCompleted:
			out += " " + fmtResult(rec.Result) + " expires=" + rel(rec.Expires)
		case idemkv.StateUncertain:
			out += fmt.Sprintf(" note=%q", rec.Note)
		}
		return out + "\n", nil
	case "data":
		k, _ := arg(td, "key")
		val, err := v.e.GetData(ctx, []byte(k))
		if err != nil {
			return "", err
		}
		return string(val) + "\n", nil
	case "advance":
		if len(td.CmdArgs) != 1 {
			td.Fatalf(t, "advance DURATION")
		}
		v.clock.Advance(duration(t, td, td.CmdArgs[0].Key))
		return fmt.Sprintf("now=+%s\n", v.clock.Now().Sub(t0)), nil
	case "reopen":
		v.reopen()
		return "ok\n", nil
	case "census":
		c, err := v.e.Census(ctx)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("in-progress=%d uncertain=%d completed=%d expired=%d\n",
			c.InProgress, c.Uncertain, c.Completed, c.Expired), nil
	}
	td.Fatalf(t, "unknown command %q", td.Cmd)
	return "", nil
}
