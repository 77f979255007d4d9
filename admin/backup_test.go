package admin_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/admin"
	"github.com/idemkv/idemkv/engine"
)

// TestBackupHoldsTheAuditLogOfItsStore: backups taken while an operator
// resolves record after record each hold, in their audit log, exactly
// the changes their copy of the store holds, each begun and done: a
// backup never falls between a change's begun entry and its end.
func TestBackupHoldsTheAuditLogOfItsStore(t *testing.T) {
	e, err := engine.Open(t.TempDir(), &engine.Options{NoBackgroundSweep: true})
	require.NoError(t, err)
	defer e.Close()
	audit, err := admin.OpenAuditLog(filepath.Join(t.TempDir(), "audit.log"))
	require.NoError(t, err)
	defer audit.Close()
	const n = 40
	for i := range n {
		uncertain(t, e, fmt.Sprint("k", i))
	}

	var (
		wg      sync.WaitGroup
		done    = make(chan struct{})
		backups []string
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(done)
		for i := range n {
			_, err := admin.Resolve(ctx, e, audit, admin.ResolveRequest{Tenant: "acct_1", Endpoint: "POST /v1/payments",
				Key: fmt.Sprint("k", i), NoEffect: true, Note: "ops: never charged"}, nil)
			if err != nil {
				t.Errorf("resolve k%d: %v", i, err)
				return
			}
		}
	}()
	root := t.TempDir()
	for i := 0; ; i++ {
		select {
		case <-done:
		default:
			dir := filepath.Join(root, fmt.Sprint(i))
			require.NoError(t, audit.Backup(dir, func() error { return e.Backup(ctx, dir) }))
			backups = append(backups, dir)
			continue
		}
		break
	}
	wg.Wait()
	require.NotEmpty(t, backups)

	for _, dir := range backups {
		phases := map[string][]string{}
		for _, l := range readLines(t, filepath.Join(dir, admin.BackupFile)) {
			phases[l["key"].(string)] = append(phases[l["key"].(string)], l["phase"].(string))
		}
		b, err := engine.Open(dir, &engine.Options{ReadOnly: true, NoBackgroundSweep: true})
		require.NoError(t, err)
		for i := range n {
			key := fmt.Sprint("k", i)
			_, err := b.Get(ctx, id(key))
			if errors.Is(err, idemkv.ErrNotFound) {
				require.Equal(t, []string{admin.PhaseBegun, admin.PhaseDone}, phases[key], "%s: %s is resolved in the store's copy", dir, key)
			} else {
				require.NoError(t, err)
				require.Empty(t, phases[key], "%s: %s is not resolved in the store's copy", dir, key)
			}
		}
		require.NoError(t, b.Close())
	}
}

// readLines reads the audit log at path, one entry a line.
func readLines(t *testing.T, path string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m), "%s", sc.Text())
		out = append(out, m)
	}
	require.NoError(t, sc.Err())
	return out
}

// TestBackupRefusesAnExistingDirectory: a backup into a directory that
// exists is refused before the store is copied, and the directory is
// left as it was.
func TestBackupRefusesAnExistingDirectory(t *testing.T) {
	audit, err := admin.OpenAuditLog(filepath.Join(t.TempDir(), "audit.log"))
	require.NoError(t, err)
	defer audit.Close()
	dir := t.TempDir()
	keep := filepath.Join(dir, "keep")
	require.NoError(t, os.WriteFile(keep, []byte("x"), 0o600))
	called := false
	err = audit.Backup(dir, func() error { called = true; return nil })
	require.ErrorIs(t, err, os.ErrExist)
	require.False(t, called)
	require.FileExists(t, keep)
}
