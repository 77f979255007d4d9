package httpidem_test

import (
	"compress/gzip"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv/fingerprint"
	"github.com/idemkv/idemkv/httpidem"
)

// TestOutcomeTheStoreRefusesIsStoredWithLess: a response whose stored
// form the store refuses as too large (the engine keeps 64 KiB) is
// stored with less, not left unstored, which would run the handler again
// on every retry. What goes first is what a replay can best do without:
// the fingerprint diagnostics (of a request with thousands of members),
// then a header that echoes the client (but not those that say how to
// read the body), then the body.
func TestOutcomeTheStoreRefusesIsStoredWithLess(t *testing.T) {
	members := func(n int) string {
		var b strings.Builder
		b.WriteString(`{"m0":0`)
		for i := 1; i < n; i++ {
			fmt.Fprintf(&b, `,"m%d":0`, i)
		}
		b.WriteString("}")
		return b.String()
	}
	long := "/v1/things/" + strings.Repeat("x", 70<<10)
	large := `{"id":"t_1","pad":"` + strings.Repeat("x", 60<<10) + `"}`

	for _, tc := range []struct {
		name, request, location, response string
		gzip                              bool
		want                              http.Header
	}{
		{name: "diagnostics", request: members(9000), response: `{"id":"t_1"}`,
			want: http.Header{"Content-Type": {"application/json"}}},
		{name: "a header", request: `{"amount":5}`, location: long, response: `{"id":"t_1"}`,
			want: http.Header{"Location": {""}, "Content-Type": {"application/json"}}},
		{name: "a header beside a compressed body", request: `{"amount":5}`, location: long, response: `{"id":"t_1"}`, gzip: true,
			want: http.Header{"Location": {""}, "Content-Type": {"application/json"}}},
		{name: "a large body beside diagnostics", request: members(600), response: large,
			want: http.Header{"Content-Type": {"application/json"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int64
			h := func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				w.Header().Set("Content-Type", "application/json")
				if tc.location != "" {
					w.Header().Set("Location", tc.location)
				}
				if !tc.gzip {
					w.WriteHeader(http.StatusCreated)
					fmt.Fprint(w, tc.response)
					return
				}
				w.Header().Set("Content-Encoding", "gzip")
				w.WriteHeader(http.StatusCreated)
				zw := gzip.NewWriter(w)
				fmt.Fprint(zw, tc.response)
				require.NoError(t, zw.Close())
			}
			f := newFixture(t, httpidem.Route{MaxStoredBody: 62 << 10, Fingerprint: &fingerprint.Options{Diagnostics: true}}, h)
			first := f.do("POST", route, tc.request, "k")
			require.Equal(t, http.StatusCreated, first.status, "%.200s", first.body)
			require.Equal(t, httpidem.Stored, f.report().Disposition)
			require.Equal(t, tc.response, string(first.body))

			again := f.do("POST", route, tc.request, "k")
			require.Equal(t, http.StatusCreated, again.status, "%.200s", again.body)
			assert.Equal(t, "true", again.header.Get(httpidem.HeaderReplayed))
			assert.Equal(t, tc.response, string(again.body), "the body, read as the first was")
			for name := range tc.want {
				assert.Equal(t, tc.want.Get(name), again.header.Get(name), name)
			}
			assert.EqualValues(t, 1, calls.Load(), "the handler ran once")
			problem(t, f.do("POST", route, `{"other":1}`, "k"), http.StatusUnprocessableEntity, httpidem.ProblemKeyMismatch)
		})
	}
}
