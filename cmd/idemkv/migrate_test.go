package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/internal/upgradetest"
	"github.com/idemkv/idemkv/internal/upgradetest/replay"
)

// layout3Fixture is the store the layout-3 code wrote (engine's test data).
const layout3Fixture = "../../engine/testdata/layout3"

// TestMigrateCommand runs migrate on a copy of the layout-3 store: it
// refuses bad flags, a backup directory that exists or overlaps the store,
// and a store whose lock is held, each before changing anything; a dry
// run changes nothing; a run copies the store aside, migrates and checks
// it; the backup is the store in layout 3, which restore puts in place
// and migrate migrates again; the migrated store replays every outcome
// through the middleware; a second run finds nothing to migrate.
func TestMigrateCommand(t *testing.T) {
	ctx := context.Background()
	f := upgradetest.Load(t, layout3Fixture)
	dir := f.CopyStore(t)
	backup := filepath.Join(t.TempDir(), "backup")
	var out, errOut bytes.Buffer
	exec := func(args ...string) int {
		out.Reset()
		errOut.Reset()
		return run(ctx, append([]string{"migrate"}, args...), &out, &errOut)
	}
	layout := func(dir string) uint64 {
		l, err := engine.StoredLayout(dir, nil)
		require.NoError(t, err)
		return l
	}

	require.Equal(t, exitUsage, exec("--data", dir), "a backup or --no-backup is required")
	require.Equal(t, exitUsage, exec("--data", dir, "--backup-to", backup, "--no-backup"))
	require.Equal(t, exitFail, exec("--data", dir, "--backup-to", filepath.Join(dir, "bk")))
	require.Contains(t, errOut.String(), "overlap")
	require.Equal(t, exitFail, exec("--data", dir, "--backup-to", t.TempDir()))
	require.Contains(t, errOut.String(), "exists")
	lock, err := pebble.LockDirectory(dir, vfs.Default)
	require.NoError(t, err)
	require.Equal(t, exitFail, exec("--data", dir, "--backup-to", backup))
	require.Contains(t, errOut.String(), "open in another process")
	require.NoError(t, lock.Close())
	require.NoDirExists(t, backup)

	require.Equal(t, exitOK, exec("--data", dir, "--backup-to", backup, "--dry-run"), errOut.String())
	require.Contains(t, out.String(), fmt.Sprintf("layout   3: a read-write Open migrates it to %d (dry run: nothing done)", engine.Layout))
	require.NoDirExists(t, backup)
	require.Equal(t, exitOK, exec("--data", dir, "--dry-run"), "a dry run needs no backup: %s", errOut.String())
	require.Contains(t, out.String(), "dry run: nothing done")
	require.Equal(t, uint64(3), layout(dir))

	require.Equal(t, exitOK, exec("--data", dir, "--backup-to", backup, "--json"), errOut.String())
	var rep migrateReport
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep))
	require.Equal(t, [2]uint64{3, engine.Layout}, [2]uint64{rep.FromLayout, rep.ToLayout})
	require.True(t, rep.Migrated)
	require.Equal(t, backup, rep.Backup)
	require.Positive(t, rep.BackupBytes)
	require.NotNil(t, rep.Check)
	require.Zero(t, rep.Check.ProblemCount, "%v", rep.Check.Problems)
	require.Equal(t, len(f.Requests), rep.Check.Records)
	require.Equal(t, len(f.Keys(upgradetest.Uncertain))+len(f.Keys(upgradetest.Abandoned)), rep.Check.Pending)
	require.Equal(t, uint64(engine.Layout), layout(dir))

	// The backup is the store as the layout-3 code left it: restore puts
	// it in place (a rollback), and migrate migrates that copy too.
	require.Equal(t, uint64(3), layout(backup))
	restored := filepath.Join(t.TempDir(), "restored")
	out.Reset()
	require.Equal(t, exitOK, run(ctx, []string{"restore", "--from", backup, "--data", restored, "--json"}, &out, &errOut), errOut.String())
	var rr backupReport
	require.NoError(t, json.Unmarshal(out.Bytes(), &rr))
	require.Equal(t, uint64(3), rr.Layout)
	require.Nil(t, rr.Check)
	require.Equal(t, uint64(3), layout(restored))
	require.Equal(t, exitOK, exec("--data", restored, "--no-backup"), errOut.String())
	require.Contains(t, out.String(), fmt.Sprintf("layout   3 -> %d: migrated in place", engine.Layout))
	require.Contains(t, out.String(), "backup   none (--no-backup)")
	require.Contains(t, out.String(), "ok: every invariant holds")

	// A store in the current layout: nothing to migrate, and the check.
	require.Equal(t, exitOK, exec("--data", dir, "--no-backup"), errOut.String())
	require.Contains(t, out.String(), fmt.Sprintf("layout   %d: the current layout, nothing to migrate", engine.Layout))
	require.Contains(t, out.String(), "ok: every invariant holds")

	// The migrated store replays what the layout-3 code stored. The
	// migration ran on the machine's clock; the fixture's own time is
	// trusted as given so that its records are not expired.
	e, err := engine.Open(dir, &engine.Options{Clock: fakeclock.New(f.End.Add(time.Second)), ClockTolerance: engine.TrustClock,
		Lease: f.Lease(), Retention: f.Retention(), RetentionClasses: f.Classes(), NoBackgroundSweep: true})
	require.NoError(t, err)
	defer e.Close()
	srv := replay.Serve(t, f, e, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("handler ran for %s %s: a stored outcome was not replayed", r.Method, r.URL.Path)
		w.WriteHeader(http.StatusInternalServerError)
	}))
	replay.RequireReplays(t, f, srv.URL)
}

// TestRestoreChecksAnEarlierLayoutItReads: a copy of the layout-5
// fixture restores checked, as a read-only Open reads layout 5, and its
// layout is reported; the copy is left in layout 5.
func TestRestoreChecksAnEarlierLayoutItReads(t *testing.T) {
	f := upgradetest.Load(t, "../../engine/testdata/layout5")
	restored := filepath.Join(t.TempDir(), "restored")
	var out, errOut bytes.Buffer
	require.Equal(t, exitOK, run(context.Background(), []string{"restore", "--from", filepath.Join(f.Dir, "store"), "--data", restored, "--json"}, &out, &errOut), errOut.String())
	var rr backupReport
	require.NoError(t, json.Unmarshal(out.Bytes(), &rr))
	require.Equal(t, uint64(5), rr.Layout)
	require.NotNil(t, rr.Check, "checked")
	require.Zero(t, rr.Check.ProblemCount, "%v", rr.Check.Problems)
	require.Equal(t, len(f.Keys(upgradetest.Completed))+len(f.Keys(upgradetest.Uncertain))+len(f.Keys(upgradetest.Abandoned)), rr.Check.Records)
	l, err := engine.StoredLayout(restored, nil)
	require.NoError(t, err)
	require.Equal(t, uint64(5), l)
}

// TestMigrateRefusesUnreadableLayouts: a store no Open reads is refused
// before any backup is taken.
func TestMigrateRefusesUnreadableLayouts(t *testing.T) {
	f := upgradetest.Load(t, layout3Fixture)
	dir := f.CopyStore(t)
	db, err := pebble.Open(dir, (&engine.Options{}).EnsureDefaults().PebbleOptions())
	require.NoError(t, err)
	// The engine's layout marker (its on-disk format's LayoutKey): a
	// layout no release wrote.
	layoutKey := []byte{0x01, 'l', 'a', 'y', 'o', 'u', 't'}
	require.NoError(t, db.Set(layoutKey, binary.BigEndian.AppendUint64(nil, 99), pebble.Sync))
	require.NoError(t, db.Close())
	backup := filepath.Join(t.TempDir(), "backup")
	var out, errOut bytes.Buffer
	require.Equal(t, exitFail, run(context.Background(), []string{"migrate", "--data", dir, "--backup-to", backup}, &out, &errOut))
	require.Contains(t, errOut.String(), "layout 99")
	require.NoDirExists(t, backup)
	require.Equal(t, exitFail, run(context.Background(), []string{"migrate", "--data", t.TempDir(), "--no-backup"}, &out, &errOut),
		"a directory without a store")
}
