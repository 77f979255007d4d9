package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/examples/payments"
	"github.com/idemkv/idemkv/internal/tier"
	"github.com/idemkv/idemkv/pgstore"
	"github.com/idemkv/idemkv/pgstore/pgtest"
)

var (
	flagSeed     = flag.Uint64("seed", 0, "run only this seed, and print its whole trace")
	flagSeeds    = flag.Int("seeds", 0, "seeds to run on each store (default 300 on the engine, 100 on PostgreSQL; with -short, 30 on the engine only)")
	flagFirst    = flag.Uint64("first", 1, "the first seed to run")
	flagStore    = flag.String("store", "both", "the stores to run on: engine, postgres or both")
	flagWorkers  = flag.Int("workers", 1, "worlds to run at once (each on a store of its own)")
	flagProgress = flag.Bool("progress", false, "print each seed to stderr as it starts (a run that dies says where)")
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestSimulation runs the payments world (payworld_test.go) seed after
// seed, on the engine and on PostgreSQL. A failing seed prints its trace
// and the command that replays it.
func TestSimulation(t *testing.T) {
	for _, store := range []string{"engine", "postgres"} {
		if *flagStore != "both" && *flagStore != store {
			continue
		}
		t.Run(store, func(t *testing.T) {
			seeds := map[string]int{"engine": tier.Count(300, 100), "postgres": tier.Count(100, 20)}[store]
			if testing.Short() {
				if store == "postgres" {
					t.Skip("-short: the PostgreSQL worlds run in the full suite")
				}
				seeds = 30
			}
			if *flagSeeds > 0 {
				seeds = *flagSeeds
			}
			first, last := *flagFirst, *flagFirst+uint64(seeds)-1
			if *flagSeed != 0 {
				first, last = *flagSeed, *flagSeed
			}
			runSeeds(t, store, first, last)
		})
	}
}

// runSeeds runs the seeds first to last, on -workers worlds at once, and
// fails the test at the first seed that fails.
func runSeeds(t *testing.T, store string, first, last uint64) {
	var srv *pgtest.Server
	if store == "postgres" {
		srv = pgtest.Start(t, pgtest.WithoutFsync())
	}
	start := time.Now()
	var (
		next   atomic.Uint64
		failed atomic.Bool
		wg     sync.WaitGroup
		mu     sync.Mutex
		fails  []string
	)
	next.Store(first)
	for range max(1, *flagWorkers) {
		mk := engineWorld
		if store == "postgres" {
			mk = postgresWorld(t, srv)
		}
		wg.Go(func() {
			for !failed.Load() {
				seed := next.Add(1) - 1
				if seed > last {
					return
				}
				if *flagProgress {
					fmt.Fprintf(os.Stderr, "sim: %s seed %d\n", store, seed)
				}
				pw, err := runSeed(t, seed, mk)
				if err == nil && *flagSeed == 0 {
					continue
				}
				var b strings.Builder
				n := 400
				if *flagSeed != 0 {
					n = 0
				}
				if pw != nil {
					pw.w.Trace().WriteTo(&b, n)
				}
				msg := fmt.Sprintf("seed %d trace:\n%s", seed, b.String())
				if err != nil {
					failed.Store(true)
					var prm params
					if pw != nil {
						prm = pw.prm
					}
					msg += fmt.Sprintf("\nseed %d failed: %v\nparams %s\nreplay: go test ./sim -run 'TestSimulation/%s' -seed %d -v",
						seed, err, prm, store, seed)
				}
				mu.Lock()
				fails = append(fails, msg)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, f := range fails {
		t.Log(f)
	}
	if failed.Load() {
		t.FailNow()
	}
	t.Logf("%d seeds in %v", last-first+1, time.Since(start).Round(time.Millisecond))
}

func engineWorld(pw *payWorld) (backend, error) { return &engineBackend{pw: pw}, nil }

// postgresWorld returns the maker of PostgreSQL worlds on a database of
// their own on srv (a server with fsync off: a process crash, not the
// database's, is what the runs simulate), emptied before every seed.
func postgresWorld(t *testing.T, srv *pgtest.Server) func(pw *payWorld) (backend, error) {
	dsn := srv.CreateDatabase(t)
	// A store of the test's own, to create the schema and empty it.
	admin, err := pgstore.Open(context.Background(), dsn, &pgstore.Options{NoBackgroundSweep: true, NoListen: true, MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	return func(pw *payWorld) (backend, error) {
		_, err := admin.Pool().Exec(context.Background(), `TRUNCATE idemkv_records, idemkv_data, idemkv_outbox, idemkv_entities`)
		return &pgBackend{pw: pw, dsn: dsn, n: pick(pw.w, 1, 2)}, err
	}
}

// runSeed runs one seed to its end and checks how it left the world.
func runSeed(t *testing.T, seed uint64, mk func(*payWorld) (backend, error)) (*payWorld, error) {
	dir, err := os.MkdirTemp(t.TempDir(), "seed")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	pw, err := newPayWorld(seed, dir, mk)
	if pw != nil {
		defer pw.w.Close()
	}
	if err != nil {
		return pw, fmt.Errorf("building the world: %w", err)
	}
	// Run until the clients are done (late resends included), past the
	// chaos, then long enough for what they left to be settled or
	// escalated, and the escalated to be settled by the operator.
	for err == nil && (pw.busy > 0 || pw.w.Now().Sub(pw.start) < chaosWindow+pw.prm.downMax) {
		err = pw.w.Run(pw.w.Now().Add(30 * time.Second))
	}
	// Then a minute for the requests still running (their clients gone)
	// to end, and until nothing is left to settle, or for as long as
	// settling may take.
	if err == nil {
		err = pw.w.Run(pw.w.Now().Add(time.Minute))
	}
	for deadline := pw.w.Now().Add(pw.settleTime()); err == nil && pw.w.Now().Before(deadline) && !pw.quiet(); {
		err = pw.w.Run(pw.w.Now().Add(30 * time.Second))
	}
	if err == nil {
		err = pw.finalCheck()
	}
	return pw, err
}

// quiet reports whether the world has settled: nothing unsettled, and
// nothing escalated, in the store of a live service.
func (pw *payWorld) quiet() bool {
	for _, s := range pw.services {
		if s.p.Dead() {
			continue
		}
		for _, esc := range []bool{false, true} {
			page, err := s.store.List(context.Background(), idemkv.ListRequest{Escalated: esc, Limit: 1})
			if err != nil || len(page.Records) > 0 {
				return false
			}
		}
		return true
	}
	return false
}

// settleTime is how long the reconciler and the operator take at most to
// settle what the clients left: the reconciler's limit, its backoff, and
// the operator's rounds.
func (pw *payWorld) settleTime() time.Duration {
	prm := pw.prm
	return prm.maxAge + prm.grace + prm.lease + prm.maxBackoff + time.Minute
}

// finalCheck checks what the run left: nothing unsettled, and (where the
// reconciler's settings are safe) the books balanced: every charge has
// its payment row and every row its charge, and an account's spent total
// is the sum of its payments.
func (pw *payWorld) finalCheck() error {
	ctx := context.Background()
	var s *service
	for _, c := range pw.services {
		if !c.p.Dead() {
			s = c
		}
	}
	if s == nil {
		return fmt.Errorf("no service alive at the end")
	}
	for _, esc := range []bool{false, true} {
		page, err := s.store.List(ctx, idemkv.ListRequest{Escalated: esc, Limit: 1000})
		if err != nil {
			return err
		}
		for _, rec := range page.Records {
			return fmt.Errorf("%s/%s left %s (escalated %v) at the end: %s", rec.ID.Tenant, rec.ID.Key, rec.State, rec.Escalated, rec.Note)
		}
	}
	if !pw.prm.safe {
		return nil
	}
	tenants := map[string]bool{}
	for _, p := range pw.pays {
		tenants[p.tenant] = true
	}
	for tenant := range tenants {
		var rows struct{ Data []payments.Payment }
		if err := get(s.svc, tenant, "/v1/payments?limit=1000", &rows); err != nil {
			return err
		}
		// A row settled by an operator's word while the processor could
		// not be asked has no charge id: it stands for any charge of its
		// amount that no other row names.
		var got, want []string
		var sum int64
		charged := map[string]int64{}
		for _, c := range pw.down.charges {
			if c.tenant == tenant && !c.declined {
				charged[c.charge.ID] = c.charge.Amount
				want = append(want, fmt.Sprintf("%s:%d", c.charge.ID, c.charge.Amount))
			}
		}
		var unnamed []int64
		for _, r := range rows.Data {
			sum += r.Amount
			if r.Charge == "" {
				unnamed = append(unnamed, r.Amount)
				continue
			}
			got = append(got, fmt.Sprintf("%s:%d", r.Charge, r.Amount))
			delete(charged, r.Charge)
		}
		for _, amount := range unnamed {
			for id, a := range charged {
				if a == amount {
					got = append(got, fmt.Sprintf("%s:%d", id, a))
					delete(charged, id)
					break
				}
			}
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			return fmt.Errorf("%s: payment rows %v, but the processor charged %v", tenant, got, want)
		}
		if pw.prm.limit > 0 {
			var acct payments.Account
			if err := get(s.svc, tenant, "/v1/account", &acct); err != nil {
				return err
			}
			if acct.Spent != sum {
				return fmt.Errorf("%s: the account counts %d spent, its payments sum to %d (a hold left behind, or one counted twice)",
					tenant, acct.Spent, sum)
			}
		}
	}
	return nil
}

// get reads path as tenant through the service's handler.
func get(svc *payments.Service, tenant, path string, v any) error {
	r := httptest.NewRequest(http.MethodGet, path, nil)
	r.Header.Set("Authorization", "Bearer "+tenant)
	rec := httptest.NewRecorder()
	svc.Handler().ServeHTTP(rec, r)
	if rec.Code != http.StatusOK {
		return fmt.Errorf("GET %s as %s: %d %s", path, tenant, rec.Code, rec.Body)
	}
	return json.NewDecoder(bytes.NewReader(rec.Body.Bytes())).Decode(v)
}
