package admin_test

import (
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv/admin"
	"github.com/idemkv/idemkv/internal/fakeclock"
)

// TestAdminReadsTheStoresClock: the audit log stamps an operator's change
// with the store's time, as the record it changes is stamped (for
// pgstore, the database's), and a console session ends when the store's
// clock says its lifetime is over.
func TestAdminReadsTheStoresClock(t *testing.T) {
	at := time.Date(2031, 5, 6, 10, 0, 0, 0, time.UTC)
	clock := fakeclock.New(at)
	e, srv, path := serveAuditedOn(t, clock) // Options.Now defaults to the store's clock

	uncertain(t, e, "p1")
	status, out, _ := call(t, srv, "POST", "/admin/v1/resolve",
		`{"tenant":"acct_1","endpoint":"POST /v1/payments","key":"p1","no_effect":true,"note":"ops: never charged"}`, token)
	require.Equal(t, http.StatusOK, status, out)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	require.Len(t, lines, 2, "begun and done")
	for _, line := range lines {
		var entry admin.AuditEntry
		require.NoError(t, json.Unmarshal([]byte(line), &entry))
		require.Equal(t, at, entry.Time, "%s: the store's time", entry.Phase)
	}

	br := newBrowser(t, srv)
	br.signIn()
	clock.Advance(admin.SessionLifetime - time.Second)
	status, _, _ = br.do("GET", "/console/", nil, nil)
	require.Equal(t, http.StatusOK, status, "a second left")
	clock.Advance(2 * time.Second)
	status, hdr, _ := br.do("GET", "/console/", nil, nil)
	require.Equal(t, http.StatusSeeOther, status, "the session is over by the store's clock")
	require.Equal(t, "/console/login", hdr.Get("Location"))
}
