package engine

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine/internal/record"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/ttl"
	"github.com/stretchr/testify/require"
)

// newSweepEnv is newEnv with retention classes ("short" 1 h, "money"
// 30 days), no background sweeper (tests call Sweep) and small chunks, so
// that passes take several chunks; adjust may change the options further.
func newSweepEnv(t testing.TB, adjust func(*Options)) *env {
	v := &env{t: t, dir: t.TempDir(), clock: fakeclock.New(t0)}
	v.opts = Options{Clock: v.clock, Lease: 30 * time.Second, CacheSize: 8 << 20, MemTableSize: 4 << 20,
		RetentionClasses:  ttl.Classes{"short": time.Hour, "money": 30 * 24 * time.Hour},
		NoBackgroundSweep: true,
		Sweep:             ttl.Options{ChunkSize: 7, Rate: -1},
	}
	if adjust != nil {
		adjust(&v.opts)
	}
	v.open()
	t.Cleanup(func() {
		if v.e != nil {
			_ = v.e.Close()
		}
	})
	return v
}

// completeIn claims key in class, completes it with status and returns
// the lease it held.
func (v *env) completeIn(key, class string, fp []byte, status int) idemkv.Lease {
	c, err := v.e.Claim(ctx, idemkv.ClaimRequest{ID: id(key), Fingerprint: fp, Retention: class})
	require.NoError(v.t, err)
	require.Equal(v.t, idemkv.Acquired, c.Outcome, key)
	require.NoError(v.t, v.e.Complete(ctx, c.Lease, idemkv.Result{Status: status}, nil))
	return c.Lease
}

// stored returns the records in Pebble by key, expired or not, bypassing
// every read path of the engine: unsettled records and those in expiry
// buckets. Of a key in several buckets, it keeps the record that expires
// last.
func (v *env) stored() map[string]idemkv.Record {
	out := map[string]idemkv.Record{}
	for _, span := range [][2][]byte{{recordStart, recordEnd}, {expiryStart, expiryEnd}} {
		it, err := v.e.db.NewIter(&pebble.IterOptions{LowerBound: span[0], UpperBound: span[1]})
		require.NoError(v.t, err)
		for valid := it.First(); valid; valid = it.Next() {
			rid, err := storedRecordID(it.Key())
			require.NoError(v.t, err)
			rec, err := record.Decode(it.Value())
			require.NoError(v.t, err)
			if have, ok := out[rid.Key]; !ok || have.Expires.Before(rec.Expires) {
				out[rid.Key] = rec
			}
		}
		require.NoError(v.t, it.Close())
	}
	return out
}

func TestRetentionClassesExpireExactly(t *testing.T) {
	v := newSweepEnv(t, nil)
	v.opts.ClockTolerance = TrustClock // it sets the clock back between rounds
	v.reopen()
	v.completeIn("d", "", fpA, 200)
	v.completeIn("d2", ttl.DefaultClass, fpA, 200)
	v.completeIn("s", "short", fpA, 200)
	v.completeIn("m", "money", fpA, 200)

	got, err := v.e.Get(ctx, id("s"))
	require.NoError(t, err)
	require.Equal(t, "short", got.Class)
	require.WithinDuration(t, t0.Add(time.Hour), got.Expires, 0)
	got, err = v.e.Get(ctx, id("d2"))
	require.NoError(t, err)
	require.Empty(t, got.Class, "the default class is stored as none")

	// Every read switches at the expiry instant, from the replay cache and
	// from disk alike.
	check := func(key string, window time.Duration) {
		t.Helper()
		for _, reopen := range []bool{false, true} {
			v.clock.Advance(window - time.Second - v.clock.Now().Sub(t0))
			if reopen {
				v.reopen()
			}
			require.Equal(t, idemkv.Replay, v.claim(id(key), fpA, idemkv.ModeLocal).Outcome, key)
			v.clock.Advance(time.Second)
			_, err := v.e.Get(ctx, id(key))
			require.ErrorIs(t, err, idemkv.ErrNotFound, key)
			if reopen {
				c := v.claim(id(key), fpB, idemkv.ModeLocal)
				require.Equal(t, idemkv.Acquired, c.Outcome, key)
				require.NoError(t, v.e.Release(ctx, c.Lease, nil))
			}
			// Rewind for the next round: the fake clock only moves forward,
			// so rebuild the clock at t0.
			v.clock = fakeclock.New(t0)
			v.opts.Clock = v.clock
			v.reopen()
		}
	}
	check("s", time.Hour)
	check("d", 24*time.Hour)
	check("m", 30*24*time.Hour)
}

func TestRetentionClassErrors(t *testing.T) {
	v := newSweepEnv(t, nil)
	for _, class := range []string{"nope", "Short", string(make([]byte, 40))} {
		_, err := v.e.Claim(ctx, idemkv.ClaimRequest{ID: id("k"), Fingerprint: fpA, Retention: class})
		require.ErrorIs(t, err, idemkv.ErrInvalidArgument, class)
	}
	require.Empty(t, v.stored())

	bad := []Options{
		{RetentionClasses: ttl.Classes{"default": time.Hour}},
		{RetentionClasses: ttl.Classes{"x": 0}},
		{RetentionClasses: ttl.Classes{"Bad Name": time.Hour}},
		{RetentionClasses: ttl.Classes{"tiny": time.Second}, Lease: time.Minute},
		{Sweep: ttl.Options{Interval: -time.Second}},
		{Sweep: ttl.Options{ChunkSize: -1}},
	}
	for i, o := range bad {
		_, err := Open(t.TempDir(), &o)
		require.Error(t, err, "options %d", i)
	}
}

func TestRetentionClassKeptByRetriesAndTakeovers(t *testing.T) {
	v := newSweepEnv(t, nil)
	c, err := v.e.Claim(ctx, idemkv.ClaimRequest{ID: id("k"), Fingerprint: fpA, Retention: "short"})
	require.NoError(t, err)
	v.clock.Advance(time.Minute) // lease expired: a takeover naming another class
	c2, err := v.e.Claim(ctx, idemkv.ClaimRequest{ID: id("k"), Fingerprint: fpA, Retention: "money"})
	require.NoError(t, err)
	require.Equal(t, idemkv.Acquired, c2.Outcome)
	require.Greater(t, c2.Lease.Token, c.Lease.Token)
	require.NoError(t, v.e.Complete(ctx, c2.Lease, idemkv.Result{Status: 200}, nil))
	got, err := v.e.Get(ctx, id("k"))
	require.NoError(t, err)
	require.Equal(t, "short", got.Class)
	require.WithinDuration(t, v.clock.Now().Add(time.Hour), got.Expires, 0)
}

func TestRemovedClassGetsLongestWindow(t *testing.T) {
	v := newSweepEnv(t, nil)
	c, err := v.e.Claim(ctx, idemkv.ClaimRequest{ID: id("k"), Fingerprint: fpA, Mode: idemkv.ModeRemote, Retention: "short"})
	require.NoError(t, err)
	// The operator drops "short" while the remote claim is open.
	require.NoError(t, v.e.Close())
	v.opts.RetentionClasses = ttl.Classes{"money": 30 * 24 * time.Hour}
	v.open()
	require.NoError(t, v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 200}, nil))
	got, err := v.e.Get(ctx, id("k"))
	require.NoError(t, err)
	require.WithinDuration(t, v.clock.Now().Add(30*24*time.Hour), got.Expires, 0)
}

// TestSweepDeletesOnlyExpiredSettledRecords puts one record in every
// situation the sweeper must judge and checks what a pass leaves on disk.
func TestSweepDeletesOnlyExpiredSettledRecords(t *testing.T) {
	v := newSweepEnv(t, nil)
	for i := range 20 {
		v.completeIn("old-"+strconv.Itoa(i), "short", fpA, 200)
	}
	v.completeIn("young", "", fpA, 200)
	unc, err := v.e.Claim(ctx, idemkv.ClaimRequest{ID: id("uncertain"), Fingerprint: fpA, Mode: idemkv.ModeRemote, Retention: "short"})
	require.NoError(t, err)
	require.NoError(t, v.e.MarkUncertain(ctx, unc.Lease, "timeout"))
	// A remote claim whose lease outlives its record's expiry.
	live, err := v.e.Claim(ctx, idemkv.ClaimRequest{ID: id("live"), Fingerprint: fpA, Mode: idemkv.ModeRemote, Retention: "short", Lease: 50 * time.Minute})
	require.NoError(t, err)
	// A remote claim abandoned by its holder: its outcome is unknown.
	_, err = v.e.Claim(ctx, idemkv.ClaimRequest{ID: id("abandoned"), Fingerprint: fpA, Mode: idemkv.ModeRemote, Retention: "short"})
	require.NoError(t, err)
	v.completeIn("reclaimed", "short", fpA, 200)

	v.clock.Advance(45 * time.Minute)
	live.Lease, err = v.e.Renew(ctx, live.Lease, 30*time.Minute)
	require.NoError(t, err)
	v.clock.Advance(20 * time.Minute) // past every "short" expiry; the live lease runs to 75 min
	// A new local holder of an expired key.
	re := v.claim(id("reclaimed"), fpB, idemkv.ModeLocal)
	require.Equal(t, idemkv.Acquired, re.Outcome)

	p, err := v.e.Sweep(ctx)
	require.NoError(t, err)
	// The old record of "reclaimed" is dropped with its bucket: it has
	// expired, and the holder's outcome will go into a bucket of its own.
	require.Equal(t, 21, p.Deleted)
	require.Equal(t, 3, p.Held, "uncertain, live, abandoned")
	require.Equal(t, 24, p.Examined, "21 in ended buckets, 3 unsettled")
	require.Greater(t, p.Chunks, 3)

	left := v.stored()
	require.Len(t, left, 4)
	for _, k := range []string{"young", "uncertain", "live", "abandoned"} {
		require.Contains(t, left, k)
	}
	st, err := v.e.Stats()
	require.NoError(t, err)
	require.Equal(t, 3, st.Sweep.HeldPastExpiry())
	require.EqualValues(t, 21, st.Sweep.Deleted)

	// The holders finish; the held records then go their ways.
	require.NoError(t, v.e.Complete(ctx, re.Lease, idemkv.Result{Status: 201}, nil))
	require.NoError(t, v.e.Complete(ctx, live.Lease, idemkv.Result{Status: 202}, nil))
	require.NoError(t, v.e.Resolve(ctx, idemkv.ResolveRequest{ID: id("uncertain"), Token: unc.Lease.Token, NoEffect: true}))
	p, err = v.e.Sweep(ctx)
	require.NoError(t, err)
	require.Zero(t, p.Deleted)
	require.Equal(t, 1, p.Held, "abandoned")
	require.Equal(t, idemkv.Replay, v.claim(id("reclaimed"), fpB, idemkv.ModeLocal).Outcome)

	// Twice is harmless.
	p2, err := v.e.Sweep(ctx)
	require.NoError(t, err)
	require.Zero(t, p2.Deleted)
	require.Len(t, v.stored(), 4, "young, live, abandoned, reclaimed")
}

// TestSweepNeverDeletesARewrittenRecord races passes against holders that
// re-claim and complete expired keys: whatever the interleaving, each new
// record survives: it goes into a bucket that has not ended, and the
// sweeper drops only buckets that have.
func TestSweepNeverDeletesARewrittenRecord(t *testing.T) {
	v := newSweepEnv(t, func(o *Options) { o.Sweep.ChunkSize = 3; o.Shards = 4 })
	const n = 200
	for i := range n {
		v.completeIn("k"+strconv.Itoa(i), "short", fpA, 200)
	}
	v.clock.Advance(2 * time.Hour)

	stop := make(chan struct{})
	swept := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				swept <- nil
				return
			default:
			}
			if _, err := v.e.Sweep(ctx); err != nil {
				swept <- err
				return
			}
		}
	}()
	var writers sync.WaitGroup
	errs := make(chan error, n)
	for w := range 4 {
		writers.Go(func() {
			for i := w; i < n; i += 4 {
				c, err := v.e.Claim(ctx, idemkv.ClaimRequest{ID: id("k" + strconv.Itoa(i)), Fingerprint: fpB})
				if err == nil && c.Outcome != idemkv.Acquired {
					err = fmt.Errorf("k%d: %v", i, c.Outcome)
				}
				if err == nil {
					err = v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, nil)
				}
				if err != nil {
					errs <- err
				}
			}
		})
	}
	writers.Wait()
	close(stop)
	require.NoError(t, <-swept)
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	_, err := v.e.Sweep(ctx)
	require.NoError(t, err)
	left := v.stored()
	require.Len(t, left, n)
	for i := range n {
		rec := left["k"+strconv.Itoa(i)]
		require.Equal(t, 201, rec.Result.Status, i)
	}
}

// TestSweepDropsOnlyEndedBuckets: records go into the bucket of their
// class that ends at or after their expiry, and a pass drops exactly the
// buckets that have ended, however the records in them were written; a
// record rewritten after its old one expired lands in a new bucket and
// survives the drop of the old one.
func TestSweepDropsOnlyEndedBuckets(t *testing.T) {
	v := newSweepEnv(t, nil)
	width := time.Hour / bucketsPerWindow // of "short"
	// Align the clock to a bucket boundary, so that the records below
	// fall in the buckets the test expects.
	end := record.BucketEnd(v.clock.Now(), width)
	v.clock.Advance(time.Unix(int64(end), 0).Sub(v.clock.Now()))
	v.completeIn("rewritten", "short", fpA, 200) // in b0's bucket
	for i := range 3 {
		for j := range 4 {
			v.completeIn(fmt.Sprintf("b%d-%d", i, j), "short", fpA, 200)
		}
		v.clock.Advance(width)
	}
	// The buckets of b0 and b1 have ended (b1's just now); b2's has not.
	v.clock.Advance(time.Hour - 2*width)
	require.Equal(t, idemkv.Acquired, v.claim(id("b0-0"), fpB, idemkv.ModeLocal).Outcome, "expired")
	v.completeIn("rewritten", "", fpB, 201) // into a new bucket

	p, err := v.e.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 9, p.Deleted, "b0, b1 and the old rewritten")
	left := v.stored()
	require.Len(t, left, 5, "b2-0..3, rewritten")
	for j := range 4 {
		require.Contains(t, left, fmt.Sprintf("b2-%d", j))
	}
	require.Equal(t, 201, left["rewritten"].Result.Status)
	buckets := 0
	require.NoError(t, scanBuckets(v.e.db, func([]byte, uint64) error { buckets++; return nil }))
	require.Equal(t, 2, buckets, "b2's, and the default class's")

	// Past b2's end, only the default class is left.
	v.clock.Advance(width)
	p, err = v.e.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 4, p.Deleted)
	require.Len(t, v.stored(), 1)
	require.Equal(t, idemkv.Replay, v.claim(id("rewritten"), fpB, idemkv.ModeLocal).Outcome)
}

// TestSweepResumesAfterRestart interrupts a pass and restarts the engine:
// the next pass resumes from the saved position, and drops the bucket it
// was in the middle of once it has read to its end.
func TestSweepResumesAfterRestart(t *testing.T) {
	v := newSweepEnv(t, nil)
	width := time.Hour / bucketsPerWindow
	for i := range 5 { // five buckets of ten
		for j := range 10 {
			v.completeIn(fmt.Sprintf("k%d%d", i, j), "short", fpA, 200)
		}
		v.clock.Advance(width)
	}
	v.clock.Advance(2 * time.Hour)
	// Three chunks by hand, as an interrupted pass would leave them: two
	// buckets read and dropped, one record of the third read.
	tgt := sweepTarget{v.e}
	var cursor []byte
	for range 3 {
		c, err := tgt.SweepChunk(ctx, cursor, 7, v.clock.Now())
		require.NoError(t, err)
		cursor = c.Next
	}
	require.Len(t, v.stored(), 50-20)
	v.reopen()
	saved, err := sweepTarget{v.e}.SweepCursor()
	require.NoError(t, err)
	require.Equal(t, cursor, saved)
	p, err := v.e.Sweep(ctx)
	require.NoError(t, err)
	require.True(t, p.Resumed)
	require.Equal(t, 29, p.Examined, "the resumed pass starts where the first stopped")
	require.Equal(t, 29, p.Deleted, "a pass counts the records it read")
	require.Empty(t, v.stored())
	saved, err = sweepTarget{v.e}.SweepCursor()
	require.NoError(t, err)
	require.Nil(t, saved, "a finished pass leaves no position")
}

// TestSweepCrashMidPass crashes the filesystem in the middle of a pass, with
// none, half or all of the unsynced writes lost, and checks that nothing
// unexpired was lost and no expired record is readable.
func TestSweepCrashMidPass(t *testing.T) {
	for _, pct := range []int{0, 50, 100} {
		t.Run(fmt.Sprintf("unsynced-%d%%", pct), func(t *testing.T) {
			fs := vfs.NewCrashableMem()
			clock := fakeclock.New(t0)
			opts := &Options{FS: fs, Clock: clock, CacheSize: 1 << 20, MemTableSize: 1 << 20,
				RetentionClasses:  ttl.Classes{"short": time.Hour},
				NoBackgroundSweep: true, Sweep: ttl.Options{ChunkSize: 5}}
			e, err := Open("db", opts)
			require.NoError(t, err)
			want := map[string]int{}
			for i := range 60 {
				key, class := fmt.Sprintf("k%03d", i), "short"
				if i%3 == 0 {
					class = "" // 24 h: unexpired when the pass runs
					want[key] = 200 + i
				}
				c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id(key), Fingerprint: fpA, Retention: class})
				require.NoError(t, err)
				require.NoError(t, e.Complete(ctx, c.Lease, idemkv.Result{Status: 200 + i}, nil))
				clock.Advance(20 * time.Second) // over several buckets
			}
			clock.Advance(2 * time.Hour)
			tgt := sweepTarget{e}
			var cursor []byte
			for range 6 {
				c, err := tgt.SweepChunk(ctx, cursor, 5, clock.Now())
				require.NoError(t, err)
				cursor = c.Next
			}
			crashed := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: pct, RNG: rand.New(rand.NewPCG(uint64(pct), 1))})
			require.NoError(t, e.Close())

			opts.FS = crashed
			e, err = Open("db", opts)
			require.NoError(t, err)
			defer e.Close()
			for i := range 60 {
				key := fmt.Sprintf("k%03d", i)
				got, err := e.Get(ctx, id(key))
				if st, ok := want[key]; ok {
					require.NoError(t, err, key)
					require.Equal(t, st, got.Result.Status, key)
				} else {
					require.ErrorIs(t, err, idemkv.ErrNotFound, key)
				}
			}
			_, err = e.Sweep(ctx)
			require.NoError(t, err)
			cen, err := e.Census(ctx)
			require.NoError(t, err)
			require.Equal(t, 20, cen.Completed)
			require.Zero(t, cen.Expired)
		})
	}
}

// TestBackgroundSweeperDeletesWithinOneInterval runs the sweeper Open
// starts, with its timer in the test's hands: records that expire after a
// pass are gone by the end of the next one, which starts one interval
// later.
func TestBackgroundSweeperDeletesWithinOneInterval(t *testing.T) {
	ticks := make(chan time.Time)
	passes := make(chan ttl.Pass, 1)
	v := newSweepEnv(t, func(o *Options) {
		o.NoBackgroundSweep = false
		o.Sweep.Interval = time.Minute
		o.Sweep.After = func(d time.Duration) <-chan time.Time {
			if d > time.Minute {
				t.Errorf("waits %v, longer than the interval", d)
			}
			return ticks
		}
		o.Sweep.OnPass = func(p ttl.Pass) { passes <- p }
	})
	require.Zero(t, (<-passes).Deleted) // the pass at Open: an empty store
	for i := range 30 {
		v.completeIn("k"+strconv.Itoa(i), "short", fpA, 200)
	}
	v.completeIn("keep", "", fpA, 200)
	// Every "short" record expires within the hour, and the bucket holding
	// them ends within one bucket's width after that.
	v.clock.Advance(time.Hour + time.Hour/bucketsPerWindow)
	ticks <- v.clock.Now()
	p := <-passes
	require.Equal(t, 30, p.Deleted)
	require.Len(t, v.stored(), 1)
	st, err := v.e.Stats()
	require.NoError(t, err)
	require.EqualValues(t, 2, st.Sweep.Passes)
	require.NoError(t, v.e.Close()) // stops the loop while it waits
	v.e = nil
}

// TestBackgroundSweeperRetriesAfterAReadError: a pass that fails on a
// transient read error is logged and retried after Sweep.RetryWait, with
// Stats saying the sweeper is failing until a pass succeeds; it then
// deletes what the failed pass could not.
func TestBackgroundSweeperRetriesAfterAReadError(t *testing.T) {
	var armed atomic.Bool
	inj := failingSSTables(&armed, errorfs.OpFileReadAt)
	ticks, waits := make(chan time.Time), make(chan time.Duration, 1)
	passes, failures := make(chan ttl.Pass, 1), make(chan int, 1)
	v := newSweepEnv(t, func(o *Options) {
		o.FS = errorfs.Wrap(vfs.Default, inj)
		o.ReplayCacheSize = -1
		o.NoBackgroundSweep = false
		o.Sweep.Interval = time.Minute
		o.Sweep.RetryWait = time.Second
		o.Sweep.After = func(d time.Duration) <-chan time.Time { waits <- d; return ticks }
		o.Sweep.OnPass = func(p ttl.Pass) { passes <- p }
		o.Sweep.OnError = func(_ error, inARow int) { failures <- inARow }
	})
	require.Zero(t, (<-passes).Deleted) // the pass at Open: an empty store
	<-waits
	for i := range 30 {
		v.completeIn("k"+strconv.Itoa(i), "short", fpA, 200)
	}
	require.NoError(t, v.e.Flush())
	require.NoError(t, v.e.Compact(ctx)) // the records are read from sstables
	v.clock.Advance(time.Hour + time.Hour/bucketsPerWindow)

	armed.Store(true)
	ticks <- v.clock.Now()
	require.Equal(t, 1, <-failures)
	d := <-waits
	require.GreaterOrEqual(t, d, time.Second/2)
	require.LessOrEqual(t, d, time.Second, "the retry wait, not the interval")
	st, err := v.e.Stats()
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Sweep.Failures)
	require.False(t, st.Sweep.FailingSince.IsZero())
	require.ErrorContains(t, st.Sweep.LastError, "injected")

	armed.Store(false)
	ticks <- v.clock.Now()
	require.Equal(t, 30, (<-passes).Deleted)
	<-waits
	st, err = v.e.Stats()
	require.NoError(t, err)
	require.True(t, st.Sweep.FailingSince.IsZero())
	require.Empty(t, v.stored())
	require.NoError(t, v.e.Close()) // stops the loop while it waits
	v.e = nil
}

// TestSweepGoesOnPastARecordThatDoesNotDecode: an unsettled record that
// does not decode (Check reports it) is kept, and counted as held; the
// passes go on, so that the next ones still drop ended buckets, rather
// than each failing where the last stopped.
func TestSweepGoesOnPastARecordThatDoesNotDecode(t *testing.T) {
	v := newSweepEnv(t, nil)
	v.completeIn("early", "short", fpA, 200)
	require.NoError(t, v.e.db.Set(appendRecordKey(nil, id("garbled")), []byte{1, 0xff}, pebble.Sync))
	v.clock.Advance(2 * time.Hour)
	p, err := v.e.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, p.Deleted)
	require.Equal(t, 1, p.Held, "the record that does not decode")

	v.completeIn("later", "short", fpA, 200)
	v.clock.Advance(2 * time.Hour)
	p, err = v.e.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, p.Deleted, "the next pass drops the next ended bucket")
}
