package httpidem_test

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/httpidem"
)

// sendingHandler is a remote route's handler that stalls (stall runs
// with the request's lease, before the call), then calls Op.Sending and,
// if it allows, "sends" the downstream call.
type sendingHandler struct {
	stall func(l idemkv.Lease)
	sends func() // the call, sent
	sent  atomic.Int64
	err   atomic.Value // Sending's error, if any
}

func (h *sendingHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	op := httpidem.FromContext(r.Context())
	h.stall(op.Lease())
	if err := op.Sending(r.Context()); err != nil {
		h.err.Store(err)
		http.Error(w, "not sent", http.StatusServiceUnavailable)
		return
	}
	h.sent.Add(1)
	if h.sends != nil {
		h.sends()
	}
	w.WriteHeader(http.StatusCreated)
}

// TestSendingRenewsAStalledLease: a handler that stalled past its lease,
// and that no one took over, renews the lease before its call, and a
// reconciler that judged the record abandoned before that settles
// nothing (ResolveRequest.Since): the call it did not see coming is sent
// under a lease again.
func TestSendingRenewsAStalledLease(t *testing.T) {
	var f *fixture
	var judged idemkv.Record
	h := &sendingHandler{}
	h.stall = func(l idemkv.Lease) {
		f.clock.Advance(4 * time.Second) // the process paused: the 3 s lease ran out
		rec, err := f.eng.Get(t.Context(), l.ID)
		require.NoError(t, err)
		judged = rec // a reconciler lists it, abandoned, and asks the downstream
	}
	var resolveErr error
	h.sends = func() { // while the call is out, the reconciler's answer comes back: "not applied"
		f.clock.Advance(4 * time.Second) // the renewed lease runs out too
		resolveErr = f.eng.Resolve(t.Context(), idemkv.ResolveRequest{ID: judged.ID, Token: judged.Token, NoEffect: true, Since: judged.LeaseExpires})
	}
	f = buildFixture(t, httpidem.Route{Mode: idemkv.ModeRemote, Lease: 3 * time.Second, Heartbeat: -1}, h.ServeHTTP, nil, nil)
	r := f.do("POST", route, `{}`, "k")
	assert.EqualValues(t, 1, h.sent.Load())
	assert.ErrorIs(t, resolveErr, idemkv.ErrFenced, "the downstream's answer predates the call")
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
}

// TestSendingRefusesALostLease: a handler that stalled past its lease
// while a reconciler settled its record sends nothing; its client is
// told the lease was lost.
func TestSendingRefusesALostLease(t *testing.T) {
	var f *fixture
	h := &sendingHandler{}
	h.stall = func(l idemkv.Lease) {
		f.clock.Advance(4 * time.Second)
		rec, err := f.eng.Get(t.Context(), l.ID)
		require.NoError(t, err)
		require.NoError(t, f.eng.Resolve(t.Context(), idemkv.ResolveRequest{ID: rec.ID, Token: rec.Token, NoEffect: true, Since: rec.LeaseExpires}),
			"the reconciler settles the abandoned record: not applied")
	}
	f = buildFixture(t, httpidem.Route{Mode: idemkv.ModeRemote, Lease: 3 * time.Second, Heartbeat: -1}, h.ServeHTTP, nil, nil)
	r := f.do("POST", route, `{}`, "k")
	problem(t, r, http.StatusConflict, httpidem.ProblemLeaseLost)
	assert.Zero(t, h.sent.Load(), "nothing sent")
	err, _ := h.err.Load().(error)
	assert.ErrorIs(t, err, idemkv.ErrFenced)
}
