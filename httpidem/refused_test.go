package httpidem_test

import (
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
// stored without its largest part, not left unstored, which would run
// the handler again on every retry. Here the part is the fingerprint
// diagnostics of a request with thousands of members, or a header that
// echoes the client; the replay keeps the rest.
func TestOutcomeTheStoreRefusesIsStoredWithLess(t *testing.T) {
	var members strings.Builder
	members.WriteString(`{"m0":0`)
	for i := 1; i < 9000; i++ {
		fmt.Fprintf(&members, `,"m%d":0`, i)
	}
	members.WriteString("}")
	long := "/v1/things/" + strings.Repeat("x", 70<<10)

	for _, tc := range []struct {
		name, body, location string
		want                 http.Header
	}{
		{"diagnostics", members.String(), "", http.Header{"Content-Type": {"application/json"}}},
		{"a header", `{"amount":5}`, long, http.Header{"Location": {""}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int64
			h := func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				w.Header().Set("Content-Type", "application/json")
				if tc.location != "" {
					w.Header().Set("Location", tc.location)
				}
				w.WriteHeader(http.StatusCreated)
				fmt.Fprint(w, `{"id":"t_1"}`)
			}
			f := newFixture(t, httpidem.Route{Fingerprint: &fingerprint.Options{Diagnostics: true}}, h)
			first := f.do("POST", route, tc.body, "k")
			require.Equal(t, http.StatusCreated, first.status, "%s", first.body)
			require.Equal(t, httpidem.Stored, f.report().Disposition)

			again := f.do("POST", route, tc.body, "k")
			require.Equal(t, http.StatusCreated, again.status, "%s", again.body)
			assert.Equal(t, "true", again.header.Get(httpidem.HeaderReplayed))
			assert.Equal(t, `{"id":"t_1"}`, string(again.body))
			for name := range tc.want {
				assert.Equal(t, tc.want.Get(name), again.header.Get(name), name)
			}
			assert.EqualValues(t, 1, calls.Load(), "the handler ran once")

			p := problem(t, f.do("POST", route, `{"other":1}`, "k"), http.StatusUnprocessableEntity, httpidem.ProblemKeyMismatch)
			if tc.location == "" {
				assert.Empty(t, p.Fields, "the diagnostics were not stored")
			}
		})
	}
}
