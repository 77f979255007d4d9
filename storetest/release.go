package storetest

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
)

// errCompensation is what a failing compensation returns.
var errCompensation = errors.New("the compensation failed")

// compensate returns a Release's apply function that gives back what the
// attempt of l held: it marks the compensation done under comp/<key>
// with l's token, and sets every key of give to its value; fail makes it
// return errCompensation after its writes.
func compensate(l idemkv.Lease, give map[string]string, fail bool) func(idemkv.Effects) error {
	return func(fx idemkv.Effects) error {
		if err := fx.Set([]byte("comp/"+l.ID.Key), []byte(strconv.FormatUint(l.Token, 10))); err != nil {
			return err
		}
		for k, v := range give {
			if err := fx.Set([]byte(k), []byte(v)); err != nil {
				return err
			}
		}
		if fail {
			return errCompensation
		}
		return nil
	}
}

// wantEffect fails t unless key holds want ("": absent).
func wantEffect(t *testing.T, h Harness, what, key, want string) {
	t.Helper()
	v, err := h.ReadEffect([]byte(key))
	switch {
	case want == "" && !errors.Is(err, idemkv.ErrNotFound):
		t.Fatalf("%s: %s holds %q (%v), want nothing", what, key, v, err)
	case want != "" && (err != nil || string(v) != want):
		t.Fatalf("%s: %s holds %q (%v), want %q", what, key, v, err, want)
	}
}

// releaseCompensations: a Release carries the attempt's compensations (a
// hold given back) in its own commit, fenced as it is. They land with
// the release, for a local or a remote claim, and stay across a restart;
// a holder whose lease was taken over writes none of them and gets
// ErrFenced; an apply function that fails writes nothing, and the lease
// is still held.
func releaseCompensations(t *testing.T, newHarness NewHarness) {
	h := newHarness(t, nil)
	defer h.Close()
	id := func(key string) idemkv.ID { return idemkv.ID{Tenant: "t", Endpoint: "POST /pay", Key: key} }
	fp := []byte("fp")

	// An earlier operation holds 100 on the account.
	seed := claimAcquired(t, h, idemkv.ClaimRequest{ID: id("hold"), Fingerprint: fp})
	must(t, h.Store().Complete(ctx, seed, idemkv.Result{Status: 201}, func(fx idemkv.Effects) error {
		return fx.Set([]byte("acct/held"), []byte("100"))
	}))

	// A remote attempt gives its hold back as it releases the key; the
	// apply function reads the hold, on a store whose Effects read.
	l := claimAcquired(t, h, idemkv.ClaimRequest{ID: id("pay-1"), Fingerprint: fp, Mode: idemkv.ModeRemote})
	must(t, h.Store().Release(ctx, l, func(fx idemkv.Effects) error {
		v, err := fx.Get([]byte("acct/held"))
		switch {
		case errors.Is(err, idemkv.ErrInvalidArgument): // Effects that do not read
		case err != nil:
			return err
		case string(v) != "100":
			return errors.New("the hold reads " + strconv.Quote(string(v)) + ", want 100")
		}
		return compensate(l, map[string]string{"acct/held": "0"}, false)(fx)
	}))
	if _, err := h.Store().Get(ctx, l.ID); !errors.Is(err, idemkv.ErrNotFound) {
		t.Fatalf("after a release with compensations: %v, want ErrNotFound", err)
	}
	tok := strconv.FormatUint(l.Token, 10)
	wantEffect(t, h, "a remote release", "acct/held", "0")
	wantEffect(t, h, "a remote release", "comp/pay-1", tok)

	// And a local one.
	ll := claimAcquired(t, h, idemkv.ClaimRequest{ID: id("pay-2"), Fingerprint: fp})
	must(t, h.Store().Release(ctx, ll, compensate(ll, nil, false)))
	if _, err := h.Store().Get(ctx, ll.ID); !errors.Is(err, idemkv.ErrNotFound) {
		t.Fatalf("after a local release with compensations: %v, want ErrNotFound", err)
	}
	wantEffect(t, h, "a local release", "comp/pay-2", strconv.FormatUint(ll.Token, 10))

	h.Reopen()
	wantEffect(t, h, "after a restart", "acct/held", "0")
	wantEffect(t, h, "after a restart", "comp/pay-1", tok)

	// A stale holder, whose lease a retry took over, gives back nothing:
	// the live attempt still uses the hold.
	must(t, h.Store().Complete(ctx, claimAcquired(t, h, idemkv.ClaimRequest{ID: id("hold-2"), Fingerprint: fp}),
		idemkv.Result{Status: 201}, func(fx idemkv.Effects) error { return fx.Set([]byte("acct/held"), []byte("100")) }))
	req := idemkv.ClaimRequest{ID: id("pay-3"), Fingerprint: fp, Mode: idemkv.ModeRemote, Resumable: true, Lease: 5 * time.Second}
	stale := claimAcquired(t, h, req)
	h.Advance(5 * time.Second)
	live := claimAcquired(t, h, req)
	if !live.Takeover() {
		t.Fatalf("claim after the lease ran out: attempt %d, want a takeover", live.Attempt)
	}
	err := h.Store().Release(ctx, stale, compensate(stale, map[string]string{"acct/held": "0"}, false))
	if !errors.Is(err, idemkv.ErrFenced) {
		t.Fatalf("a stale holder's release: %v, want ErrFenced", err)
	}
	wantEffect(t, h, "a fenced release", "acct/held", "100")
	wantEffect(t, h, "a fenced release", "comp/pay-3", "")
	rec, err := h.Store().Get(ctx, req.ID)
	must(t, err)
	if rec.State != idemkv.StateInProgress || rec.Token != live.Token {
		t.Fatalf("after a fenced release: %v under token %d, want in progress under %d", rec.State, rec.Token, live.Token)
	}
	must(t, h.Store().Complete(ctx, live, idemkv.Result{Status: 201}, nil))
	err = h.Store().Release(ctx, live, compensate(live, map[string]string{"acct/held": "0"}, false))
	if !errors.Is(err, idemkv.ErrFenced) {
		t.Fatalf("a release after the outcome: %v, want ErrFenced", err)
	}
	wantEffect(t, h, "a release after the outcome", "acct/held", "100")
	wantEffect(t, h, "a release after the outcome", "comp/pay-3", "")

	// A compensation that fails writes nothing, and the attempt still
	// holds the key: it may complete.
	fl := claimAcquired(t, h, idemkv.ClaimRequest{ID: id("pay-4"), Fingerprint: fp, Mode: idemkv.ModeRemote})
	err = h.Store().Release(ctx, fl, compensate(fl, map[string]string{"acct/held": "0"}, true))
	if !errors.Is(err, errCompensation) {
		t.Fatalf("a release whose compensation fails: %v, want its error", err)
	}
	wantEffect(t, h, "a failed compensation", "acct/held", "100")
	wantEffect(t, h, "a failed compensation", "comp/pay-4", "")
	rec, err = h.Store().Get(ctx, fl.ID)
	must(t, err)
	if rec.State != idemkv.StateInProgress || rec.Token != fl.Token {
		t.Fatalf("after a failed compensation: %v under token %d, want in progress under %d", rec.State, rec.Token, fl.Token)
	}
	must(t, h.Store().Complete(ctx, fl, idemkv.Result{Status: 201}, nil))
	rec, err = h.Store().Get(ctx, fl.ID)
	must(t, err)
	if rec.State != idemkv.StateCompleted {
		t.Fatalf("complete after a failed compensation: %v", rec.State)
	}
}
