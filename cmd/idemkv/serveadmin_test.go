package main

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv/engine"
)

// TestServeAdminAPI: serve --admin-addr answers only with its token;
// idemkv backup --server copies the running store, which restores as a
// store holding every payment made before; idemkv check --server checks
// it in place; the admin API refuses a non-loopback address unless told.
func TestServeAdminAPI(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	tokFile := filepath.Join(t.TempDir(), "admin-token")
	require.NoError(t, os.WriteFile(tokFile, []byte("s3cret-admin-token-for-tests\n"), 0o600))
	aln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	url, stop := startServeOn(t, serveConfig{dir: dir, adminLn: aln, adminTokenFile: tokFile})
	adminURL := "http://" + aln.Addr().String()
	var bodies []string
	for _, key := range []string{"a", "b", "c"} {
		status, _, body := payOnce(t, url, "order-"+key)
		require.Equal(t, http.StatusCreated, status, body)
		bodies = append(bodies, body)
	}

	resp, err := http.Post(adminURL+"/admin/v1/check", "", nil)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)

	var out, errOut bytes.Buffer
	require.Equal(t, exitOK, run(ctx, []string{"check", "--server", adminURL, "--token-file", tokFile}, &out, &errOut), errOut.String())
	require.Contains(t, out.String(), "ok: every invariant holds")
	require.Contains(t, out.String(), "3 completed")

	out.Reset()
	require.Equal(t, exitOK, run(ctx, []string{"inspect", "--server", adminURL, "--token-file", tokFile,
		"--tenant", "acct_1", "--endpoint", "POST /v1/payments", "--key", "order-b"}, &out, &errOut), errOut.String())
	require.Contains(t, out.String(), "completed")
	require.Contains(t, out.String(), "201 /v1/payments/")
	errOut.Reset()
	require.Equal(t, exitFail, run(ctx, []string{"inspect", "--server", adminURL, "--token-file", tokFile,
		"--tenant", "acct_1", "--endpoint", "POST /v1/payments", "--key", "nope"}, &out, &errOut))
	require.Contains(t, errOut.String(), "404")

	out.Reset()
	require.Equal(t, exitOK, run(ctx, []string{"pending", "--server", adminURL, "--token-file", tokFile}, &out, &errOut), errOut.String())
	require.Contains(t, out.String(), "AGE") // nothing pending: the header only
	require.Equal(t, 1, strings.Count(out.String(), "\n"), out.String())
	out.Reset()
	require.Equal(t, exitOK, run(ctx, []string{"sweep", "--server", adminURL, "--token-file", tokFile, "--json"}, &out, &errOut), errOut.String())
	require.Contains(t, out.String(), `"examined"`)

	backup := filepath.Join(t.TempDir(), "backup")
	out.Reset()
	require.Equal(t, exitOK, run(ctx, []string{"backup", "--server", adminURL, "--token-file", tokFile, "--to", backup}, &out, &errOut), errOut.String())
	require.Contains(t, out.String(), "backed up the store of")
	errOut.Reset()
	require.Equal(t, exitFail, run(ctx, []string{"backup", "--server", adminURL, "--token-file", tokFile, "--to", backup}, &out, &errOut))
	require.Contains(t, errOut.String(), "409")
	require.Equal(t, exitUsage, run(ctx, []string{"backup", "--server", adminURL, "--token-file", tokFile, "--to", "relative"}, &out, &errOut))
	wrong := filepath.Join(t.TempDir(), "wrong")
	require.NoError(t, os.WriteFile(wrong, []byte("not-the-admin-token-at-all"), 0o600))
	errOut.Reset()
	require.Equal(t, exitFail, run(ctx, []string{"check", "--server", adminURL, "--token-file", wrong}, &out, &errOut))
	require.Contains(t, errOut.String(), "401")

	// The service goes on after its backup.
	status, replayed, body := payOnce(t, url, "order-a")
	require.Equal(t, http.StatusCreated, status)
	require.Equal(t, "true", replayed)
	require.Equal(t, bodies[0], body)
	require.NoError(t, stop())

	out.Reset()
	require.Equal(t, exitOK, run(ctx, []string{"inspect", "--data", dir, "--json",
		"--tenant", "acct_1", "--endpoint", "POST /v1/payments", "--key", "order-c"}, &out, &errOut), errOut.String())
	require.Contains(t, out.String(), `"state": "completed"`)

	restored := filepath.Join(t.TempDir(), "restored")
	out.Reset()
	require.Equal(t, exitOK, run(ctx, []string{"restore", "--from", backup, "--data", restored}, &out, &errOut), errOut.String())
	require.Contains(t, out.String(), "3 completed")
	r, err := engine.Open(restored, &engine.Options{ReadOnly: true, NoBackgroundSweep: true})
	require.NoError(t, err)
	rep, err := r.Check(ctx)
	require.NoError(t, err)
	require.NoError(t, r.Close())
	require.Equal(t, 3, rep.Completed)
	require.Zero(t, rep.ProblemCount)

	errOut.Reset()
	require.Equal(t, exitUsage, run(ctx, []string{"serve", "--addr", "127.0.0.1:0", "--data", t.TempDir(), "--admin-addr", "0.0.0.0:0"}, &out, &errOut))
	require.True(t, strings.Contains(errOut.String(), "not a loopback address"), errOut.String())
}
