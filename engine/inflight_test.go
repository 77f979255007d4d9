package engine

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/stretchr/testify/require"
)

// walStall holds the next WAL sync once armed, until released, so a test
// can act while a write is visible in Pebble but not yet durable.
type walStall struct {
	armed   atomic.Bool
	once    sync.Once
	stalled chan struct{}
	release chan struct{}
}

func (s *walStall) inject(op errorfs.Op) error {
	if s.armed.Load() && isLogSync(op) {
		s.once.Do(func() { close(s.stalled) })
		<-s.release
	}
	return nil
}

func openStalling(t *testing.T) (*Engine, *fakeclock.Clock, *walStall) {
	s := &walStall{stalled: make(chan struct{}), release: make(chan struct{})}
	clock := fakeclock.New(t0)
	e, err := Open(t.TempDir(), &Options{FS: errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(s.inject)), Clock: clock})
	require.NoError(t, err)
	t.Cleanup(func() {
		if s.armed.Swap(false) {
			close(s.release)
		}
		_ = e.Close()
	})
	return e, clock, s
}

// TestNoDirtyReplay: while a completion is synced, a duplicate is told
// InProgress; it never replays a result a crash could still take back.
func TestNoDirtyReplay(t *testing.T) {
	e, _, s := openStalling(t)
	req := idemkv.ClaimRequest{ID: id("k"), Fingerprint: fpA}
	a, err := e.Claim(ctx, req)
	require.NoError(t, err)
	s.armed.Store(true)
	done := make(chan error)
	go func() { done <- e.Complete(ctx, a.Lease, idemkv.Result{Status: 201, Body: []byte("r")}, nil) }()
	<-s.stalled // the completion is in Pebble's memtable, its WAL sync is held
	c, err := e.Claim(ctx, req)
	require.NoError(t, err)
	require.Equal(t, idemkv.InProgress, c.Outcome, "a duplicate must not see a result that is not durable")
	rec, err := e.Get(ctx, id("k"))
	require.NoError(t, err)
	require.Equal(t, idemkv.StateInProgress, rec.State)
	s.armed.Store(false)
	close(s.release)
	require.NoError(t, <-done)
	c, err = e.Claim(ctx, req)
	require.NoError(t, err)
	require.Equal(t, idemkv.Replay, c.Outcome)
}

// TestHolderWaitsForTakeoverWrite: a remote holder whose expired lease is
// being turned uncertain is not told ErrFenced until that change is
// durable and visible; once it returns, every read agrees with it.
func TestHolderWaitsForTakeoverWrite(t *testing.T) {
	e, clock, s := openStalling(t)
	a, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id("k"), Fingerprint: fpA, Mode: idemkv.ModeRemote})
	require.NoError(t, err)
	clock.Advance(time.Minute)
	s.armed.Store(true)
	conv := make(chan idemkv.Claim, 1)
	go func() {
		c, _ := e.Claim(ctx, idemkv.ClaimRequest{ID: id("k"), Fingerprint: fpA})
		conv <- c
	}()
	<-s.stalled // the turn to uncertain is in flight

	waiting := make(chan struct{})
	e.testHookWait = func() { close(waiting) }
	fenced := make(chan error, 1)
	go func() { fenced <- e.Complete(ctx, a.Lease, idemkv.Result{Status: 200}, nil) }()
	select {
	case <-waiting: // the holder waits for the write instead of answering early
		rec, err := e.Get(ctx, id("k"))
		require.NoError(t, err)
		require.Equal(t, idemkv.StateInProgress, rec.State)
		s.armed.Store(false)
		close(s.release)
		require.ErrorIs(t, <-fenced, idemkv.ErrFenced)
	case err := <-fenced: // answered without waiting: reads must agree now
		require.ErrorIs(t, err, idemkv.ErrFenced)
		rec, err := e.Get(ctx, id("k"))
		require.NoError(t, err)
		require.Equal(t, idemkv.StateUncertain, rec.State, "fenced before the change that fences it")
	}
	rec, err := e.Get(ctx, id("k"))
	require.NoError(t, err)
	require.Equal(t, idemkv.StateUncertain, rec.State, "the fence and the state it reports go together")
	require.Equal(t, idemkv.Reconciling, (<-conv).Outcome)
}

// TestConcurrentResolve: a resolution racing another waits for it and then
// answers from the state it left, as if they ran one after the other.
func TestConcurrentResolve(t *testing.T) {
	e, _, s := openStalling(t)
	a, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id("k"), Fingerprint: fpA, Mode: idemkv.ModeRemote})
	require.NoError(t, err)
	require.NoError(t, e.MarkUncertain(ctx, a.Lease, "timeout"))
	s.armed.Store(true)
	first := make(chan error, 1)
	go func() {
		first <- e.Resolve(ctx, idemkv.ResolveRequest{ID: id("k"), Token: a.Lease.Token, NoEffect: true})
	}()
	<-s.stalled

	waiting := make(chan struct{})
	e.testHookWait = func() { close(waiting) }
	second := make(chan error, 1)
	go func() {
		second <- e.Resolve(ctx, idemkv.ResolveRequest{ID: id("k"), Token: a.Lease.Token, Result: idemkv.Result{Status: 200}})
	}()
	select {
	case <-waiting:
	case err := <-second: // answered without waiting: must agree with reads now
		_, gerr := e.Get(ctx, id("k"))
		require.ErrorIs(t, gerr, idemkv.ErrNotFound, "second Resolve answered %v before the first took effect", err)
	}
	s.armed.Store(false)
	close(s.release)
	require.NoError(t, <-first)
	select {
	case err := <-second:
		require.ErrorIs(t, err, idemkv.ErrNotFound, "the first resolution removed the record")
	default:
	}
	_, err = e.Get(ctx, id("k"))
	require.ErrorIs(t, err, idemkv.ErrNotFound)
}
