package sim

import (
	"encoding/json"
	"fmt"
	"time"
)

// The payments world: clients paying through the payments service
// (examples/payments, the real handler and its reconciler) on a real
// store, a card processor behind a network that delays, loses and
// reorders, processes that crash and stall, and an operator who settles
// escalated payments and evicts completed ones.
//
// Invariants, checked as the run goes and at its end:
//   - one charge per logical payment, whatever happened to its attempts
//     (checked at every charge the processor makes);
//   - every stored outcome a client was given replays byte for byte
//     while its record lives (checked at every answer);
//   - an account never gets charged past its limit (at every charge,
//     where the configuration is one the reconciler is safe in: its
//     grace above the longest flight and pause);
//   - nothing stays unsettled past the reconciler's limit without being
//     escalated (checked every minute);
//   - at the end, once everything has settled: every charge has its
//     payment row and every row its charge, and the account's spent
//     total is the sum of its payments (no hold left behind).

// params are one run's settings, drawn from its seed.
type params struct {
	lease, grace, interval       time.Duration
	processorTimeout             time.Duration
	clientTimeout, clientBackoff time.Duration
	clientSpread                 time.Duration
	clientAttempts               int
	maxBackoff, maxAge           time.Duration
	maxAttempts                  int
	retention                    time.Duration
	limit                        int64

	toDown, fromDown, toServer, toClient Link

	unavailable, declines float64
	// inproc: the service charges the simulated processor in its own
	// process (serve without --processor), whose calls time out after
	// charging at inprocTimeouts.
	inproc         bool
	inprocTimeouts float64
	// applyPanics is the share of the reconciler's answers whose writes
	// panic (a bug in the application).
	applyPanics         float64
	duplicates, replays float64
	lateResends         float64
	pauseBeforeSend     float64
	// stallBeforeSend is the share of charges whose request alone
	// stalls before the send (its goroutine waits for a connection or a
	// name lookup) while the rest of its process runs on: its heartbeats,
	// a retry that takes its lease over, the reconciler.
	stallBeforeSend float64
	pauseMax        time.Duration
	// crashAfterSend is the share of charges whose process crashes right
	// after sending them: the restarted process, a retry and the
	// reconciler then meet a charge whose outcome nobody heard.
	crashAfterSend float64
	// takeoverStorm: the world was made one of takeovers (params.takeovers).
	takeoverStorm bool

	// heartbeat: a running payment renews its lease (the default);
	// without it, a payment slower than its lease is taken over by a
	// retry while it still runs.
	heartbeat bool

	crashes  int
	downMax  time.Duration
	freezes  int
	evicts   int
	tenants  int
	clients  int
	payments int

	// deadlines: the processor refuses a charge that lands after the
	// deadline it carries (payments.ChargeRequest.Deadline), by its own
	// clock, which lags the services' by lag (ahead, if negative).
	deadlines bool
	lag       time.Duration
	// storeAhead: the engine's store was last closed on a host whose
	// clock ran this far ahead, so the engine keeps its time ahead of its
	// host's by as much (an idemkv.OffsetClock), and so of the
	// processor's. The reconciler waits that much longer; its grace needs
	// no margin for it. The engine's worlds only.
	storeAhead time.Duration

	// safe: the reconciler's "not applied" is true and the account limit
	// holds, because its grace exceeds the processor timeout and the
	// processor's lag (where the processor refuses late calls), or the
	// longest flight of a charge and the longest pause of a process
	// (where it does not). Otherwise only the identity protects the
	// payments, and the account-limit checks are off.
	safe bool
}

func (prm params) String() string {
	b, _ := json.Marshal(map[string]any{
		"lease": prm.lease.String(), "grace": prm.grace.String(), "interval": prm.interval.String(),
		"processor_timeout": prm.processorTimeout.String(), "client_timeout": prm.clientTimeout.String(),
		"flight_max": prm.toDown.Max.String(), "loss": prm.toDown.Loss, "pause_max": prm.pauseMax.String(),
		"crashes": prm.crashes, "freezes": prm.freezes, "evicts": prm.evicts, "clients": prm.clients,
		"payments": prm.payments, "limit": prm.limit, "safe": prm.safe, "heartbeat": prm.heartbeat,
		"inproc": prm.inproc, "apply_panics": prm.applyPanics, "stall_before_send": prm.stallBeforeSend,
		"crash_after_send": prm.crashAfterSend, "takeovers": prm.takeoverStorm,
		"deadlines": prm.deadlines, "lag": prm.lag.String(), "store_ahead": prm.storeAhead.String(),
	})
	return string(b)
}

func pick[T any](w *World, xs ...T) T { return xs[w.Rand().IntN(len(xs))] }

// drawParams draws a run's settings.
func drawParams(w *World) params {
	var prm params
	ms := time.Millisecond
	prm.lease = pick(w, time.Second, 2*time.Second, 5*time.Second)
	prm.interval = pick(w, time.Second, 2*time.Second, 5*time.Second)
	prm.processorTimeout = pick(w, 500*ms, time.Second, 2500*ms)
	prm.clientTimeout = pick(w, time.Second, 1500*ms, 3*time.Second, 10*time.Second)
	prm.clientBackoff = pick(w, 500*ms, time.Second, 2*time.Second)
	prm.clientSpread = pick(w, 5*time.Second, 30*time.Second)
	// Some clients give up early (the customer closes the app): what
	// their payments left must then be settled without them.
	prm.clientAttempts = pick(w, 1, 3, 12)
	prm.maxBackoff = 10 * time.Second
	prm.maxAttempts = pick(w, 3, 6)
	prm.maxAge = pick(w, time.Minute, 2*time.Minute)
	prm.retention = 2 * time.Minute
	flight := pick(w, 50*ms, 500*ms, 2800*ms)
	loss := pick(w, 0.0, 0.05, 0.2)
	prm.toDown = Link{Min: ms, Max: flight, Slow: 0.3, Loss: loss}
	prm.fromDown = Link{Min: ms, Max: flight, Slow: 0.3, Loss: loss}
	prm.toServer = Link{Min: ms, Max: pick(w, 10*ms, 300*ms), Slow: 0.2, Loss: loss / 2}
	prm.toClient = prm.toServer
	prm.unavailable = pick(w, 0.0, 0.1, 0.3)
	prm.declines = pick(w, 0.0, 0.05)
	prm.inproc = w.Rand().IntN(4) == 0
	prm.inprocTimeouts = pick(w, 0.1, 0.3)
	prm.applyPanics = pick(w, 0.0, 0.0, 0.2)
	prm.duplicates = pick(w, 0.0, 0.2, 0.5)
	prm.replays = 0.5
	prm.lateResends = pick(w, 0.0, 0.3)
	prm.pauseBeforeSend = pick(w, 0.0, 0.0, 0.1)
	prm.pauseMax = pick(w, 500*ms, 3*time.Second, 8*time.Second)
	prm.crashes = pick(w, 0, 1, 3)
	prm.downMax = pick(w, time.Second, 20*time.Second)
	prm.freezes = pick(w, 0, 2)
	prm.evicts = pick(w, 0, 0, 2)
	prm.tenants = pick(w, 1, 1, 2)
	prm.clients = pick(w, 2, 4, 6)
	prm.payments = pick(w, 1, 3)
	prm.limit = pick(w, int64(0), 5000, 10000, 30000)
	prm.heartbeat = pick(w, true, true, false)
	prm.stallBeforeSend = pick(w, 0.0, 0.1, 0.3)
	prm.crashAfterSend = pick(w, 0.0, 0.0, 0.1)
	if w.Rand().IntN(4) == 0 {
		prm.takeovers()
	}
	// Most processors refuse a call that lands after its deadline: no
	// pause then lasts too long, and pauses past any lease and grace are
	// drawn too.
	prm.deadlines = w.Rand().IntN(4) != 0
	// Ahead, the processor's clock stays within the shortest call window
	// (500 ms), or it would refuse every call and the world charge
	// nothing.
	prm.lag = pick(w, 0, 0, 300*ms, 2*time.Second, -200*ms)
	prm.storeAhead = pick(w, 0, 0, 0, 3*time.Second, 20*time.Second)
	// A correct deployment's grace exceeds the processor timeout and the
	// processor's lag, where it refuses late calls, and the longest flight
	// and pause where it does not; a quarter of the runs are not
	// correct, on purpose.
	need := prm.toDown.Max + prm.pauseMax
	if prm.deadlines {
		prm.pauseMax = pick(w, prm.pauseMax, 30*time.Second)
		need = prm.processorTimeout + max(prm.lag, 0)
	}
	if w.Rand().Float64() < 0.75 {
		prm.safe = true
		prm.grace = need + pick(w, 100*ms, time.Second)
	} else {
		prm.grace = pick(w, 100*ms, need/2)
	}
	return prm
}

// takeovers turns a world into one where attempts that are still alive
// lose their leases to retries: no heartbeats, one-second leases,
// requests that stall past them, duplicates racing them, and clients
// patient enough to hear how the first attempt ended. Another process
// taking over after a pause makes such schedules common in a fleet's
// worlds; this makes them common within one process too (the engine's
// worlds), where a drawn world reaches them too seldom.
func (prm *params) takeovers() {
	prm.takeoverStorm = true
	prm.heartbeat = false
	prm.lease = time.Second
	prm.stallBeforeSend = 0.3
	prm.duplicates = 0.5
	prm.clientTimeout = 10 * time.Second
	prm.pauseMax = max(prm.pauseMax, 3*time.Second)
	// Every kind of answer reaches an attempt after it lost its lease,
	// and there are holds for it to give back.
	prm.unavailable = max(prm.unavailable, 0.1)
	prm.declines = max(prm.declines, 0.05)
	if prm.limit == 0 {
		prm.limit = 10000
	}
}

// payWorld is the world of one run.
type payWorld struct {
	w        *World
	prm      params
	backend  backend
	down     *downstream
	services []*service
	clients  []*client
	pays     []*payment
	chaos    *Proc
	start    time.Time
	dir      string // for the audit logs

	// busy counts the clients still paying and the replays and late
	// resends still to come: the run ends some time after it reaches 0.
	busy int
}

func (pw *payWorld) fail(err error) { pw.w.Fail(err) }

func (pw *payWorld) pauseLength() time.Duration {
	return time.Duration(pw.w.Rand().Int64N(int64(pw.prm.pauseMax))) + time.Millisecond
}

// newPayWorld builds the world of seed on a backend made by mk.
func newPayWorld(seed uint64, dir string, mk func(pw *payWorld) (backend, error)) (*payWorld, error) {
	w := New(seed, epoch)
	pw := &payWorld{w: w, start: epoch, dir: dir}
	pw.prm = drawParams(w)
	var err error
	if pw.backend, err = mk(pw); err != nil {
		return pw, err
	}
	if pw.backend.name() != "engine" {
		pw.prm.inproc = false // serve --store requires --processor: processes cannot share one
	}
	pw.down = newDownstream(pw)
	pw.chaos = w.NewProc("chaos")
	w.Logf("params %s", pw.prm)
	for i := 0; i < pw.backend.services(); i++ {
		s := &service{pw: pw, id: i}
		if err := s.start(); err != nil {
			return pw, err
		}
		pw.services = append(pw.services, s)
	}
	amounts := []int64{1000, 2500, 5000}
	for i := 0; i < pw.prm.clients; i++ {
		c := &client{pw: pw, id: i, p: w.NewProc(fmt.Sprintf("client%d", i)),
			tenant: fmt.Sprintf("acct_%d", w.Rand().IntN(pw.prm.tenants))}
		for j := 0; j < pw.prm.payments; j++ {
			amount := pick(w, amounts...)
			body, _ := json.Marshal(map[string]any{"amount": amount, "currency": "USD", "card": "tok_visa"})
			pay := &payment{o: origin{i, j}, tenant: c.tenant, key: fmt.Sprintf("k-%d-%d-%x", i, j, w.Rand().Uint32()),
				amount: amount, body: body}
			c.pays = append(c.pays, pay)
			pw.pays = append(pw.pays, pay)
		}
		pw.clients = append(pw.clients, c)
		pw.busy++
		w.Go(c.p, c.run)
	}
	pw.scheduleChaos()
	return pw, nil
}
