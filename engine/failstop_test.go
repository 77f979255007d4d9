package engine

import (
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/stretchr/testify/require"
)

// isLogSync reports whether op syncs one of Pebble's log files, the write
// every acknowledged commit waits for.
func isLogSync(op errorfs.Op) bool {
	if !strings.HasSuffix(op.Path, ".log") {
		return false
	}
	switch op.Kind {
	case errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo:
		return true
	}
	return false
}

// failingLogSync fails every sync of Pebble's log while armed.
func failingLogSync(armed *atomic.Bool) errorfs.Injector {
	return errorfs.InjectorFunc(func(op errorfs.Op) error {
		if armed.Load() && isLogSync(op) {
			return errorfs.ErrInjected
		}
		return nil
	})
}

// failingSSTables fails every operation of kind on an sstable while armed.
func failingSSTables(armed *atomic.Bool, kind errorfs.OpKind) errorfs.Injector {
	return errorfs.InjectorFunc(func(op errorfs.Op) error {
		if armed.Load() && op.Kind == kind && strings.HasSuffix(op.Path, ".sst") {
			return errorfs.ErrInjected
		}
		return nil
	})
}

// TestFailedLogSyncFailsTheEngine: a failed sync of Pebble's log, which
// Pebble answers by stopping the process, reaches the caller as ErrFailed
// instead. The process lives on, every later call (reads included) fails
// fast, Close returns at once, and a new process reopens the store with
// every acknowledged completion and nothing of the failed one's effects
// without its outcome.
func TestFailedLogSyncFailsTheEngine(t *testing.T) {
	mem := vfs.NewCrashableMem()
	var armed atomic.Bool
	clock := fakeclock.New(t0)
	opts := &Options{FS: errorfs.Wrap(mem, failingLogSync(&armed)), Clock: clock, CacheSize: 1 << 20, MemTableSize: 1 << 20, NoBackgroundSweep: true}
	e, err := Open("db", opts)
	require.NoError(t, err)

	complete := func(key string) error {
		c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id(key), Fingerprint: fpA})
		if err != nil {
			return err
		}
		require.Equal(t, idemkv.Acquired, c.Outcome)
		return e.Complete(ctx, c.Lease, idemkv.Result{Status: 201, Pointer: "/p/" + key}, func(fx idemkv.Effects) error {
			return fx.Set([]byte("row/"+key), []byte(key))
		})
	}
	require.NoError(t, complete("before"))

	armed.Store(true)
	err = complete("during")
	require.ErrorIs(t, err, idemkv.ErrFailed)
	require.ErrorIs(t, err, errCommitFailed)
	require.ErrorContains(t, err, errorfs.ErrInjected.Error())

	armed.Store(false) // even with the disk back, this process stays failed
	_, err = e.Claim(ctx, idemkv.ClaimRequest{ID: id("after"), Fingerprint: fpA})
	require.ErrorIs(t, err, idemkv.ErrFailed)
	_, err = e.Get(ctx, id("before"))
	require.ErrorIs(t, err, idemkv.ErrFailed)
	_, err = e.GetData(ctx, []byte("row/during"))
	require.ErrorIs(t, err, idemkv.ErrFailed)
	require.ErrorIs(t, e.Close(), idemkv.ErrFailed)

	// A new process: what was synced, with the unsynced tail lost.
	clone := mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
	e2, err := Open("db", &Options{FS: clone, Clock: clock, CacheSize: 1 << 20, NoBackgroundSweep: true})
	require.NoError(t, err)
	defer e2.Close()
	rec, err := e2.Get(ctx, id("before"))
	require.NoError(t, err)
	require.Equal(t, idemkv.StateCompleted, rec.State)
	row, err := e2.GetData(ctx, []byte("row/before"))
	require.NoError(t, err)
	require.Equal(t, "before", string(row))
	rep, err := e2.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%v", rep.Problems)
	// "during" was never acknowledged: a retry runs it anew, or replays it
	// if its commit reached the disk after all, never both.
	c, err := e2.Claim(ctx, idemkv.ClaimRequest{ID: id("during"), Fingerprint: fpA})
	require.NoError(t, err)
	require.Contains(t, []idemkv.Outcome{idemkv.Acquired, idemkv.Replay}, c.Outcome)
}
