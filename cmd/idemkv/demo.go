package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/examples/payments"
	"github.com/idemkv/idemkv/httpidem"
	"github.com/idemkv/idemkv/internal/fakeclock"
)

func init() {
	register(&command{
		name:    "demo",
		args:    "[--data DIR]",
		summary: "play the idempotency guide's failure modes over HTTP against the payments service and check each outcome",
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

// The request every scenario sends, and the store's lease.
const (
	demoEndpoint = "POST /v1/payments"
	demoBody     = `{"amount":5000,"currency":"USD","card":"tok_123"}`
	demoAmount   = 5000
	demoLease    = 30 * time.Second
)

// A scenario plays one failure mode and returns an error if the service
// did not behave as the guide requires.
type scenario struct {
	title string
	run   func(d *demo, ctx context.Context) error
}

var scenarios = []scenario{
	{"Lost response, then retry", (*demo).lostResponse},
	{"Eight duplicates at once", (*demo).concurrentDuplicates},
	{"Same key, different body", (*demo).sameKeyDifferentBody},
	{"Crash after the effect, before the response", (*demo).crashAfterEffect},
	{"Lease expiry: a stalled request is fenced off", (*demo).staleHolderFenced},
	{"Processor timeout: uncertain, never charged twice, then reconciled", (*demo).providerTimeout},
	{"The client's half: a library that keys and retries", (*demo).clientLibrary},
	{"Order saga: the authorization times out, and is reconciled", (*demo).sagaTimeout},
	{"Order saga: a declined card releases the reservation", (*demo).sagaDeclined},
	{"Events: a relay's republish and a consumer's redelivery, absorbed", (*demo).eventsAbsorbed},
}

// sagaScenarios are the scenarios at the end of the list that run the
// order saga rather than the payments service; sagaCharges the charges
// they make.
const (
	sagaScenarios = 2
	sagaCharges   = 1
)

// demo is one run: the payments service of examples/payments on an engine
// in a directory, served on a loopback port, the one simulated card
// processor behind it, and the client that plays the scenarios.
type demo struct {
	out   io.Writer
	dir   string
	fault string
	run   string // this run's id, in its account names
	clock *fakeclock.Clock
	opts  engine.Options

	// The server side. The processor stands for a remote system: it
	// outlives restarts of the service.
	proc   *payments.Provider
	script script
	srv    *http.Server
	svc    atomic.Pointer[payments.Service] // the service running now
	e      *engine.Engine                   // its store; nil while closed
	opens  int
	// stats sums the operation counters of engines already closed, since
	// each Open starts its counters from zero.
	stats engine.Stats
	// lose makes the network lose the next response; lost receives it.
	lose atomic.Bool
	lost chan reply

	// The client side.
	url     string
	client  *http.Client
	account string // the account the client pays from: one per scenario
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
	d, err := startDemo(dir, cfg)
	if err != nil {
		return err
	}
	defer d.stop()
	before, err := d.e.Census(ctx)
	if err != nil {
		return err
	}

	fmt.Fprintf(d.out, "idemkv demo: the idempotency guide's failure modes, played over HTTP against the\n")
	fmt.Fprintf(d.out, "payments service of examples/payments on a real store.\n")
	d.say("store", "%s %s; %v leases on a fake clock that moves only when told", dir, where, demoLease)
	d.say("service", "%s: %s protected by httpidem, one simulated card processor behind it", d.url, demoEndpoint)
	d.say("client", "each scenario pays from a new account (acct_%s_N) with new UUID keys", d.run)

	var failed, failedNums []string // one line per failed scenario or check
	for i, sc := range scenarios {
		if err := ctx.Err(); err != nil {
			return err
		}
		fmt.Fprintf(d.out, "\n%d. %s\n", i+1, sc.title)
		d.account = d.accountOf(i + 1)
		d.script.arm(nil)
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
	return d.verdict(failed, failedNums)
}

// verdict prints the run's last line and returns its error, if any.
func (d *demo) verdict(failed, failedNums []string) error {
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

// retryKey is the key the client sends when it retries a request made with
// key: the same one, unless the client is faulty.
func (d *demo) retryKey(key string) string {
	if d.fault == faultNewKeyOnRetry {
		return newKey()
	}
	return key
}

func (d *demo) accountOf(scenario int) string { return fmt.Sprintf("acct_%s_%d", d.run, scenario) }

func (d *demo) id(key string) idemkv.ID {
	return idemkv.ID{Tenant: d.account, Endpoint: demoEndpoint, Key: key}
}

// created checks that r is a 201 carrying a payment, a replay or not as
// replayed says, and returns the payment.
func created(r reply, replayed bool, what string) (payments.Payment, error) {
	var p payments.Payment
	was := r.header.Get(httpidem.HeaderReplayed) == "true"
	switch {
	case r.err != nil:
		return p, fmt.Errorf("%s: %w", what, r.err)
	case r.status != http.StatusCreated:
		return p, fmt.Errorf("%s: %d %s, want 201", what, r.status, bytes.TrimSpace(r.body))
	case was != replayed:
		return p, fmt.Errorf("%s: replayed %v, want %v", what, was, replayed)
	}
	if err := json.Unmarshal(r.body, &p); err != nil {
		return p, fmt.Errorf("%s: %w", what, err)
	}
	return p, nil
}

// problem checks that r is the problem kind (httpidem.ProblemBase+kind)
// with status, and returns it.
func problem(r reply, status int, kind, what string) (httpidem.Problem, error) {
	var p httpidem.Problem
	if r.err != nil {
		return p, fmt.Errorf("%s: %w", what, r.err)
	}
	if err := json.Unmarshal(r.body, &p); err != nil || r.status != status || p.Type != httpidem.ProblemBase+kind {
		return p, fmt.Errorf("%s: %d %s, want %d %s", what, r.status, bytes.TrimSpace(r.body), status, kind)
	}
	return p, nil
}

// checkCharged checks what every scenario that pays must end with: the
// record of key is completed; the processor made one charge since p0, the
// one under the record's OperationID; and the account holds one payment,
// want, naming that charge.
func (d *demo) checkCharged(ctx context.Context, key string, p0 payments.ProviderStats, want payments.Payment) error {
	rec, err := d.e.Get(ctx, d.id(key))
	if err != nil {
		return fmt.Errorf("the record: %w", err)
	}
	list, err := d.listPayments(ctx)
	if err != nil {
		return err
	}
	ch, ok, _ := d.proc.Lookup(context.Background(), rec.OperationID.StepKey("charge"))
	charges := d.proc.Stats().Charges - p0.Charges
	switch {
	case rec.State != idemkv.StateCompleted:
		return fmt.Errorf("the record is %s, want completed", rec.State)
	case charges != 1 || len(list) != 1:
		return fmt.Errorf("the card was charged %d times and the account has %d payments; want once, and one", charges, len(list))
	case !ok || list[0].Charge != ch.ID || list[0].ID != want.ID:
		return fmt.Errorf("the account's payment is %s of charge %s; want %s of the charge under the operation id, %s",
			list[0].ID, list[0].Charge, want.ID, ch.ID)
	}
	d.say("check", "one charge (%s, %s) under the operation id, one payment (%s) naming it: ok", ch.ID, usd(ch.Amount), want.ID)
	return nil
}

// books prints the run's totals and, if the scenarios passed, checks them:
// one charge per logical request, one payment per charge the service
// learnt of, one completed record per payment and the one uncertain record
// of the timeout, nothing in progress, and engine.Check finds no problem.
func (d *demo) books(ctx context.Context, before engine.Census, check bool) error {
	if err := d.ensureOpen(); err != nil {
		return err
	}
	after, err := d.e.Census(ctx)
	if err != nil {
		return err
	}
	rep, err := d.e.Check(ctx)
	if err != nil {
		return err
	}
	paid, charges := 0, map[string]bool{} // the payments, and the charges they name
	for i := range scenarios {
		d.account = d.accountOf(i + 1)
		list, err := d.listPayments(ctx)
		if err != nil {
			return err
		}
		for _, p := range list {
			paid++
			charges[p.Charge] = true
		}
	}
	opens := d.opens
	if err := d.close(); err != nil {
		return err
	}
	st, p := d.stats, d.proc.Stats()
	completed := after.Completed + after.Expired - before.Completed - before.Expired
	uncertain, inProgress := after.Uncertain-before.Uncertain, after.InProgress-before.InProgress
	d.say("processor", "%d calls, %d charges, %d deduplicated (answered with the charge made under its key)", p.Calls, p.Charges, p.Dedups)
	d.say("payments", "%d, naming %d distinct charges", paid, len(charges))
	d.say("stats", "%d claims over %d engine opens: %d acquired (%d by takeover), %d replays, %d in progress,",
		st.Claims, opens, st.Acquired, st.Takeovers, st.Replays, st.InProgress)
	d.say("", "%d mismatch, %d reconciling; then %d completed, %d marked uncertain, %d fenced",
		st.Mismatches, st.Reconciling, st.Completed, st.Uncertain, st.Fenced)
	d.say("census", "this run added %d completed records and %d uncertain, %d in progress (store total: %d completed)",
		completed, uncertain, inProgress, after.Completed)
	d.say("check", "engine.Check: %d records, %d effects, %d problems", rep.Records, rep.Effects, rep.ProblemCount)
	if !check {
		return nil
	}
	n := len(scenarios) - sagaScenarios // one payment each
	switch {
	case rep.ProblemCount != 0:
		return fmt.Errorf("engine.Check: %v", rep.Problems)
	case p.Charges != n+sagaCharges || paid != n || len(charges) != paid:
		return fmt.Errorf("%d charges and %d payments naming %d of them; want %d, and %d naming one each (and the order's authorization)",
			p.Charges, paid, len(charges), n+sagaCharges, n)
	case completed < n || uncertain != 0 || inProgress != 0:
		return fmt.Errorf("census: the run should add at least %d completed records, and nothing uncertain or in progress", n)
	case st.Takeovers < 1 || st.Fenced < 1:
		return fmt.Errorf("counters: %d takeovers and %d fenced operations, want at least 1 and 1", st.Takeovers, st.Fenced)
	}
	d.say("why", "one charge per request; nothing left uncertain or in progress")
	return nil
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
	dst.Uncertain += src.Uncertain
	dst.Fenced += src.Fenced
}

func usd(cents int64) string {
	return fmt.Sprintf("$%d.%02d", cents/100, cents%100)
}
