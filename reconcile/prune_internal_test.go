package reconcile

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/stretchr/testify/require"
)

// listing is a store that lists its uncertain records, in pages, and
// takes their resolution: all a worker's passes call here. (The worker is
// tested on the real stores in internal/layertest/reconcile; this test
// looks at its memory, which only the package sees.)
type listing struct {
	idemkv.Store // the rest: not called
	mu           sync.Mutex
	recs         []idemkv.Record
}

func (l *listing) List(_ context.Context, req idemkv.ListRequest) (idemkv.ListPage, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	from := 0
	if req.After != "" {
		from, _ = strconv.Atoi(req.After)
	}
	var page idemkv.ListPage
	for i := from; i < len(l.recs) && len(page.Records) < req.Limit; i++ {
		page.Records = append(page.Records, l.recs[i])
		if len(page.Records) == req.Limit && i+1 < len(l.recs) {
			page.Next = strconv.Itoa(i + 1)
		}
	}
	return page, nil
}

// settle removes key's record, as an operator's resolution would.
func (l *listing) settle(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = slices.DeleteFunc(l.recs, func(r idemkv.Record) bool { return r.ID.Key == key })
}

// TestBackoffOfSettledRecordsIsForgotten: a worker keeps in memory the
// backoff of each record that got Unknown. Records an operator settled
// meanwhile are forgotten once the passes have read the whole listing,
// even when no single pass reads all of it (PerPass below its length).
func TestBackoffOfSettledRecordsIsForgotten(t *testing.T) {
	ctx := context.Background()
	clock := fakeclock.New(time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC))
	st := &listing{}
	for i := range 6 {
		st.recs = append(st.recs, idemkv.Record{ID: idemkv.ID{Tenant: "t", Endpoint: "POST /pay", Key: fmt.Sprint("k", i)},
			State: idemkv.StateUncertain, Mode: idemkv.ModeRemote, Token: uint64(i + 1), Marked: clock.Now(), Created: clock.Now()})
	}
	unknown := ReconcilerFunc(func(context.Context, idemkv.Record) (Answer, error) {
		return Answer{Verdict: Unknown, Reason: "no answer"}, nil
	})
	w, err := New(st, unknown, &Options{Clock: clock, Grace: time.Second, PerPass: 2, MaxAttempts: 100})
	require.NoError(t, err)
	tracked := func() int {
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(w.backoff)
	}
	clock.Advance(time.Second)
	for range 3 {
		require.NoError(t, w.Pass(ctx))
	}
	require.Equal(t, 6, tracked(), "every record got Unknown")

	for _, k := range []string{"k0", "k1", "k2"} {
		st.settle(k)
	}
	for range 2 { // the three left take two passes of two
		require.NoError(t, w.Pass(ctx))
	}
	require.Equal(t, 3, tracked(), "the settled records' backoff is forgotten")
}
