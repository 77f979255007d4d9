package storetest

import (
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/tier"
)

// Linearizable is a porcupine linearizability check of a store, through
// the Store interface alone: many goroutines claim, complete, release, mark
// uncertain and abandon leases on a handful of overlapping keys while the
// harness's clock makes their leases run out, and several reconcilers
// settle, concurrently, whatever turns uncertain. Every call is recorded
// with its invocation and response instants, and the history must
// linearize against a sequential model of one idempotency record per key.
// Run runs it; a store that cannot afford the full suite may call it alone.
//
// The model (linStep) is a deterministic state machine per key:
//
//	absent                  -> held(T)       Claim acquired, with a token above every earlier one
//	held(T, mode, until)    -> held(T')      takeover: Claim acquired T' > T at store time >= until,
//	                                         by any claim if the holder is local, only by a Resumable
//	                                         remote claim (same OperationID) if the holder is remote
//	held(T, remote, until)  -> uncertain(T)  Claim answered Reconciling at store time >= until:
//	                                         a local or non-Resumable claim found the remote lease expired
//	held(T)                 -> completed(R)  Complete(T, R) ok
//	held(T)                 -> absent        Release(T) ok
//	held(T)                 -> uncertain(T)  MarkUncertain(T) ok
//	uncertain(T)            -> absent        Resolve(T, NoEffect) ok
//	uncertain(T)            -> completed(R)  Resolve(T, R) ok
//
// and every other answer is allowed only where it is the one the contract
// permits: InProgress only while held and with the holder's token, Replay
// only of exactly the completed result (and the winner's token), Reconciling
// only while uncertain, Mismatch only for another fingerprint, Acquired
// never on a completed or uncertain record; Complete, Release and
// MarkUncertain succeed if and only if the token is the holder's and are
// ErrFenced otherwise; Resolve is ErrNotFound on an absent record,
// ErrWrongState on a held or completed one, ErrFenced on an uncertain one
// with another token, and succeeds otherwise; Get returns the model's
// record. Any error the contract does not list for a call fails the run.
//
// Time is not part of the linearization, but the model does not ignore it.
// An Acquired lease tells the store's clock at the claim: its Expires less
// the lease asked for, since a lease runs from its claim. A record that a
// claim turned uncertain tells it too: its Expires less Config.Retention
// (the run uses the default class), since a record's window starts again
// when it turns uncertain, as when it completes. So a takeover or a turn to
// uncertain before the lease ran out is illegal. Each time so read must
// lie within the harness's clock readings (Harness.Now) around the call
// (for a Reconciling answer, which may report an earlier turn: not after
// the call returned), or the run fails saying which.
//
// The model is strict: each call takes effect at one instant between its
// invocation and its response, and nothing else is tolerated. In particular
// a holder may be fenced only once the change that fences it (a takeover,
// the turn of its expired remote lease to uncertain, its own earlier
// Complete, Release or MarkUncertain) has taken effect, so a reader that
// sees the record still held under that token after the fence is a
// violation. A store passes if no caller sees a change to a key before the
// change is decided and none is refused on account of a change that a later
// reader may still not see. The benchmark baseline holds a per-key lock
// across each synced write; the engine answers Claims and Gets from the
// state before a write in flight, and makes holder operations and Resolve
// wait for the write and decide on the state it left.
//
// Both modes take part. Remote claims are Resumable three times out of
// four, so remote leases are taken over (keeping their OperationID) and
// also turn uncertain. linReconcilers reconcilers run at once, each reading
// a key (Get) and resolving it if it is uncertain; they prefer the key one
// of them last found uncertain, so that two resolutions of one record race.
// The loser must be told what the state the winner left calls for:
// ErrNotFound if the winner resolved with no effect, ErrWrongState if it
// completed the record (or a claim has acquired it since), ErrFenced if the
// record has turned uncertain again under another token. Some resolutions
// deliberately use a token that is not the one just read (an earlier
// holder's, or a forged one), and a few target a record the reconciler did
// not find uncertain. Beside them runs a reconcile.Worker, the package's
// own, whose Resolve and Escalate calls are recorded too: it lists what
// awaits reconciliation (abandoned remote records included) and answers at
// random, applied, not applied or unknown, escalating after two unknowns.
//
// Completed records are final, so each of the linSlots slots retires its
// key once a client sees it settled (Replay, or Mismatch) and the slot's
// traffic moves to a fresh key: at any moment all clients fight over
// linSlots keys, and the run keeps acquiring rather than replaying. Once the
// clients are done, a last Get of every key must agree with the effects:
// a key's effect (written by each Complete) is there if and only if a
// Complete won the key, and it is the winner's.
//
// # What the check asks of a store and its harness
//
//   - Store, Now and Advance are called from many goroutines at once, and
//     Advance concurrently with the store's operations; Reopen never.
//   - The contract lets a store drop an expired local lease to bound its
//     memory (its holder is then fenced and the record absent). The model
//     has no such transition, so a store must not do it for the few
//     hundred keys a round uses.
//   - A round advances the clock by about two hours in all, and no
//     completed record may expire under the model, so Config.Retention
//     must be longer (the default, 24 h, is; the run fails otherwise).
//
// # Reproducing a failure
//
// The run logs its seed, which fixes every client's choices; set
// IDEMKV_LIN_SEED to it to repeat them. The interleaving is up to the
// scheduler, so a failure may take several runs to recur. A round whose
// history does not linearize logs the history of each key that does not, in
// invocation order, and writes porcupine's visualization of the whole
// history to a temporary HTML file whose path it logs.
//
// Linearizable runs linRounds rounds, each on a fresh store, in the system
// tier (internal/tier), and linShortRounds otherwise (the fast tier, -short
// or the race detector), too few to expect
// every transition, so the final check that the workload exercised each is
// skipped then. (The race detector makes a round several times slower, and
// a few rounds give it thousands of concurrent calls to watch; the ordinary
// run does the many rounds that find rare interleavings.)
func Linearizable(t *testing.T, newHarness NewHarness) {
	seed := linSeed(t)
	few := testing.Short() || raceEnabled || !tier.System()
	rounds := linRounds
	if few {
		rounds = linShortRounds
	}
	t.Logf("seed %d (IDEMKV_LIN_SEED=%d to reuse), %d rounds of %d clients x %d operations on %d keys",
		seed, seed, rounds, linClients, linOpsPerClient, linSlots)
	total := map[string]int{}
	for round := range rounds {
		t.Run(fmt.Sprintf("round%d", round), func(t *testing.T) {
			for k, n := range linRound(t, newHarness, seed, round) {
				total[k] += n
			}
		})
	}
	if t.Failed() {
		return
	}
	t.Logf("all rounds: %v", total)
	if few {
		return
	}
	// The workload must actually have exercised what the check is about.
	// (Each of these happens several times in a typical round.)
	for _, what := range []string{"acquired", "takeover", "remote resume", "in-progress", "replay", "mismatch",
		"reconciling (expired remote)", "complete ok", "complete fenced", "release ok", "release fenced",
		"mark-uncertain ok", "resolve ok", "resolve not found", "resolve wrong state", "resolve fenced",
		"resolve race lost", "worker resolve ok", "escalate ok"} {
		if total[what] == 0 {
			t.Errorf("no %q in %d rounds: the workload is not exercising the store", what, rounds)
		}
	}
}

const (
	linSlots        = 4  // keys in play at any moment, so that clients collide constantly
	linClients      = 16 // claimants
	linReconcilers  = 3  // reconcilers, which race to resolve the same records
	linOpsPerClient = 150
	linRounds       = 16
	linShortRounds  = 3
	// A client advances the clock by 5-15 s before one operation in
	// linAdvanceOneIn, so that 10 s and 30 s leases run out a few times per
	// round and stale holders come back after their lease was taken over.
	linAdvanceOneIn = 4
	linCheckTimeout = 15 * time.Second
)

var linLeases = [...]time.Duration{10 * time.Second, 30 * time.Second}

func linSeed(t *testing.T) uint64 {
	if s := os.Getenv("IDEMKV_LIN_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("IDEMKV_LIN_SEED: %v", err)
		}
		return seed
	}
	return uint64(time.Now().UnixNano())
}

// linRound runs one round on a fresh store, checks it, and returns what
// happened in it, counted (see linCount).
func linRound(t *testing.T, newHarness NewHarness, seed uint64, round int) map[string]int {
	began := time.Now()
	h := newHarness(t, nil)
	defer h.Close()
	r := &linRun{t: t, h: h, t0: h.Now(), retention: h.Config().Retention}
	tick := make(chan struct{}, linReconcilers+1)
	var clients, recs sync.WaitGroup
	for c := range linClients + linReconcilers + 1 {
		rng := rand.New(rand.NewPCG(seed, uint64(round)<<32|uint64(c)))
		switch {
		case c < linClients:
			clients.Go(func() { r.client(c, rng, tick) })
		case c < linClients+linReconcilers:
			recs.Go(func() { r.reconciler(c, rng, tick) })
		default:
			recs.Go(func() { r.worker(c, rng, tick) })
		}
	}
	clients.Wait()
	close(tick)
	recs.Wait()
	// A last look at every key, after all the dust has settled.
	keys := r.keys()
	final := make([]linOutput, len(keys))
	for i, key := range keys {
		final[i] = r.get(linClients, key, "final")
	}
	if r.advanced >= r.retention {
		t.Fatalf("the clock moved %v, not less than the retention %v: the model assumes no completed record expires",
			r.advanced, r.retention)
	}
	ran := time.Since(began)

	checkStart := time.Now()
	linCheck(t, r.ops, r.annotations, seed, round)
	r.checkEffects(keys, final)
	counts := linCount(r.ops)
	t.Logf("%d operations on %d keys in %v, checked in %v: %v", len(r.ops), len(keys), ran.Round(time.Millisecond),
		time.Since(checkStart).Round(time.Millisecond), counts)
	return counts
}

// linCheck checks a round's history with porcupine. If it does not
// linearize, it logs the keys that do not and writes a visualization.
func linCheck(t *testing.T, ops []porcupine.Operation, annotations []porcupine.Annotation, seed uint64, round int) {
	model := linModel(linPrinterFor(ops))
	res, info := porcupine.CheckOperationsVerbose(model, ops, linCheckTimeout)
	if res == porcupine.Ok {
		return
	}
	info.AddAnnotations(annotations)
	if f, err := os.CreateTemp("", fmt.Sprintf("idemkv-linearizability-seed%d-round%d-*.html", seed, round)); err != nil {
		t.Logf("cannot write the visualization: %v", err)
	} else {
		path := f.Name()
		_ = f.Close()
		if err := porcupine.VisualizePath(model, info, path); err != nil {
			t.Logf("cannot write the visualization: %v", err)
		} else {
			t.Logf("visualization of the history: %s", path)
		}
	}
	if res == porcupine.Illegal {
		linLogIllegal(t, ops)
	}
	t.Fatalf("seed %d round %d: history of %d operations is %v (not linearizable, or the check timed out)",
		seed, round, len(ops), res)
}

// linCount counts what a history exercised: each claim outcome, each
// finishing call by verdict, and the events the check is about. A
// takeover that carries the operation id of the key's previous
// acquisition resumed a remote operation (ids are derived from the
// request, so the id alone does not tell a resumption from a new record
// of the same request: a remote claim that takes over a local one); a
// Reconciling token that no MarkUncertain made uncertain was turned
// uncertain by a claim that found its remote lease expired.
func linCount(ops []porcupine.Operation) map[string]int {
	sorted := append([]porcupine.Operation(nil), ops...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Call < sorted[j].Call })
	prevOpID := map[string]idemkv.OperationID{} // the key's last acquisition's, in call order
	marked := map[uint64]bool{}
	for _, op := range sorted {
		in, out := op.Input.(linInput), op.Output.(linOutput)
		if in.Kind == linMarkUncertain && out.Err == linOK {
			marked[in.Token] = true
		}
	}
	converted := map[uint64]bool{}
	races := linResolveRaces{}
	counts := map[string]int{}
	for _, op := range sorted {
		in, out := op.Input.(linInput), op.Output.(linOutput)
		verdict := "ok"
		if out.Err != linOK {
			verdict = out.ErrText
		}
		switch in.Kind {
		case linClaim:
			counts[out.Outcome.String()]++
			switch {
			case out.Outcome == idemkv.Acquired:
				if out.Attempt > 1 {
					counts["takeover"]++
					if !out.OpID.IsZero() && out.OpID == prevOpID[in.Key] {
						counts["remote resume"]++
					}
				}
				prevOpID[in.Key] = out.OpID
			case out.Outcome == idemkv.Reconciling && !marked[out.Token] && !converted[out.Token]:
				converted[out.Token] = true
				counts["reconciling (expired remote)"]++
			}
		case linComplete, linRelease, linMarkUncertain:
			counts[in.Kind.String()+" "+verdict]++
		case linResolve:
			counts[in.Kind.String()+" "+verdict]++
			races.add(op, counts)
			if op.Metadata == linWorkerMeta {
				counts["worker resolve "+verdict]++
			}
		case linEscalate:
			counts[in.Kind.String()+" "+verdict]++
		case linGet:
			counts["get"]++
		}
	}
	return counts
}

// linResolveRaces holds, per key, the Resolves seen so far (in invocation
// order). A Resolve invoked while another of the same key was in flight
// raced it ("resolve race"); if one of the two succeeded and the other was
// refused ("resolve race lost"), the refusal had to fit the state on
// whichever side of the winner it linearized.
type linResolveRaces map[string][]porcupine.Operation

func (rs linResolveRaces) add(op porcupine.Operation, counts map[string]int) {
	key, ok := op.Input.(linInput).Key, op.Output.(linOutput).Err == linOK
	raced, lost := false, false
	for _, prev := range rs[key] {
		if prev.Return > op.Call {
			raced = true
			won := prev.Output.(linOutput).Err == linOK
			lost = lost || won != ok
		}
	}
	if raced {
		counts["resolve race"]++
	}
	if lost {
		counts["resolve race lost"]++
	}
	rs[key] = append(rs[key], op)
}
