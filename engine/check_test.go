package engine

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine/internal/record"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/stretchr/testify/require"
)

// TestCheckSoundStore checks a store holding every kind of record, and
// that Check counts them.
func TestCheckSoundStore(t *testing.T) {
	v := newEnv(t)
	c := v.claim(id("done"), fpA, idemkv.ModeLocal)
	require.NoError(t, v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 201, Pointer: "/p/1", Body: []byte("{}")},
		func(fx idemkv.Effects) error { return fx.Set([]byte("pay/1"), []byte("row")) }))
	r := v.claim(id("remote"), fpA, idemkv.ModeRemote)
	u := v.claim(id("unsure"), fpA, idemkv.ModeRemote)
	require.NoError(t, v.e.MarkUncertain(ctx, u.Lease, "timeout"))
	v.claim(id("local"), fpA, idemkv.ModeLocal) // in memory only
	old := v.claim(id("old"), fpA, idemkv.ModeLocal)
	require.NoError(t, v.e.Complete(ctx, old.Lease, idemkv.Result{Status: 200}, nil))
	v.clock.Advance(25 * time.Hour)
	_ = r

	rep, err := v.e.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%v", rep.Problems)
	require.Equal(t, 4, rep.Records)
	require.Equal(t, 1, rep.InProgress)
	require.Equal(t, 1, rep.Uncertain)
	require.Equal(t, 2, rep.Completed)
	require.Equal(t, 2, rep.Expired)
	require.Equal(t, 1, rep.Effects)
	require.Equal(t, 1, rep.EffectsPaired)
	require.Equal(t, uint64(1), rep.Epoch)
}

// TestCheckPairsEffects follows effects through their outcome's life:
// paired while it is stored, superseded when a later operation overwrites
// one, and vouched for by their stamp once it has expired and been swept.
func TestCheckPairsEffects(t *testing.T) {
	v := newEnv(t)
	complete := func(key string, apply func(idemkv.Effects) error) {
		t.Helper()
		c := v.claim(id(key), fpA, idemkv.ModeLocal)
		require.NoError(t, v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, apply))
	}
	complete("a", func(fx idemkv.Effects) error {
		_ = fx.Set([]byte("acct/1"), []byte("10"))
		_ = fx.Set([]byte("acct/1"), []byte("11")) // the same key twice counts once
		_ = fx.Set([]byte("tmp"), []byte("x"))
		return fx.Delete([]byte("tmp")) // set then deleted: not counted
	})
	rec, err := v.e.Get(ctx, id("a"))
	require.NoError(t, err)
	require.Equal(t, 1, rec.Effects)
	complete("b", func(fx idemkv.Effects) error {
		_ = fx.Set([]byte("acct/2"), []byte("20"))
		return fx.Set([]byte("log/b"), []byte("b"))
	})
	rep, err := v.e.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%v", rep.Problems)
	require.Equal(t, [4]int{3, 3, 0, 0}, [4]int{rep.Effects, rep.EffectsPaired, rep.EffectsExpired, rep.Superseded})

	// A later operation overwrites one of b's effects.
	complete("c", func(fx idemkv.Effects) error { return fx.Set([]byte("acct/2"), []byte("21")) })
	rep, err = v.e.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%v", rep.Problems)
	require.Equal(t, [4]int{3, 3, 0, 1}, [4]int{rep.Effects, rep.EffectsPaired, rep.EffectsExpired, rep.Superseded})

	// Past retention and swept: the stamps vouch for the effects.
	v.clock.Advance(25 * time.Hour)
	_, err = v.e.Sweep(ctx)
	require.NoError(t, err)
	rep, err = v.e.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%v", rep.Problems)
	require.Zero(t, rep.Records)
	require.Equal(t, [4]int{3, 0, 3, 0}, [4]int{rep.Effects, rep.EffectsPaired, rep.EffectsExpired, rep.Superseded})
	got, err := v.e.GetData(ctx, []byte("acct/2"))
	require.NoError(t, err)
	require.Equal(t, "21", string(got))
}

// TestCheckFindsUnpairedEffects writes, with raw Pebble, effects and
// records that a commit which split an outcome from its effects would
// leave, and expects each to be reported.
func TestCheckFindsUnpairedEffects(t *testing.T) {
	v := unpairedStore(t, 0)
	rep, err := v.e.Check(ctx)
	require.NoError(t, err)
	var found []string
	for _, p := range rep.Problems {
		found = append(found, p.String())
	}
	all := strings.Join(found, "\n")
	for _, what := range []string{
		`"orphan": written by token`,
		`"of-pending": written by token`,
		"carry its token",
		`"skewed": stamped with expiry`,
		"is also the token of",
		`"bare": idemkv: corrupt record: data value of 1 bytes has no stamp`,
	} {
		require.Contains(t, all, what)
	}
	require.Equal(t, 6, rep.ProblemCount, all)
	require.Equal(t, 1, rep.Passes)
}

// TestCheckInPasses: with too little memory to pair every token at once,
// Check pairs them a share at a time, in more passes, and reports the same
// problems and counts as in one pass.
func TestCheckInPasses(t *testing.T) {
	v := unpairedStore(t, 40)
	one, err := v.e.Check(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, one.Passes)
	require.NoError(t, v.e.Close())

	v.opts.CheckMemory = checkPairBytes // one pairing a pass
	v.open()
	many, err := v.e.Check(ctx)
	require.NoError(t, err)
	require.Greater(t, many.Passes, 8, "a pass per token share")

	sorted := func(ps []CheckProblem) []string {
		var s []string
		for _, p := range ps {
			s = append(s, p.String())
		}
		slices.Sort(s)
		return s
	}
	require.Equal(t, sorted(one.Problems), sorted(many.Problems))
	one.Problems, many.Problems, many.Passes = nil, nil, one.Passes
	require.Equal(t, one, many)
	require.Equal(t, 7, one.ProblemCount, "TestCheckFindsUnpairedEffects's and the early twins")
	require.Equal(t, 41, one.Superseded, "the extra outcomes, whose effects a later operation deleted, and the early twin")
}

// TestCheckInPassesChecksEveryEvent: events that name records still
// uncertain (a corrupt outbox) are found in every share's pass, not only
// in the first: as many problems as in one pass.
func TestCheckInPassesChecksEveryEvent(t *testing.T) {
	v := newEnv(t)
	b := v.e.db.NewBatch()
	for i := range 4 {
		c := v.claim(id(fmt.Sprint("u", i)), fpA, idemkv.ModeRemote)
		require.NoError(t, v.e.MarkUncertain(ctx, c.Lease, "timeout"))
		ev := idemkv.Event{Topic: "t", Key: fmt.Sprint(i)}
		enc := record.AppendEvent(nil, &ev, c.Lease.Token, v.clock.Now(), [16]byte{1})
		binary.BigEndian.PutUint64(enc[record.EventEntitySeqOffset:], 1)
		require.NoError(t, b.Set(record.OutboxEventKey(uint64(i+1)), enc, nil))
		require.NoError(t, b.Set(record.OutboxEntityKey(ev.Topic, ev.Key), binary.BigEndian.AppendUint64(nil, 1), nil))
	}
	require.NoError(t, b.Commit(pebble.Sync))
	one, err := v.e.Check(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, one.Passes)
	require.Equal(t, 4, one.ProblemCount, "%v", one.Problems)
	require.NoError(t, v.e.Close())

	v.opts.CheckMemory = checkPairBytes
	v.open()
	many, err := v.e.Check(ctx)
	require.NoError(t, err)
	require.Greater(t, many.Passes, 1)
	require.Equal(t, 4, many.ProblemCount, "%v", many.Problems)
}

// TestCheckInPassesCorruptTokens: tokens that no share count splits (a
// corrupt store's) make Check go over its memory budget, not panic or
// read the store without end.
func TestCheckInPassesCorruptTokens(t *testing.T) {
	v := newEnv(t)
	require.NoError(t, v.e.Close())
	v.e = nil
	db, err := pebble.Open(v.dir, v.opts.EnsureDefaults().PebbleOptions())
	require.NoError(t, err)
	now := v.clock.Now()
	for i, tok := range []uint64{0, 1 << 63} {
		r := idemkv.Record{State: idemkv.StateCompleted, Fingerprint: fpA, Token: tok, Attempt: 1, Effects: 1,
			Created: now, Expires: now.Add(time.Hour), Result: idemkv.Result{Status: 200}}
		require.NoError(t, db.Set(storedKey(id(fmt.Sprint(i)), &r), record.Encode(nil, &r), nil))
	}
	require.NoError(t, db.Close())

	v.opts.ReadOnly, v.opts.CheckMemory = true, checkPairBytes
	v.open()
	rep, err := v.e.Check(ctx)
	require.NoError(t, err)
	require.Equal(t, maxCheckShares, rep.Passes)
	require.Equal(t, 2, rep.Superseded)
	require.Equal(t, 2, rep.ProblemCount, "token zero, and a token from a later epoch: %v", rep.Problems)
}

// unpairedStore returns a read-only store with the problems
// TestCheckFindsUnpairedEffects expects; with extra, also extra completed
// records whose one effect each a later operation deleted (superseded, not
// a problem) and two more records sharing a token.
func unpairedStore(t *testing.T, extra int) *env {
	v := newEnv(t)
	for i := range extra {
		k := fmt.Sprintf("extra/%d", i)
		c := v.claim(id(k), fpA, idemkv.ModeLocal)
		require.NoError(t, v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 201},
			func(fx idemkv.Effects) error { return fx.Set([]byte(k), []byte("row")) }))
	}
	for i := range extra {
		k := fmt.Sprintf("extra/%d", i)
		c := v.claim(id(k+"/later"), fpA, idemkv.ModeLocal)
		require.NoError(t, v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 200},
			func(fx idemkv.Effects) error { return fx.Delete([]byte(k)) }))
	}
	c := v.claim(id("good"), fpA, idemkv.ModeLocal)
	require.NoError(t, v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 201},
		func(fx idemkv.Effects) error { return fx.Set([]byte("good"), []byte("row")) }))
	good, err := v.e.Get(ctx, id("good"))
	require.NoError(t, err)
	require.NoError(t, v.e.Close())
	v.e = nil

	db, err := pebble.Open(v.dir, v.opts.EnsureDefaults().PebbleOptions())
	require.NoError(t, err)
	now := v.clock.Now()
	later := now.Add(time.Hour)
	set := func(id idemkv.ID, r idemkv.Record) {
		k := storedKey(id, &r)
		require.NoError(t, db.Set(k, record.Encode(nil, &r), nil))
		if _, pk, v := record.PendingUpdate(k, nil, &r); pk != nil {
			require.NoError(t, db.Set(pk, v, nil))
		}
	}
	effect := func(key string, token uint64, exp time.Time) {
		require.NoError(t, db.Set(dataKey([]byte(key)), append(record.AppendStamp(nil, token, exp), "v"...), nil))
	}
	base := idemkv.Record{State: idemkv.StateCompleted, Fingerprint: fpA, Attempt: 1, Created: now, Expires: later,
		Result: idemkv.Result{Status: 200}}
	tok := func(seq uint64) uint64 { return 1<<tokenSeqBits | 100 + seq }

	// An effect whose outcome was never written.
	effect("orphan", tok(1), later)
	// An effect of a remote operation still in progress.
	pending := base
	pending.State, pending.Mode, pending.OperationID, pending.Token = idemkv.StateInProgress, idemkv.ModeRemote, idemkv.OperationID{1}, tok(2)
	pending.Result, pending.LeaseExpires = idemkv.Result{}, later
	set(id("pending"), pending)
	effect("of-pending", tok(2), later)
	// A record that counts one effect but has two.
	one := base
	one.Token, one.Effects = tok(3), 1
	set(id("one"), one)
	effect("one/a", tok(3), later)
	effect("one/b", tok(3), later)
	// An effect stamped with another expiry than its record's.
	effect("skewed", good.Token, later.Add(time.Hour))
	// Two records with one token.
	twin := base
	// In good's bucket, after it: so "good" pairs with good, as in layout 2.
	twin.Token, twin.Effects, twin.Expires = good.Token, 1, good.Expires
	set(id("twin"), twin)
	if extra > 0 {
		// Two more, sorted before every other record, so that a pass
		// finds them before it has narrowed its share of tokens.
		early := base
		early.Token, early.Effects = tok(9), 1
		set(id("0-early-a"), early)
		set(id("0-early-b"), early)
	}
	// A value without a stamp.
	require.NoError(t, db.Set(dataKey([]byte("bare")), []byte("x"), nil))
	require.NoError(t, db.Close())

	v.opts.ReadOnly = true
	v.open()
	return v
}

// storedKey is where the engine keeps rec for id: under its record key
// while unsettled, in an expiry bucket once completed (the bucket's width
// does not matter to Check).
func storedKey(id idemkv.ID, rec *idemkv.Record) []byte {
	k := appendRecordKey(nil, id)
	if rec.State != idemkv.StateCompleted {
		return k
	}
	b := record.AppendBucket(nil, rec.Class, record.BucketEnd(rec.Expires, time.Hour))
	return record.AppendExpiryKey(nil, b, k)
}

// TestCheckFindsBrokenInvariants writes, with raw Pebble, one entry per
// invariant Check verifies, and expects each to be reported.
func TestCheckFindsBrokenInvariants(t *testing.T) {
	v := newEnv(t)
	c := v.claim(id("good"), fpA, idemkv.ModeLocal)
	require.NoError(t, v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, nil))
	require.NoError(t, v.e.Close())
	v.e = nil

	db, err := pebble.Open(v.dir, v.opts.EnsureDefaults().PebbleOptions())
	require.NoError(t, err)
	now := v.clock.Now()
	rec := func(mut func(*idemkv.Record)) []byte {
		r := idemkv.Record{State: idemkv.StateCompleted, Fingerprint: fpA, Token: 1<<tokenSeqBits | 7, Attempt: 1,
			Created: now, Expires: now.Add(time.Hour), Result: idemkv.Result{Status: 200}}
		mut(&r)
		return record.Encode(nil, &r)
	}
	want := map[string][]byte{
		"does not decode":        []byte{1, 0xff},
		"never written":          rec(func(r *idemkv.Record) { r.State, r.Result = idemkv.StateInProgress, idemkv.Result{} }),
		"after the stored epoch": rec(func(r *idemkv.Record) { r.Token = 9<<tokenSeqBits | 1 }),
		"token is zero":          rec(func(r *idemkv.Record) { r.Token = 0 }),
	}
	i := 0
	for _, val := range want {
		i++
		k := appendRecordKey(nil, id(strings.Repeat("b", i)))
		if r, err := record.Decode(val); err == nil {
			k = storedKey(id(strings.Repeat("b", i)), &r)
		}
		require.NoError(t, db.Set(k, val, nil))
	}
	// Records where layout 3 does not keep them.
	bucketed := map[string]struct {
		k   []byte
		val []byte
	}{
		"not in an expiry bucket": {appendRecordKey(nil, id("c")), rec(func(*idemkv.Record) {})},
		"is in an expiry bucket (only completed": {record.AppendExpiryKey(nil, record.AppendBucket(nil, "", uint64(now.Add(time.Hour).Unix())), appendRecordKey(nil, id("cc"))),
			rec(func(r *idemkv.Record) {
				r.State, r.Mode, r.OperationID, r.Result, r.Token = idemkv.StateUncertain, idemkv.ModeRemote, idemkv.OperationID{1}, idemkv.Result{}, 1<<tokenSeqBits|8
			})},
		"in a bucket of class": {record.AppendExpiryKey(nil, record.AppendBucket(nil, "money", uint64(now.Add(time.Hour).Unix())), appendRecordKey(nil, id("ccc"))),
			rec(func(*idemkv.Record) {})},
		"after its bucket ends": {record.AppendExpiryKey(nil, record.AppendBucket(nil, "", uint64(now.Unix())), appendRecordKey(nil, id("cccc"))),
			rec(func(*idemkv.Record) {})},
	}
	for what, kv := range bucketed {
		require.NoError(t, db.Set(kv.k, kv.val, nil))
		want[what] = kv.val
	}
	require.NoError(t, db.Set([]byte{nsRecord, 0xff, 0xff}, rec(func(*idemkv.Record) {}), nil))
	require.NoError(t, db.Set([]byte{0x09, 'x'}, []byte("?"), nil))
	require.NoError(t, db.Set([]byte{nsMeta, 'z'}, []byte("?"), nil))
	require.NoError(t, db.Set(sweepKey, []byte("not a key"), nil))
	require.NoError(t, db.Close())

	v.opts.ReadOnly = true
	v.open()
	rep, err := v.e.Check(ctx)
	require.NoError(t, err)
	found := strings.Join(func() []string {
		var s []string
		for _, p := range rep.Problems {
			s = append(s, p.String())
		}
		return s
	}(), "\n")
	for what := range want {
		require.Contains(t, found, what)
	}
	for _, what := range []string{"record key does not decode", "unknown namespace", "unknown metadata key", "sweeper position"} {
		require.Contains(t, found, what)
	}
	require.Equal(t, len(want)+4, rep.ProblemCount, found)
	require.Equal(t, len(rep.Problems), rep.ProblemCount)
}

// TestCheckEffectsOfAResolutionWithoutEffect: effects committed with a
// NoEffect resolution have no outcome left to pair with. Their stamp says
// the outcome ended at the resolution, which Check must accept at once,
// even within the second it happened in.
func TestCheckEffectsOfAResolutionWithoutEffect(t *testing.T) {
	v := newEnv(t)
	v.clock.Advance(700 * time.Millisecond) // mid-second
	c := v.claim(id("refund"), fpA, idemkv.ModeRemote)
	require.NoError(t, v.e.MarkUncertain(ctx, c.Lease, "timeout"))
	rec, err := v.e.Get(ctx, id("refund"))
	require.NoError(t, err)
	require.NoError(t, v.e.Resolve(ctx, idemkv.ResolveRequest{ID: id("refund"), Token: rec.Token, NoEffect: true,
		Apply: func(fx idemkv.Effects) error { return fx.Set([]byte("hold/refund"), []byte("released")) }}))
	rep, err := v.e.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%v", rep.Problems)
	require.Equal(t, [3]int{1, 0, 1}, [3]int{rep.Effects, rep.EffectsPaired, rep.EffectsExpired})
}

// TestOpenRefusesOtherLayouts: a store with records but no layout marker
// (written before effects were stamped) and a store marked with another
// layout are refused, read-only too, and left as they were; an empty
// store gets the marker at its first Open.
func TestOpenRefusesOtherLayouts(t *testing.T) {
	po := (&Options{}).EnsureDefaults().PebbleOptions()
	rec := idemkv.Record{State: idemkv.StateCompleted, Fingerprint: fpA, Token: 1<<tokenSeqBits | 1, Attempt: 1,
		Created: t0, Expires: t0.Add(time.Hour), Result: idemkv.Result{Status: 200}}
	for name, marker := range map[string][]byte{
		"no marker":      nil,
		"a later layout": binary.BigEndian.AppendUint64(nil, record.Layout+1),
		"layout 2":       binary.BigEndian.AppendUint64(nil, 2),
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			db, err := pebble.Open(dir, po)
			require.NoError(t, err)
			require.NoError(t, db.Set(appendRecordKey(nil, id("old")), record.Encode(nil, &rec), nil))
			if marker != nil {
				require.NoError(t, db.Set(layoutKey, marker, nil))
			}
			require.NoError(t, db.Close())
			for _, ro := range []bool{false, true} {
				_, err := Open(dir, &Options{ReadOnly: ro})
				require.ErrorIs(t, err, ErrLayout, "read-only %v", ro)
			}
			// Nothing was written: the epoch is still absent.
			db, err = pebble.Open(dir, po)
			require.NoError(t, err)
			_, _, err = db.Get(epochKey)
			require.ErrorIs(t, err, pebble.ErrNotFound)
			require.NoError(t, db.Close())
		})
	}

	v := newEnv(t) // a new store
	rep, err := v.e.Check(ctx)
	require.NoError(t, err)
	require.True(t, rep.Layout)
	require.Zero(t, rep.ProblemCount)
}

// BenchmarkCheck checks a store of 1,000,000 completed records that wrote
// one effect each, written straight into Pebble and compacted: in one pass
// (the default memory), and with 8 MiB, which takes eight.
func BenchmarkCheck(b *testing.B) {
	const n = 1_000_000
	dir := writeBenchStore(b, n, true)

	for _, mem := range []int64{0, 8 << 20} {
		b.Run(fmt.Sprintf("memory=%dMiB", (&Options{CheckMemory: mem}).EnsureDefaults().CheckMemory>>20), func(b *testing.B) {
			e, err := Open(dir, &Options{Clock: fakeclock.New(t0), ReadOnly: true, NoBackgroundSweep: true,
				ClaimFilterBitsPerKey: -1, CheckMemory: mem})
			require.NoError(b, err)
			defer e.Close()
			b.ReportAllocs()
			var rep CheckReport
			runtime.GC()
			base, peak := heapInUse(), uint64(0)
			stop, sampled := make(chan struct{}), make(chan struct{})
			go func() { // sample the heap: what Check holds at its peak
				defer close(sampled)
				for {
					peak = max(peak, heapInUse())
					select {
					case <-stop:
						return
					case <-time.After(5 * time.Millisecond):
					}
				}
			}()
			for b.Loop() {
				rep, err = e.Check(context.Background())
				require.NoError(b, err)
			}
			close(stop)
			<-sampled
			b.ReportMetric(float64(peak-min(peak, base))/(1<<20), "peak-heap-MiB")
			require.Zero(b, rep.ProblemCount, "%v", rep.Problems)
			require.Equal(b, n, rep.EffectsPaired)
			b.ReportMetric(float64(rep.Passes), "passes")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/record")
		})
	}
}

func heapInUse() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// writeBenchStore writes n completed records straight into a new Pebble
// store, with one stamped effect each if effects, and compacts it: a
// store as the engine would have left it, built in seconds. It returns
// the store's directory.
func writeBenchStore(b testing.TB, n int, effects bool) string {
	dir := b.TempDir()
	db, err := pebble.Open(dir, (&Options{}).EnsureDefaults().PebbleOptions())
	require.NoError(b, err)
	batch := db.NewBatch()
	_ = batch.Set(layoutKey, binary.BigEndian.AppendUint64(nil, record.Layout), nil)
	_ = batch.Set(epochKey, binary.BigEndian.AppendUint64(nil, 1), nil)
	_ = batch.Set(secretKey, make([]byte, record.SecretLen), nil)
	exp := t0.Add(24 * time.Hour)
	bucket := record.AppendBucket(nil, "", record.BucketEnd(exp, time.Hour)) // the default class
	fxCount := 0
	if effects {
		fxCount = 1
	}
	var k, fx []byte
	for i := range n {
		tok := uint64(1)<<tokenSeqBits | uint64(i+1)
		val := record.Encode(nil, &idemkv.Record{State: idemkv.StateCompleted, Fingerprint: fpA, Token: tok, Attempt: 1,
			Created: t0, Expires: exp, Effects: fxCount, Result: idemkv.Result{Status: 201, Pointer: "/v1/payments/pay_0123456789abcdef"}})
		key := fmt.Sprintf("%08x-4b4a-44fa-b265-7659601dc012", i*2654435761)
		k = appendRecordKey(k[:0], idemkv.ID{Tenant: fmt.Sprintf("acct_%d", i%1000), Endpoint: "POST /v1/payments", Key: key})
		_ = batch.Set(record.AppendExpiryKey(nil, bucket, k), val, nil)
		if effects {
			fx = append(record.AppendStamp(fx[:0], tok, exp), `{"amount":5000}`...)
			_ = batch.Set(dataKey([]byte("pay/"+key)), fx, nil)
		}
	}
	require.NoError(b, batch.Commit(pebble.NoSync))
	require.NoError(b, db.Compact(context.Background(), []byte{0}, []byte{0xff}, true))
	require.NoError(b, db.Close())
	return dir
}

// TestCheckFindsARecordLiveTwice: an unsettled record under its record
// key, created before a completed one under the same key in an expiry
// bucket expired, is a store no write leaves (settling moves the record
// in one batch); lookups would answer with the first. An expired
// completed record beside a claim that took its key over is sound.
func TestCheckFindsARecordLiveTwice(t *testing.T) {
	v := newEnv(t)
	v.complete(id("x"))
	v.clock.Advance(25 * time.Hour) // x has expired
	require.Equal(t, idemkv.Acquired, v.claim(id("x"), fpA, idemkv.ModeRemote).Outcome)
	rep, err := v.e.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%v", rep.Problems)

	v.complete(id("y"))
	v.claim(id("z"), fpA, idemkv.ModeRemote) // in progress, on disk
	var val, bucket []byte
	it, err := v.e.db.NewIter(&pebble.IterOptions{LowerBound: expiryStart, UpperBound: expiryEnd})
	require.NoError(t, err)
	for valid := it.First(); valid; valid = it.Next() {
		bp, _, _, rk, err := record.SplitExpiryKey(it.Key())
		require.NoError(t, err)
		if bytes.Equal(rk, appendRecordKey(nil, id("y"))) {
			val, bucket = bytes.Clone(it.Value()), bytes.Clone(bp)
		}
	}
	require.NoError(t, it.Close())
	require.NotNil(t, val)
	require.NoError(t, v.e.db.Set(record.AppendExpiryKey(nil, bucket, appendRecordKey(nil, id("z"))), val, pebble.Sync))

	rep, err = v.e.Check(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, rep.ProblemCount, "%v", rep.Problems)
	require.Contains(t, rep.Problems[0].String(), "an unsettled one created before it expired")
}
