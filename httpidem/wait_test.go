package httpidem_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/httpidem"
)

// watchingEngine is the engine as a store shared by several processes
// looks to the middleware: an idemkv.Watcher, whose watches wake when the
// test closes settle.
// (pgstore's own tests show that its watches wake when the attempt
// settles; this shows what the middleware does with one.)
type watchingEngine struct {
	*engine.Engine
	settle chan struct{}
}

func (w *watchingEngine) Watch(context.Context, idemkv.ID, uint64) (<-chan struct{}, func(), error) {
	return w.settle, func() {}, nil
}

// TestWaitForAnotherProcessesHolder: a duplicate whose key is held by
// another middleware on the same store (another process of a fleet)
// waits, on a store that can watch, until the holder's attempt settles,
// then replays its outcome; its own handler never runs.
func TestWaitForAnotherProcessesHolder(t *testing.T) {
	h, calls := counting()
	var we *watchingEngine
	waiting := make(chan struct{})
	defer httpidem.SetTestHookWaiting(func() { close(waiting) })()
	f := buildFixture(t, httpidem.Route{Wait: time.Minute}, h, nil, func(o *httpidem.Options) {
		we = &watchingEngine{Engine: o.Store.(*engine.Engine), settle: make(chan struct{})}
		o.Store = we
	})

	// The other process: a middleware of its own on the same store.
	g := newGate(http.StatusCreated)
	other, err := httpidem.New(&httpidem.Options{Store: f.eng, Tenant: bearer, Clock: f.clock})
	require.NoError(t, err)
	wrapped, err := other.Wrap(g, httpidem.Route{})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle(route, wrapped)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	elsewhere := &fixture{t: t, srv: srv}

	first := make(chan response)
	go func() { first <- elsewhere.do("POST", route, `{}`, "k") }()
	<-g.entered
	second := make(chan response)
	go func() { second <- f.do("POST", route, `{}`, "k") }()
	select {
	case <-waiting:
	case <-time.After(30 * time.Second):
		t.Fatal("the duplicate never waited for the other process's attempt")
	}
	close(g.release)
	assert.Equal(t, http.StatusCreated, (<-first).status)
	close(we.settle) // the store tells the waiting process
	r := <-second
	assert.Equal(t, http.StatusCreated, r.status)
	assert.Equal(t, "true", r.header.Get(httpidem.HeaderReplayed))
	assert.Equal(t, "call 1", string(r.body))
	assert.EqualValues(t, 0, calls.Load())
}
