package engine

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/stretchr/testify/require"
)

// The wall clock steps in these tests (fakeclock.Step) while elapsed time
// moves only with Advance, as on a machine whose clock NTP or an operator
// sets. Each names the step of docs/operations.md, "Clocks".

// newClockEnv is an env whose replay cache is off, so that every claim
// reads the store: a record the engine lost track of shows as Acquired.
func newClockEnv(t *testing.T, retention time.Duration) *env {
	v := newEnv(t)
	v.opts.ReplayCacheSize = -1
	v.opts.Retention = retention
	v.reopen()
	return v
}

// A step forward is not followed: during it nothing expires early and the
// sweeper deletes nothing; once the clock is corrected, the retry one
// minute after completion replays.
func TestClockStepForwardThenCorrectedAtSweep(t *testing.T) {
	v := newClockEnv(t, 24*time.Hour)
	v.complete(id("p1"))

	v.clock.Step(48 * time.Hour)
	pass, err := v.e.Sweep(ctx)
	require.NoError(t, err)
	require.Zero(t, pass.Deleted, "the sweeper deleted on the word of a stepped clock")
	require.Equal(t, idemkv.Replay, v.claim(id("p1"), fpA, idemkv.ModeLocal).Outcome, "during the step")
	st := v.stats()
	require.EqualValues(t, 1, st.ClockSteps)
	require.Equal(t, 48*time.Hour, st.ClockOffset)

	v.clock.Step(-48 * time.Hour)
	v.clock.Advance(time.Minute)
	require.Equal(t, idemkv.Replay, v.claim(id("p1"), fpA, idemkv.ModeLocal).Outcome, "after the correction")
	require.Zero(t, v.stats().ClockOffset, "the engine follows the corrected clock again")
	require.Len(t, v.stored(), 1)
}

// TrustClock follows the clock as it is: the same step deletes the record.
// This is what every engine did before it checked its clock.
func TestTrustClockFollowsSteps(t *testing.T) {
	v := newEnv(t)
	v.opts.ClockTolerance = TrustClock
	v.opts.NoBackgroundSweep = true // the pass below is the one that deletes
	v.reopen()
	v.complete(id("p1"))
	v.clock.Step(48 * time.Hour)
	pass, err := v.e.Sweep(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, pass.Deleted)
	require.Zero(t, v.stats().ClockSteps)
}

// A store opened while the clock is 48 h ahead follows the clock (it might
// have been closed that long), but deletes nothing it could not tell
// expired before, and follows the correction back.
func TestClockStepForwardAtOpen(t *testing.T) {
	v := newClockEnv(t, 24*time.Hour)
	v.complete(id("p1"))
	require.NoError(t, v.e.Close())

	v.clock.Step(48 * time.Hour)
	v.open()
	pass, err := v.e.sweeper.s.Pass(ctx) // the background sweeper's
	require.NoError(t, err)
	require.Zero(t, pass.Deleted, "the sweeper deleted on the word of a clock wrong at Open")
	require.Len(t, v.stored(), 1)

	v.clock.Step(-48 * time.Hour)
	v.clock.Advance(time.Minute)
	require.Equal(t, idemkv.Replay, v.claim(id("p1"), fpA, idemkv.ModeLocal).Outcome)
	require.EqualValues(t, 1, v.stats().ClockSteps)
}

// A store closed for longer than a retention and opened with a right
// clock: the background sweeper deletes what expired meanwhile once the
// hour in which a correction could still come has passed, an explicit
// Sweep at once.
func TestClockAfterLongDowntime(t *testing.T) {
	v := newClockEnv(t, 24*time.Hour)
	v.complete(id("p1"))
	require.NoError(t, v.e.Close())

	v.clock.Advance(48 * time.Hour)
	v.open()
	require.Equal(t, idemkv.Acquired, v.claim(id("p1"), fpB, idemkv.ModeLocal).Outcome, "expired while the store was closed")
	_, err := v.e.sweeper.s.Pass(ctx)
	require.NoError(t, err)
	require.Len(t, v.stored(), 1, "swept within the hour a correction may come in")

	v.clock.Advance(clockSettle)
	_, err = v.e.sweeper.s.Pass(ctx)
	require.NoError(t, err)
	require.Empty(t, v.stored())
	require.Zero(t, v.stats().ClockSteps)

	v.complete(id("p2"))
	require.NoError(t, v.e.Close())
	v.clock.Advance(48 * time.Hour)
	v.open()
	_, err = v.e.Sweep(ctx)
	require.NoError(t, err)
	require.Empty(t, v.stored(), "an explicit Sweep vouches for the clock")
}

// A claim filter rebuilt during a step forward still holds every stored
// record, so the retry after the correction replays.
func TestClockStepForwardDuringFilterRebuild(t *testing.T) {
	fs := hookFilter(t)
	v := newEnv(t)
	fs.await(t, "built")
	v.opts.ReplayCacheSize = -1
	v.reopenScanning()
	fs.await(t, "built")
	v.complete(id("p1"))

	v.clock.Step(48 * time.Hour)
	v.e.filter.requestBuild()
	fs.await(t, "built")
	v.clock.Step(-48 * time.Hour)
	v.clock.Advance(time.Minute)
	require.Equal(t, idemkv.Replay, v.claim(id("p1"), fpA, idemkv.ModeLocal).Outcome)
	require.EqualValues(t, 2, v.stats().ClaimFilterBuilds)
}

// A step back between claim and completion neither shortens the record's
// retention nor stretches a lease.
func TestClockStepBackBetweenClaimAndCompletion(t *testing.T) {
	v := newClockEnv(t, time.Hour)
	c := v.claim(id("p1"), fpA, idemkv.ModeLocal)
	require.Equal(t, idemkv.Acquired, c.Outcome)
	held := v.claim(id("r1"), fpA, idemkv.ModeRemote) // its holder will crash
	require.Equal(t, idemkv.Acquired, held.Outcome)

	v.clock.Step(-2 * time.Hour)
	require.NoError(t, v.e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, nil))
	wait := v.claim(id("r1"), fpA, idemkv.ModeRemote)
	require.Equal(t, idemkv.InProgress, wait.Outcome)
	require.LessOrEqual(t, wait.RetryAfter, 30*time.Second, "the step back stretched the lease")

	v.clock.Advance(31 * time.Second)
	require.NotEqual(t, idemkv.InProgress, v.claim(id("r1"), fpA, idemkv.ModeRemote).Outcome, "the lease ran out on time")

	v.clock.Step(2 * time.Hour) // corrected
	require.Equal(t, idemkv.Replay, v.claim(id("p1"), fpA, idemkv.ModeLocal).Outcome, "retention shortened by the step")
	require.Equal(t, t0.Add(time.Hour), v.stored()["p1"].Expires.UTC())
}

// A clock set back while the store was closed: Open starts from the time
// the store last persisted, so records keep their retention.
func TestClockStepBackAcrossRestart(t *testing.T) {
	v := newClockEnv(t, time.Hour)
	v.complete(id("p1"))
	v.clock.Advance(10 * time.Minute)
	v.complete(id("p2")) // persists the engine's time, ten minutes on
	require.NoError(t, v.e.Close())

	v.clock.Step(-2 * time.Hour)
	v.open()
	v.clock.Advance(time.Minute)
	require.Equal(t, idemkv.Replay, v.claim(id("p1"), fpA, idemkv.ModeLocal).Outcome)
	c := v.claim(id("p3"), fpA, idemkv.ModeLocal)
	require.Equal(t, idemkv.Acquired, c.Outcome)
	require.False(t, c.Lease.Expires.Before(t0.Add(10*time.Minute+time.Minute+30*time.Second)),
		"engine time went back across the restart: lease ends %v", c.Lease.Expires)
}

// A step forward that holds for an hour is a correction: the engine
// follows it then.
func TestClockStepForwardHeldIsFollowed(t *testing.T) {
	v := newClockEnv(t, 24*time.Hour)
	v.clock.Step(2 * time.Hour)
	require.Equal(t, t0.Add(30*time.Second), v.claim(id("p1"), fpA, idemkv.ModeLocal).Lease.Expires.UTC())
	require.Equal(t, 2*time.Hour, v.stats().ClockOffset)

	v.clock.Advance(clockSettle)
	wall := v.clock.Now()
	require.Equal(t, wall.Add(30*time.Second), v.claim(id("p2"), fpA, idemkv.ModeLocal).Lease.Expires.UTC())
	st := v.stats()
	require.Zero(t, st.ClockOffset)
	require.EqualValues(t, 1, st.ClockSteps)
}

// A step within the tolerance is followed and not counted.
func TestClockStepWithinTolerance(t *testing.T) {
	v := newClockEnv(t, 24*time.Hour)
	v.clock.Step(500 * time.Millisecond)
	wall := v.clock.Now()
	require.Equal(t, wall.Add(30*time.Second), v.claim(id("p1"), fpA, idemkv.ModeLocal).Lease.Expires.UTC())
	require.Zero(t, v.stats().ClockSteps)
}

func TestClockToleranceValidated(t *testing.T) {
	o := Options{ClockTolerance: -time.Second}
	require.ErrorContains(t, o.EnsureDefaults().Validate(), "ClockTolerance")
	o.ClockTolerance = TrustClock
	require.NoError(t, o.EnsureDefaults().Validate())
}

// A store reopened within an hour of every Open still advances its mark:
// while engine time is provisional the mark is the old one plus the time
// elapsed since Open.
func TestClockMarkAdvancesWhileProvisional(t *testing.T) {
	v := newClockEnv(t, 24*time.Hour)
	for i := range 3 {
		require.NoError(t, v.e.Close())
		v.clock.Advance(5 * time.Second) // closed longer than the tolerance
		v.open()
		v.clock.Advance(50 * time.Minute)
		v.complete(id(fmt.Sprint("k", i)))
	}
	mark, err := readClockMark(v.e.db)
	require.NoError(t, err)
	require.False(t, mark.Before(t0.Add(3*50*time.Minute)), "the mark is stuck at %v", mark)
}

// Steps forward each within the tolerance, repeated, add up to a step:
// the engine notices it (ClockSteps, ClockOffset) rather than following
// the wall clock a step at a time, so a lease still runs its time.
func TestClockStepsWithinToleranceAddUp(t *testing.T) {
	v := newClockEnv(t, 24*time.Hour)
	require.Equal(t, idemkv.Acquired, v.claim(id("held"), fpA, idemkv.ModeLocal).Outcome)
	for range 15 { // 18 s elapse; the wall clock runs 14.25 s ahead
		v.clock.Advance(1200 * time.Millisecond) // past the lock-free path's span
		v.clock.Step(950 * time.Millisecond)
		v.e.Now()
	}
	require.WithinDuration(t, t0.Add(18*time.Second), v.e.Now(), 2*time.Second,
		"engine time followed the wall clock a step at a time")
	require.Equal(t, idemkv.InProgress, v.claim(id("held"), fpA, idemkv.ModeLocal).Outcome,
		"a 30 s lease taken over after 18 s")
	st := v.stats()
	require.EqualValues(t, 1, st.ClockSteps)
	require.Greater(t, st.ClockOffset, 12*time.Second)
}

// A further step forward while the clock is already ahead starts its own
// hour: it is not followed on the strength of the first step's.
func TestClockFurtherStepForwardStartsItsOwnHour(t *testing.T) {
	v := newClockEnv(t, 24*time.Hour)
	v.clock.Step(2 * time.Minute)
	v.claim(id("a"), fpA, idemkv.ModeLocal)
	v.clock.Advance(59 * time.Minute)
	v.claim(id("b"), fpA, idemkv.ModeLocal)
	v.clock.Step(365 * 24 * time.Hour)
	v.clock.Advance(time.Minute)
	c := v.claim(id("c"), fpA, idemkv.ModeLocal)
	require.Equal(t, t0.Add(60*time.Minute+30*time.Second), c.Lease.Expires.UTC(), "engine time followed the year")
}

// A panic while a group commits (out of the clock's stamp, say) fails the
// commit for every writer in the group, not only its leader.
func TestCommitterPanicFailsTheWholeGroup(t *testing.T) {
	v := newEnv(t)
	c := newCommitter(v.e.db)
	c.stamp = func(*pebble.Batch) { panic("clock failed") }
	b1, b2 := v.e.db.NewBatch(), v.e.db.NewBatch()
	defer b1.Close()
	defer b2.Close()
	require.NoError(t, b1.Set([]byte("\x03one"), nil, nil))
	require.NoError(t, b2.Set([]byte("\x03two"), nil, nil))
	g, first, err := c.enqueue(b1, true, nil)
	require.NoError(t, err)
	require.True(t, first)
	g2, first2, err := c.enqueue(b2, true, nil)
	require.NoError(t, err)
	require.False(t, first2)
	require.Same(t, g, g2)
	member := make(chan error, 1)
	go func() { member <- c.wait(g, false) }()
	require.Error(t, c.wait(g, true))
	require.ErrorIs(t, <-member, errCommitFailed, "a member was told its write is durable")
	require.NotNil(t, c.failed.Load())
}

// Engine time never goes backwards for any reader, on the lock-free path
// or under the lock, while the clock moves on and is stepped back a little
// (within the tolerance) and a lot.
func TestEngineTimeIsMonotonicUnderConcurrentReaders(t *testing.T) {
	clock := fakeclock.New(t0)
	ec := newEngineClock(clock, time.Second, time.Time{}, func(string, ...any) {})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			prev := ec.Now()
			for {
				select {
				case <-stop:
					return
				default:
				}
				now := ec.Now()
				if now.Before(prev) {
					t.Errorf("engine time went back from %v to %v", prev, now)
					return
				}
				prev = now
			}
		})
	}
	for i := range 3000 {
		clock.Advance(time.Millisecond)
		switch i % 500 {
		case 100:
			clock.Step(-500 * time.Millisecond)
		case 300:
			clock.Step(-2 * time.Second)
		case 400:
			clock.Step(2 * time.Second)
		}
	}
	close(stop)
	wg.Wait()
}
