package engine

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
)

// lockChildEnv names the store a child of TestOpenRefusesAHeldStore holds.
const lockChildEnv = "IDEMKV_LOCK_CHILD"

// TestOpenRefusesAHeldStore: a store another process holds open is
// refused with ErrLocked (read-write, read-only, and by StoredLayout),
// naming the directory, not with the lock's bare errno; so is a second
// Open in the same process; once the holder is gone it opens.
func TestOpenRefusesAHeldStore(t *testing.T) {
	if dir := os.Getenv(lockChildEnv); dir != "" {
		e, err := Open(dir, &Options{NoBackgroundSweep: true})
		require.NoError(t, err)
		os.Stdout.WriteString("open\n")
		_, _ = io.Copy(io.Discard, os.Stdin) // until the parent closes it
		require.NoError(t, e.Close())
		return
	}
	dir := t.TempDir()
	e, err := Open(dir, &Options{NoBackgroundSweep: true})
	require.NoError(t, err)
	_, err = Open(dir, &Options{NoBackgroundSweep: true})
	require.ErrorIs(t, err, ErrLocked, "a second Open in this process")
	require.NoError(t, e.Close())

	cmd := exec.Command(os.Args[0], "-test.run=^TestOpenRefusesAHeldStore$", "-test.count=1")
	cmd.Env = append(os.Environ(), lockChildEnv+"="+dir)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "open\n", line)

	for _, ro := range []bool{false, true} {
		_, err := Open(dir, &Options{ReadOnly: ro, NoBackgroundSweep: true})
		require.ErrorIs(t, err, ErrLocked, "read-only %v", ro)
		require.ErrorContains(t, err, dir)
	}
	_, err = StoredLayout(dir, nil)
	require.ErrorIs(t, err, ErrLocked)

	require.NoError(t, stdin.Close())
	require.NoError(t, cmd.Wait())
	e, err = Open(dir, &Options{NoBackgroundSweep: true})
	require.NoError(t, err, "the holder is gone")
	require.NoError(t, e.Close())
}
