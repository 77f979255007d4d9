package admin_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/admin"
	"github.com/idemkv/idemkv/reconcile"
)

// TestAuditEntriesStayReadable: a verified resolve refused with a
// downstream's answer of megabytes (an error page) is recorded with the
// answer clipped, and every key's history still reads; a line longer
// than a reader takes, in a log written otherwise, is skipped, not the
// end of every history.
func TestAuditEntriesStayReadable(t *testing.T) {
	e, audit := openAudited(t, nil)
	for _, k := range []string{"p1", "p2"} {
		c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id(k), Fingerprint: []byte{1}, Mode: idemkv.ModeRemote})
		require.NoError(t, err)
		require.NoError(t, e.MarkUncertain(ctx, c.Lease, "timed out"))
	}
	r := reconcile.ReconcilerFunc(func(ctx context.Context, rec idemkv.Record) (reconcile.Answer, error) {
		return reconcile.Answer{Verdict: reconcile.Unknown, Reason: strings.Repeat("x", 2<<20)}, nil
	})
	_, err := admin.Resolve(ctx, e, audit, admin.ResolveRequest{Tenant: "acct_1", Endpoint: "POST /v1/payments", Key: "p1",
		NoEffect: true, Verify: true, Note: "ops: verify"}, &admin.ResolveOptions{Reconciler: r})
	require.ErrorIs(t, err, admin.ErrDownstreamUnknown)
	h, err := audit.History(id("p1"))
	require.NoError(t, err)
	require.NotEmpty(t, h)
	for _, entry := range h {
		require.Less(t, len(entry.Outcome)+len(entry.Downstream), 64<<10, "clipped")
	}
	_, err = audit.History(id("p2"))
	require.NoError(t, err, "another key's history")

	path := filepath.Join(t.TempDir(), "audit.log")
	line := `{"time":"2026-12-08T00:00:00Z","action":"evict","phase":"begun","tenant":"acct_1","endpoint":"POST /v1/payments","key":"p2","note":"ops"}`
	require.NoError(t, os.WriteFile(path, []byte(line+"\n{\"note\":\""+strings.Repeat("x", 3<<20)+"\"}\n"+line+"\n"), 0o600))
	h, err = admin.ReadHistory(path, id("p2"))
	require.NoError(t, err)
	require.Len(t, h, 2, "the entries around the long line")
}
