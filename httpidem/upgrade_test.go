package httpidem_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/httpidem"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/internal/upgradetest"
	"github.com/idemkv/idemkv/internal/upgradetest/replay"
)

// TestEarlierLayoutsReplay serves the stores the engine's earlier layouts
// left (engine/testdata, written through the middleware of their day)
// through today's middleware, after the engine migrated them: every
// stored outcome replays byte for byte, which proves that today's
// fingerprints equal the ones stored then, and no handler runs for it; a
// changed payload under a stored key is a 422, except in what a route's
// fingerprint does not cover; the uncertain refund answers 409; the
// abandoned one, once its lease has run out, is taken over and its
// handler runs under the operation id the old process sent downstream.
func TestEarlierLayoutsReplay(t *testing.T) {
	for _, layout := range []int{3, 4, 5} {
		t.Run(fmt.Sprint("layout", layout), func(t *testing.T) {
			f := upgradetest.Load(t, fmt.Sprintf("../engine/testdata/layout%d", layout))
			clock := fakeclock.New(f.End.Add(time.Second))
			e, err := engine.Open(f.CopyStore(t), &engine.Options{Clock: clock, Lease: f.Lease(), Retention: f.Retention(),
				RetentionClasses: f.Classes(), NoBackgroundSweep: true, CacheSize: 1 << 20, MemTableSize: 1 << 20})
			require.NoError(t, err)
			defer e.Close()

			var mu sync.Mutex
			var ran []string
			srv := replay.Serve(t, f, e, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				op := httpidem.FromContext(r.Context())
				mu.Lock()
				ran = append(ran, op.Lease().ID.Key)
				mu.Unlock()
				_, _ = io.Copy(io.Discard, r.Body)
				w.WriteHeader(http.StatusCreated)
				fmt.Fprint(w, op.Lease().OperationID)
			}))
			replay.RequireReplays(t, f, srv.URL)
			require.Empty(t, ran, "a replay runs no handler")

			changed := map[string]func(q *upgradetest.Request){
				"pay-1":        func(q *upgradetest.Request) { q.Headers = map[string]string{"X-Currency": "GBP"} },
				"pay-declined": func(q *upgradetest.Request) { q.Body = strings.Replace(q.Body, "-5", "-6", 1) },
				"cap-1":        func(q *upgradetest.Request) { q.Body = `{"amount": 99}` },
				"ref-ok":       func(q *upgradetest.Request) { q.Body = strings.Replace(q.Body, `"ok"`, `"OK"`, 1) },
				"note-1":       func(q *upgradetest.Request) { q.Body += " " },
			}
			for _, q := range f.Keys(upgradetest.Completed) {
				change, ok := changed[q.Key]
				require.True(t, ok, "no changed payload for %s", q.Key)
				change(&q)
				require.Equal(t, http.StatusUnprocessableEntity, replay.Send(t, srv.URL, q).Status, "%s of %s", q.Key, q.Tenant)
				if q.Key == "cap-1" { // a ModeFields route: the memo is not covered
					q.Body = `{"memo": "other", "amount": 100}`
					require.True(t, replay.Send(t, srv.URL, q).Replayed)
				}
			}

			unc, aband := f.Keys(upgradetest.Uncertain)[0], f.Keys(upgradetest.Abandoned)[0]
			require.Equal(t, http.StatusConflict, replay.Send(t, srv.URL, unc).Status)
			clock.Advance(f.Lease())
			old, err := e.Get(t.Context(), f.ID(aband))
			require.NoError(t, err)
			got := replay.Send(t, srv.URL, aband)
			require.Equal(t, http.StatusCreated, got.Status)
			require.Equal(t, fmt.Sprint(old.OperationID), got.Body)
			require.Equal(t, []string{aband.Key}, ran, "only the takeover ran a handler")
		})
	}
}
