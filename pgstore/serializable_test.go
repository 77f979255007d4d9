package pgstore_test

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/tier"
	"github.com/idemkv/idemkv/pgstore"
	"github.com/idemkv/idemkv/pgstore/pgtest"
)

// op is one committed operation of a history: what its committing run
// read (a key's value, "" for absent) and wrote.
type op struct {
	name   string
	reads  map[string]string
	writes map[string]string
}

// serialOrder returns an order of ops in which each reads what the ones
// before it wrote, or nil if there is none: the history is serializable
// if and only if it returns one. (Depth-first over orders, pruned at the
// first op whose reads disagree; histories here are a handful of ops.)
func serialOrder(ops []op) []string {
	var order []string
	used := make([]bool, len(ops))
	state := map[string]string{}
	var place func() bool
	place = func() bool {
		if len(order) == len(ops) {
			return true
		}
		for i := range ops {
			if used[i] || !readsMatch(ops[i].reads, state) {
				continue
			}
			saved := maps.Clone(state)
			maps.Copy(state, ops[i].writes)
			used[i], order = true, append(order, ops[i].name)
			if place() {
				return true
			}
			used[i], order, state = false, order[:len(order)-1], saved
		}
		return false
	}
	if !place() {
		return nil
	}
	return order
}

func readsMatch(reads, state map[string]string) bool {
	for k, v := range reads {
		if state[k] != v {
			return false
		}
	}
	return true
}

// describe prints a history for a failure message.
func describe(ops []op) string {
	var b strings.Builder
	for _, o := range ops {
		fmt.Fprintf(&b, "  %s: read %v, wrote %v\n", o.name, o.reads, o.writes)
	}
	return b.String()
}

// readLog keeps what each run of an apply function read, so that the
// committing run's reads are the ones kept.
type readLog struct {
	mu  sync.Mutex
	ops []op
}

// hooks run on an apply function's first run only: before it reads, and
// between its reads and its writes.
type hooks struct{ before, between func() }

// reading returns an apply function that reads keys, then writes each of
// writes with its own name as the value, recording the run that commits.
func (r *readLog) reading(name string, keys, writes []string, h hooks) (func(idemkv.Effects) error, func()) {
	var run op
	var first atomic.Bool
	first.Store(true)
	apply := func(fx idemkv.Effects) error {
		isFirst := first.Swap(false)
		if isFirst && h.before != nil {
			h.before()
		}
		run = op{name: name, reads: map[string]string{}, writes: map[string]string{}}
		for _, k := range keys {
			v, err := fx.Get([]byte(k))
			switch {
			case errors.Is(err, idemkv.ErrNotFound):
				run.reads[k] = ""
			case err != nil:
				return err
			default:
				run.reads[k] = string(v)
			}
		}
		if isFirst && h.between != nil {
			h.between()
		}
		for _, k := range writes {
			run.writes[k] = name
			if err := fx.Set([]byte(k), []byte(name)); err != nil {
				return err
			}
		}
		return nil
	}
	committed := func() {
		r.mu.Lock()
		r.ops = append(r.ops, run)
		r.mu.Unlock()
	}
	return apply, committed
}

// completeReading claims key on s and completes it with apply.
func completeReading(t *testing.T, s *pgstore.Store, key string, apply func(idemkv.Effects) error) error {
	c, err := s.Claim(ctx, idemkv.ClaimRequest{ID: reviewID(key), Fingerprint: []byte{1}})
	require.NoError(t, err)
	require.Equal(t, idemkv.Acquired, c.Outcome)
	return s.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, apply)
}

// skewHistory runs the three operations of a write skew through a blind
// write, in the one order that shows it: T1 reads x (absent) and stops;
// T2 writes x, reading nothing (an Update); T3 reads x (T2's) and y
// (absent) and writes no data; then T1 writes y. Serially, T1 must come before
// T2 (it read x absent), T2 before T3 (T3 read its x), and T3 before T1
// (it read y absent): no order has all three, so one of them must not
// commit as it ran.
func skewHistory(t *testing.T, s *pgstore.Store) []op {
	var r readLog
	t1Read, t1Go := make(chan struct{}), make(chan struct{})
	t1, t1Done := r.reading("T1", []string{"x"}, []string{"y"}, hooks{between: func() { close(t1Read); <-t1Go }})
	errc := make(chan error, 1)
	go func() { errc <- completeReading(t, s, "t1", t1) }()
	<-t1Read

	t2, t2Done := r.reading("T2", nil, []string{"x"}, hooks{})
	require.NoError(t, s.Update(ctx, t2))
	t2Done()
	t3, t3Done := r.reading("T3", []string{"x", "y"}, nil, hooks{})
	require.NoError(t, completeReading(t, s, "t3", t3))
	t3Done()

	close(t1Go)
	require.NoError(t, <-errc)
	t1Done()
	return r.ops
}

// TestBlindWritesAreSerializable: the write skew of skewHistory is
// refused at T1's commit (T1 runs again, reads T2's x, and the history is
// serial: T2, T3, T1). With blind writes at READ COMMITTED, as the store
// once made them, the same schedule commits a history in no serial
// order, and the checker says so.
func TestBlindWritesAreSerializable(t *testing.T) {
	s, _ := reviewStore(t, nil)
	ops := skewHistory(t, s)
	order := serialOrder(ops)
	require.NotNil(t, order, "not serializable:\n%s", describe(ops))
	t.Logf("serial order %v of:\n%s", order, describe(ops))
	require.Equal(t, []string{"T2", "T3", "T1"}, order)

	rc, _ := reviewStore(t, func(o *pgstore.Options) { pgstore.WithReadCommittedData(o) })
	ops = skewHistory(t, rc)
	require.Nil(t, serialOrder(ops), "blind writes at READ COMMITTED let this history through:\n%s", describe(ops))
	t.Logf("with blind writes at READ COMMITTED, the checker finds no serial order for:\n%s", describe(ops))
}

// TestMixedOperationsAreSerializable: rapid draws a few operations over
// two keys, each reading some keys and writing others, or writing
// without reading (a blind Update, a blind Complete, or RunLocal), and a
// schedule of their steps (each op's reads, each op's commit), runs them
// in that order, and checks that what committed has a serial order. (On
// the old path, blind writes at READ COMMITTED, the same model finds a
// history in no serial order after about a thousand cases, too slowly to
// be a test: TestBlindWritesAreSerializable shows the checker catching
// that path on the one schedule that matters.)
func TestMixedOperationsAreSerializable(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	s := reviewOpenOn(t, dsn, func(o *pgstore.Options) {
		// An op waiting for its commit's turn holds its transaction's
		// connection: enough for all of them, the op whose turn it is,
		// and the listener (pgxpool's default is 4 on two cores).
		o.MaxConns = 16
	})
	keys := []string{"a", "b"}
	var round atomic.Int64
	rapid.Check(t, func(rt *rapid.T) {
		n := round.Add(1)
		prefix := fmt.Sprintf("r%d/", n)
		count := rapid.IntRange(3, 5).Draw(rt, "ops")
		sched := drawSchedule(rt, count)
		var r readLog
		var wg sync.WaitGroup
		errs := make([]error, count)
		for i := range count {
			kind := rapid.SampledFrom([]string{"read-write", "update", "complete", "runlocal"}).Draw(rt, fmt.Sprintf("kind%d", i))
			var reads []string
			minWrites := 1 // a blind op writes
			if kind == "read-write" {
				reads = subset(rt, keys, fmt.Sprintf("reads%d", i), prefix, 1)
				minWrites = 0
			}
			writes := subset(rt, keys, fmt.Sprintf("writes%d", i), prefix, minWrites)
			name := fmt.Sprintf("%s%d", kind, i)
			apply, done := r.reading(name, reads, writes, hooks{
				before:  func() { sched.wait(2 * i) },
				between: func() { sched.finish(2 * i); sched.wait(2*i + 1) },
			})
			wg.Go(func() {
				defer sched.finish(2*i, 2*i+1) // its commit has returned
				var err error
				switch kind {
				case "update":
					err = s.Update(ctx, apply)
				case "runlocal":
					var c idemkv.Claim
					c, err = s.RunLocal(ctx, idemkv.ClaimRequest{ID: reviewID(prefix + name), Fingerprint: []byte{1}},
						idemkv.Result{Status: 201}, apply)
					if err == nil && c.Outcome != idemkv.Acquired {
						err = fmt.Errorf("RunLocal: %v", c.Outcome)
					}
				default:
					err = completeReading(t, s, prefix+name, apply)
				}
				if err == nil {
					done()
				}
				errs[i] = err
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil && !errors.Is(err, idemkv.ErrConflict) {
				rt.Fatalf("op %d: %v", i, err)
			}
		}
		if serialOrder(r.ops) == nil {
			rt.Fatalf("no serial order for:\n%s", describe(r.ops))
		}
	})
}

// schedule orders the steps of a few concurrent operations: step 2i is
// op i's reads, step 2i+1 its commit. A step waits for its turn; a
// finished step (or one its op will never take) passes the turn on.
type schedule struct {
	mu    sync.Mutex
	cond  sync.Cond
	order []int
	pos   int
	done  map[int]bool
}

// drawSchedule draws an order of the 2n steps of n ops in which each
// op's reads come before its commit.
func drawSchedule(rt *rapid.T, n int) *schedule {
	slots := rapid.Permutation(seq(2*n)).Draw(rt, "schedule")
	// slots[k] is the op-slot taking turn k: slot j belongs to op j/2; an
	// op's first turn is its reads, its second its commit.
	seen := map[int]bool{}
	order := make([]int, len(slots))
	for k, slot := range slots {
		op := slot / 2
		if !seen[op] {
			order[k], seen[op] = 2*op, true
		} else {
			order[k] = 2*op + 1
		}
	}
	sc := &schedule{order: order, done: map[int]bool{}}
	sc.cond.L = &sc.mu
	return sc
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

func (sc *schedule) wait(step int) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	for sc.pos < len(sc.order) && sc.order[sc.pos] != step {
		sc.cond.Wait()
	}
}

func (sc *schedule) finish(steps ...int) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	for _, st := range steps {
		sc.done[st] = true
	}
	for sc.pos < len(sc.order) && sc.done[sc.order[sc.pos]] {
		sc.pos++
	}
	sc.cond.Broadcast()
}

// subset draws at least min of keys, each prefixed.
func subset(rt *rapid.T, keys []string, label, prefix string, min int) []string {
	picked := rapid.SliceOfNDistinct(rapid.SampledFrom(keys), min, len(keys), rapid.ID[string]).Draw(rt, label)
	out := make([]string, len(picked))
	for i, k := range picked {
		out[i] = prefix + k
	}
	slices.Sort(out)
	return out
}

// TestReadAndEmitUnderContention: 16 writers complete operations that
// read a key and emit an event of one of three entities, all at once:
// none fails with ErrConflict, since none reads what another writes (the
// entities' counters are the sequencer's, not the commits'), and the
// outbox numbers every entity's events without a gap.
func TestReadAndEmitUnderContention(t *testing.T) {
	s, _ := reviewStore(t, nil)
	require.NoError(t, s.Update(ctx, func(fx idemkv.Effects) error {
		for w := range 16 {
			if err := fx.Set(fmt.Appendf(nil, "cfg/%02d", w), []byte("x")); err != nil {
				return err
			}
		}
		return nil
	}))
	perWriter := tier.Count(40, 12)
	var conflicts atomic.Int64
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := range perWriter {
				err := completeReading(t, s, fmt.Sprintf("emit-%02d-%03d", w, i), func(fx idemkv.Effects) error {
					if _, err := fx.Get(fmt.Appendf(nil, "cfg/%02d", w)); err != nil {
						return err
					}
					if err := fx.Set(fmt.Appendf(nil, "out/%02d/%03d", w, i), []byte("v")); err != nil {
						return err
					}
					return fx.Emit(idemkv.Event{Topic: "things.changed", Key: fmt.Sprint("entity-", i%3), Payload: []byte("p")})
				})
				if errors.Is(err, idemkv.ErrConflict) {
					conflicts.Add(1)
					continue
				}
				require.NoError(t, err)
			}
		})
	}
	wg.Wait()
	t.Logf("%d operations, %d ErrConflict; runs again after a failure to serialize: %d",
		16*perWriter, conflicts.Load(), s.Counts().Conflicts)
	require.Zero(t, conflicts.Load())
	evs, err := s.ReadOutbox(ctx, 0, 10000)
	require.NoError(t, err)
	require.Len(t, evs, 16*perWriter)
	next := map[string]uint64{}
	for _, ev := range evs {
		next[ev.Key]++
		require.Equal(t, next[ev.Key], ev.EntitySeq, "event %d of %s", ev.Seq, ev.Key)
	}
	rep, err := s.Check(ctx)
	require.NoError(t, err)
	require.Empty(t, rep.Problems)
}

// TestBlindWritesNeverConflict: operations that read nothing, on keys
// of their own or on one key they all write, never fail to serialize in
// the end. Many writers at once make PostgreSQL abort some of their
// transactions (its locks cover index pages, and the first updater of a
// row wins), and the store runs those again: ErrConflict says that
// something an operation read changed, and they read nothing.
func TestBlindWritesNeverConflict(t *testing.T) {
	s, _ := reviewStore(t, func(o *pgstore.Options) { o.MaxConns = 48 })
	per := tier.Count(100, 25)
	run := func(name string, writers int, op func(w, i int) error) {
		var wg sync.WaitGroup
		var failed atomic.Int64
		before := s.Counts().Conflicts
		for w := range writers {
			wg.Go(func() {
				for i := range per {
					if err := op(w, i); err != nil {
						failed.Add(1)
						t.Errorf("%s %d-%d: %v", name, w, i, err)
					}
				}
			})
		}
		wg.Wait()
		t.Logf("%s: %d writers, %d operations, %d run again after a failure to serialize",
			name, writers, writers*per, s.Counts().Conflicts-before)
		require.Zero(t, failed.Load())
	}
	set := func(key string) func(idemkv.Effects) error {
		return func(fx idemkv.Effects) error { return fx.Set([]byte(key), []byte("v")) }
	}
	req := func(key string) idemkv.ClaimRequest {
		return idemkv.ClaimRequest{ID: idemkv.ID{Tenant: "t", Endpoint: "blind", Key: key}, Fingerprint: []byte{1}}
	}
	run("RunLocal, keys of their own", 32, func(w, i int) error {
		k := fmt.Sprintf("local-%02d-%03d", w, i)
		c, err := s.RunLocal(ctx, req(k), idemkv.Result{Status: 200}, set("d/"+k))
		if err == nil && c.Outcome != idemkv.Acquired {
			err = fmt.Errorf("outcome %v", c.Outcome)
		}
		return err
	})
	run("Claim and Complete, keys of their own", 32, func(w, i int) error {
		k := fmt.Sprintf("two-%02d-%03d", w, i)
		c, err := s.Claim(ctx, req(k))
		if err != nil {
			return err
		}
		return s.Complete(ctx, c.Lease, idemkv.Result{Status: 200}, set("d/"+k))
	})
	run("Update, one key for all", 48, func(w, i int) error {
		return s.Update(ctx, set("shared"))
	})
	rep, err := s.Check(ctx)
	require.NoError(t, err)
	require.Empty(t, rep.Problems)
}

// TestReadsThatFailToSerializeRunAgain: a read that PostgreSQL aborts
// (40001 from Effects.Get itself) makes its operation run again, whatever
// the apply function made of the error: passed on without %w, or taken
// for an absent key and written over. 32 writers read three of seven
// shared keys, write one, and count their commits in a key of their own:
// every operation commits or ends in ErrConflict, and every count is
// right.
func TestReadsThatFailToSerializeRunAgain(t *testing.T) {
	s, _ := reviewStore(t, func(o *pgstore.Options) { o.MaxConns = 32 })
	per := tier.Count(50, 25)
	op := func(w, i int, swallow bool) func(idemkv.Effects) error {
		return func(fx idemkv.Effects) error {
			read := func(key string) ([]byte, error) {
				v, err := fx.Get([]byte(key))
				switch {
				case err == nil, errors.Is(err, idemkv.ErrNotFound):
					return v, nil
				case swallow: // "absent", as a careless function takes any error
					return nil, nil
				}
				return nil, fmt.Errorf("reading %s: %v", key, err) // the cause not wrapped
			}
			for j := range 3 {
				if _, err := read(fmt.Sprint("r/", (w+i+j)%7)); err != nil {
					return err
				}
			}
			v, err := read(fmt.Sprint("count/", w))
			if err != nil {
				return err
			}
			n, _ := strconv.Atoi(string(v))
			if err := fx.Set([]byte(fmt.Sprint("count/", w)), []byte(strconv.Itoa(n+1))); err != nil {
				return err
			}
			return fx.Set([]byte(fmt.Sprint("r/", (w*i)%7)), []byte("x"))
		}
	}
	committed := make([]int, 32)
	var conflicts atomic.Int64
	var wg sync.WaitGroup
	for w := range 32 {
		wg.Go(func() {
			for i := range per {
				err := s.Update(ctx, op(w, i, i%2 == 0))
				switch {
				case err == nil:
					committed[w]++
				case errors.Is(err, idemkv.ErrConflict):
					conflicts.Add(1)
				default:
					t.Errorf("writer %d: %v", w, err)
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d operations, %d ErrConflict, %d run again", 32*per, conflicts.Load(), s.Counts().Conflicts)
	for w, n := range committed {
		v, err := s.GetData(ctx, []byte(fmt.Sprint("count/", w)))
		if n == 0 {
			require.ErrorIs(t, err, idemkv.ErrNotFound)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, strconv.Itoa(n), string(v), "writer %d: every commit counted once", w)
	}
}
