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
// read the body, or the Location of the created object), then the body.
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
	long := "</v1/things/" + strings.Repeat("x", 70<<10) + ">; rel=related"
	large := `{"id":"t_1","pad":"` + strings.Repeat("x", 60<<10) + `"}`

	for _, tc := range []struct {
		name, request, link, response string
		gzip                          bool
		want                          http.Header
	}{
		{name: "diagnostics", request: members(9000), response: `{"id":"t_1"}`,
			want: http.Header{"Content-Type": {"application/json"}}},
		{name: "a header", request: `{"amount":5}`, link: long, response: `{"id":"t_1"}`,
			want: http.Header{"Link": {""}, "Content-Type": {"application/json"}, "Location": {"/v1/things/t_1"}}},
		{name: "a header beside a compressed body", request: `{"amount":5}`, link: long, response: `{"id":"t_1"}`, gzip: true,
			want: http.Header{"Link": {""}, "Content-Type": {"application/json"}, "Location": {"/v1/things/t_1"}}},
		{name: "a large body beside diagnostics", request: members(600), response: large,
			want: http.Header{"Content-Type": {"application/json"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int64
			h := func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("Location", "/v1/things/t_1")
				if tc.link != "" {
					w.Header().Set("Link", tc.link)
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
			f := newFixture(t, httpidem.Route{MaxStoredBody: 62 << 10, Fingerprint: &fingerprint.Options{Diagnostics: true},
				ReplayHeaders: []string{"Content-Type", "Content-Encoding", "Location", "Link"}}, h)
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

// TestAnOutcomeStoredWithoutItsBodyDropsItsEncoding: a compressed body
// the store refuses (a route whose MaxStoredBody is above the store's
// bound) is stored without it, and without its Content-Encoding: the
// replay, from the pointer, is not compressed.
func TestAnOutcomeStoredWithoutItsBodyDropsItsEncoding(t *testing.T) {
	f := newFixture(t, httpidem.Route{MaxStoredBody: 1 << 20}, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Set("Location", "/v1/things/t_1")
		w.WriteHeader(http.StatusCreated)
		zw, err := gzip.NewWriterLevel(w, gzip.NoCompression)
		require.NoError(t, err)
		_, err = zw.Write(make([]byte, 100<<10))
		require.NoError(t, err)
		require.NoError(t, zw.Close())
	})
	first := f.do("POST", route, `{}`, "k")
	require.Equal(t, http.StatusCreated, first.status)
	require.Len(t, first.body, 100<<10)
	again := f.do("POST", route, `{}`, "k")
	require.Equal(t, http.StatusCreated, again.status)
	require.Equal(t, "true", again.header.Get(httpidem.HeaderReplayed))
	require.Empty(t, again.header.Get("Content-Encoding"))
	require.Equal(t, "/v1/things/t_1", again.header.Get("Location"))
	require.Empty(t, again.body)
}
