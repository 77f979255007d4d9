package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	fprint "github.com/idemkv/idemkv/fingerprint"
	"github.com/idemkv/idemkv/internal/fakeclock"
)

func init() {
	register(&command{
		name:    "demo",
		args:    "[--data DIR]",
		summary: "play the idempotency guide's failure modes against a real store and check each outcome",
		flags: func(fs *flag.FlagSet) func(context.Context, io.Writer) error {
			dir := fs.String("data", "", "keep the store in `DIR` (created if needed) instead of a temporary directory")
			return func(ctx context.Context, stdout io.Writer) error {
				return runDemo(ctx, demoConfig{out: stdout, dir: *dir, fault: testFault})
			}
		},
	})
}

// demoConfig configures one run of the demo.
type demoConfig struct {
	out io.Writer
	// dir is the store's directory. Empty: a temporary directory, removed at
	// the end. Otherwise it is created if needed and kept.
	dir string
	// fault, if set, makes the simulated client misbehave, so that a test
	// can check that the demo notices (see faultNewKeyOnRetry).
	fault string
}

// faultNewKeyOnRetry makes the client send a brand-new key with every retry,
// the guide's "a new key on every retry" mistake: retries then charge again.
const faultNewKeyOnRetry = "new-key-on-retry"

// testFault is the fault the demo command runs with. Only tests set it.
var testFault string

// The request every scenario sends.
const (
	demoTenant   = "acct_42"
	demoEndpoint = "POST /v1/payments"
	demoBody     = `{"amount":5000,"currency":"USD","card":"tok_123"}`
	demoLease    = 30 * time.Second
)

// balanceKey holds the account's balance, written through Effects.
var balanceKey = []byte("balances/" + demoTenant)

// A scenario plays one failure mode and returns an error if the store did
// not behave as the guide requires.
type scenario struct {
	title string
	run   func(d *demo, ctx context.Context) error
}

var scenarios = []scenario{
	{"Lost response, then retry", (*demo).lostResponse},
	{"Eight duplicates at once", (*demo).concurrentDuplicates},
	{"Same key, different body", (*demo).sameKeyDifferentBody},
	{"Crash after the effect, before the response", (*demo).crashAfterEffect},
	{"Lease expiry: a stalled worker is fenced off", (*demo).staleHolderFenced},
	{"Provider timeout stays uncertain until reconciled", (*demo).providerTimeout},
}

// demo is one run: an engine on a directory, a fake clock, and the
// simulated payment service, client and card provider around them.
type demo struct {
	out   io.Writer
	dir   string
	fault string
	clock *fakeclock.Clock
	opts  engine.Options
	e     *engine.Engine // nil while closed
	opens int
	// stats sums the operation counters of engines already closed, since
	// each Open starts its counters from zero.
	stats engine.Stats

	// ledgerMu serializes the balance's read-modify-write: Effects cannot
	// read, and the engine does not order completions of different keys.
	ledgerMu sync.Mutex
	provider provider
}

// runDemo plays every scenario, narrating on cfg.out, and returns an error
// naming each scenario that did not come out as expected.
func runDemo(ctx context.Context, cfg demoConfig) error {
	dir, where := cfg.dir, "(kept)"
	if dir == "" {
		tmp, err := os.MkdirTemp("", "idemkv-demo-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		dir, where = tmp, "(temporary, removed at the end)"
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	d := &demo{
		out:   cfg.out,
		dir:   dir,
		fault: cfg.fault,
		// The clock starts at the real time, so records kept with --data
		// carry plausible timestamps, and then moves only when told.
		clock: fakeclock.New(time.Now().UTC().Truncate(time.Second)),
	}
	d.opts = engine.Options{Clock: d.clock, Lease: demoLease, CacheSize: 8 << 20, MemTableSize: 4 << 20}
	d.provider.charges = make(map[string]string)
	if err := d.open(); err != nil {
		return err
	}
	defer d.close()
	before, err := d.e.Census(ctx)
	if err != nil {
		return err
	}

	fmt.Fprintf(d.out, "idemkv demo: the idempotency guide's failure modes, played against a real store.\n")
	d.say("store", "%s %s", dir, where)
	d.say("setup", "tenant %s, %s, %v leases on a fake clock that moves only when told", demoTenant, demoEndpoint, demoLease)
	d.say("", "every scenario uses new UUID keys, and checks only this run's change to the balance")

	var failed []string // one line per failed scenario or check
	var failedNums []string
	for i, sc := range scenarios {
		if err := ctx.Err(); err != nil {
			return err
		}
		fmt.Fprintf(d.out, "\n%d. %s\n", i+1, sc.title)
		err := d.ensureOpen()
		if err == nil {
			err = sc.run(d, ctx)
		}
		if err != nil {
			d.say("FAILED", "%v", err)
			failed = append(failed, fmt.Sprintf("scenario %d (%s): %v", i+1, sc.title, err))
			failedNums = append(failedNums, fmt.Sprint(i+1))
		}
	}

	fmt.Fprintf(d.out, "\nThe books\n")
	if err := d.books(ctx, before, len(failed) == 0); err != nil {
		d.say("FAILED", "%v", err)
		failed = append(failed, fmt.Sprintf("the books: %v", err))
	}

	fmt.Fprintf(d.out, "\n%d/%d scenarios behaved as the guide requires", len(scenarios)-len(failedNums), len(scenarios))
	switch {
	case len(failed) == 0:
		fmt.Fprintf(d.out, ".\n")
		return nil
	case len(failedNums) == 0:
		fmt.Fprintf(d.out, ", but the books do not balance (see above).\n")
	default:
		plural := map[bool]string{false: "", true: "s"}[len(failedNums) > 1]
		fmt.Fprintf(d.out, "; FAILED: scenario%s %s (see above).\n", plural, strings.Join(failedNums, ", "))
	}
	return fmt.Errorf("not everything came out as the guide requires:\n  %s", strings.Join(failed, "\n  "))
}

// say narrates one line: who acts, then what happens.
func (d *demo) say(who, format string, args ...any) {
	fmt.Fprintf(d.out, "   %-10s %s\n", who, fmt.Sprintf(format, args...))
}

func (d *demo) open() error {
	e, err := engine.Open(d.dir, &d.opts)
	if err != nil {
		return err
	}
	d.e = e
	d.opens++
	return nil
}

func (d *demo) ensureOpen() error {
	if d.e != nil {
		return nil
	}
	return d.open()
}

// close closes the engine, first adding its counters to d.stats.
func (d *demo) close() error {
	if d.e == nil {
		return nil
	}
	if st, err := d.e.Stats(); err == nil {
		addCounters(&d.stats, st)
	}
	err := d.e.Close()
	d.e = nil
	return err
}

func (d *demo) reopen() error {
	if err := d.close(); err != nil {
		return err
	}
	return d.open()
}

// 1. The first request runs, its response is lost, and the retry replays it.
func (d *demo) lostResponse(ctx context.Context) error {
	key, body := newKey(), []byte(demoBody)
	bal0, err := d.balance()
	if err != nil {
		return err
	}
	d.say("client", "POST key %s, body %s", key, body)
	c, res, err := d.post(ctx, key, body)
	if err != nil {
		return err
	}
	if err := expect(c, idemkv.Acquired, "first request"); err != nil {
		return err
	}
	d.say("store", "Acquired: the key is new, so this request runs")
	d.say("service", "charges %s: ledger entry, balance and the %d response commit in one batch", usd(5000), res.Status)
	// The retry's client library serializes the same JSON differently:
	// canonical JSON (RFC 8785) makes that the same request.
	retryBody := []byte(`{ "card": "tok_123", "currency": "USD", "amount": 5000.0 }`)
	d.say("network", "the %d is lost; the client times out and retries with the same key", res.Status)
	d.say("client", "its retry spells the same JSON differently: %s", retryBody)

	r, rres, err := d.post(ctx, d.retryKey(key), retryBody)
	if err != nil {
		return err
	}
	if err := expect(r, idemkv.Replay, "retry"); err != nil {
		return err
	}
	if !bytes.Equal(rres.Body, res.Body) || rres.Status != res.Status {
		return fmt.Errorf("replayed %d %s, the lost response was %d %s", rres.Status, rres.Body, res.Status, res.Body)
	}
	d.say("store", "Replay: %d %s", rres.Status, rres.Body)
	d.say("why", "that is the lost response byte for byte; the charge already happened and does not run again,")
	d.say("", "and the fingerprint compares canonical JSON, so member order, spacing and 5000.0 vs 5000 do not matter")
	return d.checkCharged(key, bal0, payID(res))
}

// 2. Concurrent duplicates: exactly one runs; the rest get 409, then replay.
func (d *demo) concurrentDuplicates(ctx context.Context) error {
	const n = 8
	key, body := newKey(), []byte(demoBody)
	bal0, err := d.balance()
	if err != nil {
		return err
	}
	d.say("client", "%d copies of one request (key %s) arrive at once", n, key)
	claims := make([]idemkv.Claim, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			claims[i], errs[i] = d.claim(ctx, key, body, idemkv.ModeLocal)
		})
	}
	close(start)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	var winner idemkv.Lease
	won, busy := 0, 0
	var retryAfter time.Duration
	for _, c := range claims {
		switch c.Outcome {
		case idemkv.Acquired:
			won++
			winner = c.Lease
		case idemkv.InProgress:
			busy++
			retryAfter = c.RetryAfter
		}
	}
	if won != 1 || busy != n-1 {
		return fmt.Errorf("%d copies acquired and %d saw in-progress, want 1 and %d", won, busy, n-1)
	}
	d.say("store", "1 Acquired; %d InProgress, answered 409 Conflict with Retry-After: %d", busy, int(retryAfter.Seconds()))
	d.say("why", "the claim is atomic, so only one copy can run; the others must neither run nor guess")
	_, res, err := d.charge(ctx, winner, body)
	if err != nil {
		return err
	}
	d.say("service", "the winner charges %s and completes: %d %s", usd(5000), res.Status, payID(res))

	replays := 0
	for range n - 1 {
		r, rres, err := d.post(ctx, d.retryKey(key), body)
		if err != nil {
			return err
		}
		if r.Outcome == idemkv.Replay && bytes.Equal(rres.Body, res.Body) {
			replays++
		}
	}
	if replays != n-1 {
		return fmt.Errorf("%d of %d retries replayed the winner's response", replays, n-1)
	}
	d.say("client", "the %d retry; each gets Replay: the winner's %d %s", n-1, res.Status, payID(res))
	return d.checkCharged(key, bal0, payID(res))
}

// 3. The same key with another body is rejected, and changes nothing.
func (d *demo) sameKeyDifferentBody(ctx context.Context) error {
	key, body := newKey(), []byte(demoBody)
	other := []byte(`{"amount":50000,"currency":"USD","card":"tok_123"}`)
	bal0, err := d.balance()
	if err != nil {
		return err
	}
	c, res, err := d.post(ctx, key, body)
	if err != nil {
		return err
	}
	if err := expect(c, idemkv.Acquired, "first request"); err != nil {
		return err
	}
	d.say("client", "POST key %s for %s: runs and completes, %d %s", key, usd(5000), res.Status, payID(res))
	d.say("client", "POST with the same key, but body %s", other)
	m, _, err := d.post(ctx, key, other)
	if err != nil {
		return err
	}
	if err := expect(m, idemkv.Mismatch, "different body"); err != nil {
		return err
	}
	if m.Record.Result.Status != 0 || m.Record.Result.Body != nil {
		return fmt.Errorf("the mismatch answer carries the stored result %d %s", m.Record.Result.Status, m.Record.Result.Body)
	}
	d.say("store", "Mismatch: 422 Unprocessable; nothing runs, and the answer shows nothing of the stored response")
	d.say("why", "a key names one request; replaying %s for %s would hide the client's bug", payID(res), usd(50000))
	rec, err := d.e.Get(ctx, d.id(key))
	if err != nil {
		return err
	}
	if rec.State != idemkv.StateCompleted || !bytes.Equal(rec.Result.Body, res.Body) {
		return fmt.Errorf("stored outcome is now %s %s, want completed %s", rec.State, rec.Result.Body, res.Body)
	}
	d.say("store", "the stored outcome is unchanged: %d %s", rec.Result.Status, payID(rec.Result))
	return d.checkCharged(key, bal0, payID(res))
}

// 4. Effect and outcome commit together, so a crash between them and the
// response leaves both, and the retry replays.
func (d *demo) crashAfterEffect(ctx context.Context) error {
	key, body := newKey(), []byte(demoBody)
	bal0, err := d.balance()
	if err != nil {
		return err
	}
	d.say("client", "POST key %s", key)
	c, res, err := d.post(ctx, key, body)
	if err != nil {
		return err
	}
	if err := expect(c, idemkv.Acquired, "first request"); err != nil {
		return err
	}
	d.say("service", "Acquired; charges %s: effect and outcome commit in one synced batch (%s)", usd(5000), payID(res))
	d.say("crash", "the process dies before it writes the %d to the client", res.Status)
	d.say("", "(simulated by closing and reopening the engine on the same directory;")
	d.say("", "the engine's crash tests kill a real process with SIGKILL)")
	if err := d.reopen(); err != nil {
		return err
	}
	entry, err := d.e.GetData(ledgerKey(key))
	if err != nil {
		return fmt.Errorf("after reopening, the ledger entry: %w", err)
	}
	rec, err := d.e.Get(ctx, d.id(key))
	if err != nil {
		return fmt.Errorf("after reopening, the record: %w", err)
	}
	if rec.State != idemkv.StateCompleted || !bytes.Contains(entry, []byte(payID(res))) {
		return fmt.Errorf("after reopening: record %s, ledger entry %s; want completed and %s", rec.State, entry, payID(res))
	}
	d.say("restart", "reopened: the ledger entry and the completed record are both there")
	r, rres, err := d.post(ctx, d.retryKey(key), body)
	if err != nil {
		return err
	}
	if err := expect(r, idemkv.Replay, "retry after the crash"); err != nil {
		return err
	}
	if !bytes.Equal(rres.Body, res.Body) {
		return fmt.Errorf("replayed %s, the unsent response was %s", rres.Body, res.Body)
	}
	d.say("client", "retries: Replay, %d %s", rres.Status, payID(rres))
	d.say("why", "the charge and its answer are never apart, so there is no charge the retry could repeat")
	return d.checkCharged(key, bal0, payID(res))
}

// 5. After a lease expires, a takeover fences the stalled holder: its late
// completion and its effects are refused together.
func (d *demo) staleHolderFenced(ctx context.Context) error {
	key, body := newKey(), []byte(demoBody)
	bal0, err := d.balance()
	if err != nil {
		return err
	}
	a, err := d.claim(ctx, key, body, idemkv.ModeLocal)
	if err != nil {
		return err
	}
	if err := expect(a, idemkv.Acquired, "worker A's claim"); err != nil {
		return err
	}
	d.say("worker A", "claims key %s (token %d, lease %v), then stalls", key, a.Lease.Token, demoLease)
	d.clock.Advance(demoLease + time.Second)
	d.say("clock", "advanced %v: A's lease has run out, though A may still be alive", demoLease+time.Second)
	b, err := d.claim(ctx, d.retryKey(key), body, idemkv.ModeLocal)
	if err != nil {
		return err
	}
	if err := expect(b, idemkv.Acquired, "worker B's claim"); err != nil {
		return err
	}
	if !b.Lease.Takeover() || b.Lease.Token <= a.Lease.Token {
		return fmt.Errorf("worker B's lease: attempt %d, token %d; want a takeover with a token above %d", b.Lease.Attempt, b.Lease.Token, a.Lease.Token)
	}
	d.say("worker B", "handles the client's retry: Acquired, a takeover (attempt %d, token %d)", b.Lease.Attempt, b.Lease.Token)
	_, bres, err := d.charge(ctx, b.Lease, body)
	if err != nil {
		return err
	}
	d.say("worker B", "charges %s and completes: %d %s", usd(5000), bres.Status, payID(bres))
	aPay, _, err := d.charge(ctx, a.Lease, body)
	if !errors.Is(err, idemkv.ErrFenced) {
		return fmt.Errorf("worker A's late completion returned %v, want ErrFenced", err)
	}
	d.say("worker A", "wakes up and completes its own charge %s: ErrFenced", aPay)
	d.say("why", "A's token is no longer current; its ledger write and outcome were one batch, refused whole")
	r, rres, err := d.post(ctx, d.retryKey(key), body)
	if err != nil {
		return err
	}
	if err := expect(r, idemkv.Replay, "retry"); err != nil {
		return err
	}
	if !bytes.Equal(rres.Body, bres.Body) {
		return fmt.Errorf("retry replayed %s, want worker B's %s", rres.Body, bres.Body)
	}
	d.say("client", "retries: Replay of B's %s", payID(rres))
	return d.checkCharged(key, bal0, payID(bres))
}

// 6. A remote call that times out stays uncertain, is never re-run, and is
// settled by a reconciler that asks the provider.
func (d *demo) providerTimeout(ctx context.Context) error {
	key, body := newKey(), []byte(demoBody)
	bal0, err := d.balance()
	if err != nil {
		return err
	}
	calls0 := d.provider.callCount()
	d.say("client", "POST key %s; the card is charged by an outside provider", key)
	c, err := d.claim(ctx, key, body, idemkv.ModeRemote)
	if err != nil {
		return err
	}
	if err := expect(c, idemkv.Acquired, "first request"); err != nil {
		return err
	}
	opID := c.Lease.OperationID.String()
	d.say("store", "Acquired (remote): the claim is on disk before Claim returns")
	d.say("service", "calls the provider with Idempotency-Key %s (the OperationID)", opID)
	d.provider.charge(opID) // the charge lands; its reply does not
	d.say("provider", "charges the card %s, but the reply times out", usd(5000))
	if err := d.e.MarkUncertain(ctx, c.Lease, "provider call timed out"); err != nil {
		return err
	}
	d.say("service", "MarkUncertain: freeing the key could charge twice, and caching an error would be wrong")

	retry := func(what string) error {
		r, err := d.claim(ctx, d.retryKey(key), body, idemkv.ModeRemote)
		if err != nil {
			return err
		}
		if err := expect(r, idemkv.Reconciling, what); err != nil {
			return err
		}
		if r.Record.OperationID != c.Lease.OperationID {
			return fmt.Errorf("%s: operation id changed to %s", what, r.Record.OperationID)
		}
		return nil
	}
	if err := retry("retry"); err != nil {
		return err
	}
	d.say("client", "retries: Reconciling; the service does not call the provider again")
	d.clock.Advance(demoLease + time.Second)
	if err := retry("retry after the lease"); err != nil {
		return err
	}
	d.say("clock", "advanced %v, past the lease; retry: still Reconciling", demoLease+time.Second)
	if err := d.reopen(); err != nil {
		return err
	}
	if err := retry("retry after reopening"); err != nil {
		return err
	}
	d.say("restart", "engine reopened; retry: still Reconciling")
	d.say("why", "a timeout proves nothing either way; only the provider knows, so nothing re-runs blind")

	rec, err := d.e.Get(ctx, d.id(key))
	if err != nil {
		return err
	}
	if rec.State != idemkv.StateUncertain {
		return fmt.Errorf("record is %s, want uncertain", rec.State)
	}
	charge, ok := d.provider.lookup(opID)
	if !ok {
		return fmt.Errorf("the provider has no charge for %s", opID)
	}
	d.say("reconciler", "finds the record uncertain (%q) and asks the provider", rec.Note)
	d.say("provider", "%s was charged: %s", opID, charge)
	pay := "pay_" + opID[:8]
	res := idemkv.Result{Status: 201, Pointer: "/v1/payments/" + pay, Body: responseBody(pay, 5000, "USD")}
	if err := d.e.Resolve(ctx, idemkv.ResolveRequest{ID: d.id(key), Token: rec.Token, Result: res}); err != nil {
		return err
	}
	d.say("reconciler", "Resolve (token %d) stores %d %s as the outcome", rec.Token, res.Status, pay)
	r, err := d.claim(ctx, d.retryKey(key), body, idemkv.ModeRemote)
	if err != nil {
		return err
	}
	if err := expect(r, idemkv.Replay, "retry after Resolve"); err != nil {
		return err
	}
	if !bytes.Equal(r.Record.Result.Body, res.Body) {
		return fmt.Errorf("retry replayed %s, want %s", r.Record.Result.Body, res.Body)
	}
	d.say("client", "retries: Replay, %d %s", r.Record.Result.Status, r.Record.Result.Body)

	calls := d.provider.callCount() - calls0
	bal, err := d.balance()
	if err != nil {
		return err
	}
	if calls != 1 || bal != bal0 {
		return fmt.Errorf("the provider was called %d times and the local balance moved by %s; want 1 call and no local change", calls, usd(bal.Amount-bal0.Amount))
	}
	d.say("check", "the provider was called once and holds one charge for the operation: ok")
	return nil
}

// books prints the run's counters and the store's census and, if the
// scenarios passed, checks that the run left exactly its six completed
// records and nothing in progress or uncertain.
func (d *demo) books(ctx context.Context, before engine.Census, check bool) error {
	if err := d.ensureOpen(); err != nil {
		return err
	}
	after, err := d.e.Census(ctx)
	if err != nil {
		return err
	}
	opens := d.opens
	if err := d.close(); err != nil {
		return err
	}
	st := d.stats
	d.say("stats", "%d claims over %d engine opens: %d acquired (%d by takeover), %d replays,", st.Claims, opens, st.Acquired, st.Takeovers, st.Replays)
	d.say("", "%d in progress, %d mismatch, %d reconciling; %d completed, %d uncertain, %d resolved, %d fenced",
		st.InProgress, st.Mismatches, st.Reconciling, st.Completed, st.Uncertain, st.Resolved, st.Fenced)
	added := after.Completed + after.Expired - before.Completed - before.Expired
	d.say("census", "this run added %d completed records; in progress %d, uncertain %d (store total: %d completed)",
		added, after.InProgress-before.InProgress, after.Uncertain-before.Uncertain, after.Completed)
	if !check {
		return nil
	}
	switch {
	case added != len(scenarios) || after.InProgress != before.InProgress || after.Uncertain != before.Uncertain:
		return fmt.Errorf("census: the run should add %d completed records and leave nothing in progress or uncertain", len(scenarios))
	case st.Takeovers != 1 || st.Fenced != 1:
		return fmt.Errorf("counters: %d takeovers and %d fenced operations, want 1 and 1", st.Takeovers, st.Fenced)
	case st.Completed+st.Resolved != int64(len(scenarios)):
		return fmt.Errorf("counters: %d completed and %d resolved, want %d outcomes in all", st.Completed, st.Resolved, len(scenarios))
	}
	d.say("why", "one outcome per logical request, and nothing left hanging")
	return nil
}

// The payment service.

func (d *demo) id(key string) idemkv.ID {
	return idemkv.ID{Tenant: demoTenant, Endpoint: demoEndpoint, Key: key}
}

// retryKey is the key the client sends when it retries a request made with
// key: the same one, unless the client is faulty.
func (d *demo) retryKey(key string) string {
	if d.fault == faultNewKeyOnRetry {
		return newKey()
	}
	return key
}

func (d *demo) claim(ctx context.Context, key string, body []byte, mode idemkv.Mode) (idemkv.Claim, error) {
	fp, err := fingerprint(demoTenant, demoEndpoint, body)
	if err != nil {
		return idemkv.Claim{}, err
	}
	return d.e.Claim(ctx, idemkv.ClaimRequest{ID: d.id(key), Fingerprint: fp, Mode: mode})
}

// post is the service's handler for POST /v1/payments with a local effect:
// claim the key, and run the charge if the claim was acquired. It returns
// the claim and the response: the new one, or the stored one on Replay.
func (d *demo) post(ctx context.Context, key string, body []byte) (idemkv.Claim, idemkv.Result, error) {
	c, err := d.claim(ctx, key, body, idemkv.ModeLocal)
	if err != nil {
		return c, idemkv.Result{}, err
	}
	switch c.Outcome {
	case idemkv.Acquired:
		_, res, err := d.charge(ctx, c.Lease, body)
		return c, res, err
	case idemkv.Replay:
		return c, c.Record.Result, nil
	}
	return c, idemkv.Result{}, nil
}

// charge is the business operation: it writes the ledger entry and the new
// balance, and completes the claim with a 201 response, in one atomic
// commit. Each run makes a new payment id, so a second run of one request
// would be visible. It returns that id even when Complete fails.
func (d *demo) charge(ctx context.Context, l idemkv.Lease, body []byte) (string, idemkv.Result, error) {
	var p struct {
		Amount   int    `json:"amount"`
		Currency string `json:"currency"`
		Card     string `json:"card"`
	}
	if err := json.Unmarshal(body, &p); err != nil {
		return "", idemkv.Result{}, fmt.Errorf("request body: %w", err)
	}
	pay := "pay_" + randHex(4)
	res := idemkv.Result{Status: 201, Pointer: "/v1/payments/" + pay, Body: responseBody(pay, p.Amount, p.Currency)}
	entry, err := json.Marshal(map[string]any{
		"payment": pay, "key": l.ID.Key, "amount": p.Amount, "currency": p.Currency, "card": p.Card,
	})
	if err != nil {
		return pay, res, err
	}

	d.ledgerMu.Lock()
	defer d.ledgerMu.Unlock()
	bal, err := d.balance()
	if err != nil {
		return pay, res, err
	}
	bal.Amount += p.Amount
	bal.Charges++
	newBal, err := json.Marshal(bal)
	if err != nil {
		return pay, res, err
	}
	err = d.e.Complete(ctx, l, res, func(w idemkv.Effects) error {
		if err := w.Set(ledgerKey(l.ID.Key), entry); err != nil {
			return err
		}
		return w.Set(balanceKey, newBal)
	})
	return pay, res, err
}

// balance is the account's running total, as stored through Effects.
type balance struct {
	Amount  int `json:"balance"`
	Charges int `json:"charges"`
}

func (d *demo) balance() (balance, error) {
	var b balance
	v, err := d.e.GetData(balanceKey)
	if errors.Is(err, idemkv.ErrNotFound) {
		return b, nil
	}
	if err != nil {
		return b, err
	}
	return b, json.Unmarshal(v, &b)
}

// checkCharged verifies, by reading the effects back, that the request
// with key charged the card exactly once since bal0, as payment pay.
func (d *demo) checkCharged(key string, bal0 balance, pay string) error {
	bal, err := d.balance()
	if err != nil {
		return err
	}
	entry, err := d.e.GetData(ledgerKey(key))
	if err != nil {
		return fmt.Errorf("ledger entry: %w", err)
	}
	var e struct {
		Payment string `json:"payment"`
	}
	if err := json.Unmarshal(entry, &e); err != nil {
		return fmt.Errorf("ledger entry: %w", err)
	}
	charges, amount := bal.Charges-bal0.Charges, bal.Amount-bal0.Amount
	if charges != 1 || amount != 5000 || e.Payment != pay {
		return fmt.Errorf("the card was charged %d times (%s), ledger shows %s; want once (%s) as %s",
			charges, usd(amount), e.Payment, usd(5000), pay)
	}
	d.say("check", "ledger payments/%s... holds %s; balance +%s, %d charge: ok", key[:8], pay, usd(amount), charges)
	return nil
}

func ledgerKey(key string) []byte { return []byte("payments/" + key) }

func responseBody(pay string, amount int, currency string) []byte {
	b, _ := json.Marshal(struct {
		ID       string `json:"id"`
		Amount   int    `json:"amount"`
		Currency string `json:"currency"`
		Status   string `json:"status"`
	}{pay, amount, currency, "succeeded"})
	return b
}

// payID returns the payment id a response points at.
func payID(r idemkv.Result) string {
	return strings.TrimPrefix(r.Pointer, "/v1/payments/")
}

func expect(c idemkv.Claim, want idemkv.Outcome, what string) error {
	if c.Outcome != want {
		return fmt.Errorf("%s: the store answered %s, want %s", what, c.Outcome, want)
	}
	return nil
}

// provider is a simulated card provider. Like real ones, it deduplicates
// on the idempotency key it is sent, and it can be asked what happened to
// one.
type provider struct {
	mu      sync.Mutex
	calls   int
	charges map[string]string // idempotency key → charge id
}

func (p *provider) charge(key string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	if ch, ok := p.charges[key]; ok {
		return ch
	}
	ch := "ch_" + randHex(4)
	p.charges[key] = ch
	return ch
}

func (p *provider) lookup(key string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ch, ok := p.charges[key]
	return ch, ok
}

func (p *provider) callCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls
}

// fingerprint binds a key to its request, with package fingerprint: the
// tenant, the method and route of the endpoint, and the body in canonical
// JSON, so that a retry whose JSON is spelled differently still matches.
func fingerprint(tenant, endpoint string, body []byte) ([]byte, error) {
	method, route, _ := strings.Cut(endpoint, " ")
	fp, err := fprint.Compute(fprint.Request{Tenant: tenant, Method: method, Route: route, Body: body}, nil)
	if err != nil {
		return nil, err
	}
	return fp.Bytes, nil
}

// newKey returns a random UUID (version 4), as a client would make one per
// user intent.
func newKey() string {
	var u [16]byte
	if _, err := rand.Read(u[:]); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	h := hex.EncodeToString(u[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

func randHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// addCounters adds src's operation counters to dst.
func addCounters(dst *engine.Stats, src engine.Stats) {
	dst.Claims += src.Claims
	dst.Acquired += src.Acquired
	dst.Takeovers += src.Takeovers
	dst.Replays += src.Replays
	dst.InProgress += src.InProgress
	dst.Mismatches += src.Mismatches
	dst.Reconciling += src.Reconciling
	dst.Completed += src.Completed
	dst.Released += src.Released
	dst.Uncertain += src.Uncertain
	dst.Renewed += src.Renewed
	dst.Resolved += src.Resolved
	dst.Fenced += src.Fenced
}

func usd(cents int) string {
	sign := ""
	if cents < 0 {
		sign, cents = "-", -cents
	}
	return fmt.Sprintf("%s$%d.%02d", sign, cents/100, cents%100)
}
