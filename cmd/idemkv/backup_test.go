package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
)

// TestBackupRestoreCommands: backup copies a store no process holds,
// restore puts the copy in place in a new directory and checks it, and
// the restored store replays every outcome; neither overwrites anything.
func TestBackupRestoreCommands(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	e, err := engine.Open(dir, &engine.Options{NoBackgroundSweep: true})
	require.NoError(t, err)
	id := func(i int) idemkv.ID { return idemkv.ID{Tenant: "t", Endpoint: "POST /x", Key: fmt.Sprint("k", i)} }
	for i := range 20 {
		c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id(i), Fingerprint: []byte{1}})
		require.NoError(t, err)
		require.NoError(t, e.Complete(ctx, c.Lease, idemkv.Result{Status: 201, Pointer: fmt.Sprint("/x/", i)},
			func(fx idemkv.Effects) error { return fx.Set(fmt.Appendf(nil, "x/%d", i), []byte("v")) }))
	}
	require.NoError(t, e.Close())

	backup := filepath.Join(t.TempDir(), "backup")
	var out, errOut bytes.Buffer
	require.Equal(t, exitOK, run(ctx, []string{"backup", "--data", dir, "--to", backup}, &out, &errOut), errOut.String())
	require.Contains(t, out.String(), "backed up")
	errOut.Reset()
	require.Equal(t, exitFail, run(ctx, []string{"backup", "--data", dir, "--to", backup}, &out, &errOut), "an existing backup is not overwritten")
	require.Equal(t, exitUsage, run(ctx, []string{"backup", "--data", dir}, &out, &errOut))
	// A copy into the source itself would never end.
	errOut.Reset()
	require.Equal(t, exitFail, run(ctx, []string{"backup", "--data", dir, "--to", filepath.Join(dir, "bk")}, &out, &errOut))
	require.Contains(t, errOut.String(), "overlap")
	require.NoDirExists(t, filepath.Join(dir, "bk"))
	errOut.Reset()
	require.Equal(t, exitFail, run(ctx, []string{"restore", "--from", backup, "--data", filepath.Join(backup, "sub", "restored")}, &out, &errOut))
	require.Contains(t, errOut.String(), "overlap")

	// A restore that fails (here: not a backup) leaves nothing behind, so
	// that serve cannot start an empty store there, and the same
	// directory takes the right backup after.
	restored := filepath.Join(t.TempDir(), "restored")
	notBackup := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(notBackup, "notes.txt"), []byte("x"), 0o600))
	require.Equal(t, exitFail, run(ctx, []string{"restore", "--from", notBackup, "--data", restored}, &out, &errOut))
	require.Contains(t, errOut.String(), "does not open as a store")
	require.NoDirExists(t, restored)
	left, err := os.ReadDir(filepath.Dir(restored))
	require.NoError(t, err)
	require.Empty(t, left, "no staging copy is left")
	out.Reset()
	errOut.Reset()
	require.Equal(t, exitOK, run(ctx, []string{"restore", "--from", backup, "--data", restored, "--json"}, &out, &errOut), errOut.String())
	var rep backupReport
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep))
	require.Equal(t, 20, rep.Check.Completed)
	require.Zero(t, rep.Check.ProblemCount)
	require.Positive(t, rep.Bytes)

	errOut.Reset()
	require.Equal(t, exitFail, run(ctx, []string{"restore", "--from", backup, "--data", restored}, &out, &errOut))
	require.Contains(t, errOut.String(), "not empty")
	before, err := os.ReadDir(restored)
	require.NoError(t, err)

	r, err := engine.Open(restored, &engine.Options{NoBackgroundSweep: true})
	require.NoError(t, err)
	defer r.Close()
	for i := range 20 {
		c, err := r.Claim(ctx, idemkv.ClaimRequest{ID: id(i), Fingerprint: []byte{1}})
		require.NoError(t, err)
		require.Equal(t, idemkv.Replay, c.Outcome)
		require.Equal(t, fmt.Sprint("/x/", i), c.Record.Result.Pointer)
	}
	require.NotEmpty(t, before)
}

// TestRestoreIntoAnExistingEmptyDirectory: --data may be an empty
// directory that must stay what it is (a volume's mount point, or a
// symbolic link to one): the store lands in it, keeping its mode, and a
// restore that fails leaves it empty.
func TestRestoreIntoAnExistingEmptyDirectory(t *testing.T) {
	ctx := context.Background()
	src := t.TempDir()
	e, err := engine.Open(src, &engine.Options{NoBackgroundSweep: true})
	require.NoError(t, err)
	require.NoError(t, e.Close())
	backup := filepath.Join(t.TempDir(), "backup")
	var out, errOut bytes.Buffer
	require.Equal(t, exitOK, run(ctx, []string{"backup", "--data", src, "--to", backup}, &out, &errOut), errOut.String())

	volume := filepath.Join(t.TempDir(), "volume")
	require.NoError(t, os.Mkdir(volume, 0o750))
	link := filepath.Join(t.TempDir(), "data")
	require.NoError(t, os.Symlink(volume, link))
	notBackup := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(notBackup, "notes.txt"), []byte("x"), 0o600))
	require.Equal(t, exitFail, run(ctx, []string{"restore", "--from", notBackup, "--data", link}, &out, &errOut))
	left, err := os.ReadDir(volume)
	require.NoError(t, err)
	require.Empty(t, left, "a failed restore leaves the directory empty")

	require.Equal(t, exitOK, run(ctx, []string{"restore", "--from", backup, "--data", link}, &out, &errOut), errOut.String())
	fi, err := os.Lstat(link)
	require.NoError(t, err)
	require.Equal(t, os.ModeSymlink, fi.Mode().Type(), "the link is still a link")
	fi, err = os.Stat(volume)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o750), fi.Mode().Perm())
	r, err := engine.Open(volume, &engine.Options{ReadOnly: true, NoBackgroundSweep: true})
	require.NoError(t, err, "the store is in the volume")
	require.NoError(t, r.Close())
}

// TestUnfinishedRestoreIsNotOpened: a restore killed before it put its
// copy in place leaves the copy, inside --data (an existing empty
// directory) or beside it. serve, sweep, migrate and restore refuse that
// --data, naming the copy, instead of starting an empty store on it.
func TestUnfinishedRestoreIsNotOpened(t *testing.T) {
	// A serve that opened the store would run until ctx ends.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	volume := t.TempDir()
	left := filepath.Join(volume, ".restoring-123")
	require.NoError(t, os.Mkdir(left, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(left, "000002.sst"), []byte("half a copy"), 0o600))
	parent := t.TempDir()
	absent := filepath.Join(parent, "data")
	require.NoError(t, os.Mkdir(filepath.Join(parent, ".data.restoring-456"), 0o755))
	require.NoError(t, os.Mkdir(filepath.Join(parent, ".data2.restoring-789"), 0o755)) // another store's

	for _, args := range [][]string{
		{"serve", "--data", volume, "--addr", "127.0.0.1:0"},
		{"sweep", "--data", volume},
		{"restore", "--from", t.TempDir(), "--data", volume},
		{"serve", "--data", absent, "--addr", "127.0.0.1:0"},
		{"migrate", "--data", volume, "--no-backup"},
		{"sweep", "--data", absent},
		{"evict", "--data", absent, "--tenant", "t", "--endpoint", "POST /x", "--key", "k", "--reason", "test"},
	} {
		var out, errOut bytes.Buffer
		require.Equal(t, exitFail, run(ctx, args, &out, &errOut), "%v", args)
		assert.Contains(t, errOut.String(), "has not finished", "%v", args)
	}
	entries, err := os.ReadDir(volume)
	require.NoError(t, err)
	assert.Len(t, entries, 1, "nothing was made beside the copy")
	_, err = os.Stat(absent)
	assert.ErrorIs(t, err, fs.ErrNotExist)
	assert.NoError(t, unfinishedRestore(filepath.Join(parent, "data3")))
}
