package events

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/bench"
	"github.com/idemkv/idemkv/engine"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRun runs every part once, tiny, and checks what the report holds:
// both sides of each point, every event of the load published and stored
// once, the drains, and a table and JSON that say so.
func TestRun(t *testing.T) {
	data := t.TempDir()
	o := &Options{Options: bench.Options{Dir: data}, Concurrency: []int{1, 3}, Duration: 50 * time.Millisecond,
		Rounds: 2, Rates: []float64{500}, LoadDuration: 200 * time.Millisecond, Clients: 8, Backlog: 150,
		Pipeline: 64, FsyncSamples: 4, VerifyKeys: -1}
	rep, err := Run(context.Background(), o)
	require.NoError(t, err)

	require.Len(t, rep.Overhead, 2)
	for i, p := range rep.Overhead {
		require.Equal(t, o.Concurrency[i], p.Concurrency)
		require.Len(t, p.Rounds, 2)
		require.NotEqual(t, p.Rounds[0].WithFirst, p.Rounds[1].WithFirst, "the rounds alternate the order")
		for _, rd := range p.Rounds {
			for _, s := range []Side{rd.With, rd.Without} {
				require.Positive(t, s.Requests)
				require.Equal(t, int(s.Requests), s.VerifiedKeys, "every key verified")
				require.Positive(t, s.Commits)
			}
			// The relay acknowledges every 100 ms: a 50 ms side may end
			// before its first acknowledgement.
			require.LessOrEqual(t, rd.With.RelayAcks, rd.With.Requests, "at most one acknowledgement an event")
			require.Zero(t, rd.Without.RelayAcks, "no event, nothing to acknowledge")
			require.InDelta(t, rd.With.RequestsPerSec/rd.Without.RequestsPerSec, rd.Ratio, 1e-9)
		}
		require.LessOrEqual(t, p.RatioMin, p.Ratio)
		require.GreaterOrEqual(t, p.RatioMax, p.Ratio)
	}

	require.Len(t, rep.Loads, 1)
	l := rep.Loads[0]
	require.Equal(t, 100, l.Events)
	require.Zero(t, l.Unpublished)
	require.Equal(t, uint64(100), l.StreamMessages, "one message a committed event")
	require.Zero(t, l.Republished)
	require.Positive(t, l.RelayAcks)
	require.Positive(t, l.Lag.Max)
	require.LessOrEqual(t, l.Lag.P50, l.Lag.Max)
	require.Positive(t, l.LagFromCreated.P50)
	require.Positive(t, l.DeliveredPerSec)

	var names []string
	for _, d := range rep.Drains {
		names = append(names, d.Name)
		require.Equal(t, 150, d.Events)
		require.Positive(t, d.EventsPerSec)
	}
	require.Equal(t, []string{drainDiscard, drainJetStream, aloneOne, "JetStream alone, 64 at a time"}, names)
	require.Len(t, rep.Consumers, 2)
	for i, name := range []string{consumeRaw, consumeInbox} {
		require.Equal(t, name, rep.Consumers[i].Name)
		require.Equal(t, 150, rep.Consumers[i].Events)
		require.Positive(t, rep.Consumers[i].EventsPerSec)
	}
	require.Empty(t, rep.Goals, "neither 64 clients nor 5,000 a second was measured")
	require.Positive(t, rep.Meta.FsyncP50US)
	require.True(t, rep.Meta.Relay)

	var table bytes.Buffer
	require.NoError(t, rep.WriteTable(&table))
	for _, want := range []string{"bench events", "Completions with one event", "Open-loop loads relayed to JetStream",
		"Draining a backlog of 150 events", "relay to JetStream", "Consuming the stream's first 150 messages", "inbox, applying"} {
		require.Contains(t, table.String(), want)
	}
	var js bytes.Buffer
	require.NoError(t, rep.WriteJSON(&js))
	var m map[string]any
	require.NoError(t, json.Unmarshal(js.Bytes(), &m))
	for _, k := range []string{"meta", "overhead", "loads", "drains", "consumers", "goals"} {
		require.Contains(t, m, k)
	}

	left, err := os.ReadDir(data)
	require.NoError(t, err)
	require.Empty(t, left, "the run's directory is removed")
}

// TestRunNoRelay: without a relay the events stay in the outbox, and the
// backlog says so.
func TestRunNoRelay(t *testing.T) {
	rep, err := Run(context.Background(), &Options{Options: bench.Options{Dir: t.TempDir()}, Concurrency: []int{2},
		Duration: 30 * time.Millisecond, Rounds: 1, NoRelay: true, NoLag: true, Backlog: 10})
	require.NoError(t, err)
	rd := rep.Overhead[0].Rounds[0]
	require.Equal(t, uint64(rd.With.Requests), rd.With.Backlog)
	require.Zero(t, rd.With.RelayAcks)
	require.Zero(t, rd.Without.Backlog)
	require.Empty(t, rep.Loads)
	require.Empty(t, rep.Drains)
	require.False(t, rep.Meta.Relay)
}

// TestEvent: the run's events are what the engine accepts, 200 bytes of
// JSON that carry their number, and distinct entities.
func TestEvent(t *testing.T) {
	dir := t.TempDir()
	e, err := engine.Open(dir, &engine.Options{MemTableSize: 1 << 20, CacheSize: 1 << 20})
	require.NoError(t, err)
	defer e.Close()
	keys := map[string]bool{}
	for _, n := range []uint64{0, 1, 42, 1<<63 + 7} {
		ev := event(9, n%1000, n, 1000)
		require.Len(t, ev.Payload, payloadBytes)
		require.True(t, json.Valid(ev.Payload), "%s", ev.Payload)
		got, ok := eventNumber(ev.Payload)
		require.True(t, ok)
		require.Equal(t, n, got)
		require.Equal(t, topic, ev.Topic)
		keys[ev.Key] = true
		require.NoError(t, e.Update(context.Background(), func(fx idemkv.Effects) error { return fx.Emit(ev) }))
	}
	require.Len(t, keys, 4, "each request is its own entity")
	_, ok := eventNumber([]byte(`{"m":"1"}`))
	require.False(t, ok)
}

// TestTiming: the timing publisher records an event's first
// acknowledgement, counts repeats and events it does not know, and
// passes the inner publisher's errors on without recording.
func TestTiming(t *testing.T) {
	fail := errors.New("broker down")
	var inner failing
	tp := newTiming(&inner, time.Now(), 3)
	ev := func(n uint64) idemkv.StoredEvent {
		return idemkv.StoredEvent{Event: event(1, n, n, 10), Created: time.Now()}
	}
	ctx := context.Background()
	inner.err = fail
	require.ErrorIs(t, tp.Publish(ctx, ev(0)), fail)
	require.Zero(t, tp.acked[0].Load())
	inner.err = nil
	require.NoError(t, tp.Publish(ctx, ev(0)))
	first := tp.acked[0].Load()
	require.Positive(t, first)
	require.NoError(t, tp.Publish(ctx, ev(0)))
	require.Equal(t, first, tp.acked[0].Load(), "the first acknowledgement counts")
	require.NoError(t, tp.Publish(ctx, ev(7)), "not the relay's problem")
	require.Equal(t, int64(1), tp.published.Load())
	require.Equal(t, int64(1), tp.repeats.Load())
	require.Equal(t, int64(1), tp.strangers.Load())
	require.Equal(t, int64(2), tp.mu.fromCreated.Count(), "each acknowledgement of a known event")
}

type failing struct{ err error }

func (f *failing) Publish(context.Context, idemkv.StoredEvent) error { return f.err }

// TestGoals: the goals are judged on the points and loads that measure
// them, and an unpublished event fails the lag goal whatever its p99.
func TestGoals(t *testing.T) {
	rep := &Report{
		Overhead: []OverheadPoint{{Concurrency: 16, Ratio: 0.1}, {Concurrency: 64, Ratio: 0.86}},
		Loads: []Load{{Rate: 1000, Lag: bench.Latency{P99: 9e6}},
			{Rate: 5000, Lag: bench.Latency{P99: 49e3}}},
	}
	gs := goals(rep)
	require.Len(t, gs, 2)
	require.True(t, gs[0].Met)
	require.Equal(t, 0.86, gs[0].Measured)
	require.True(t, gs[1].Met)
	require.Equal(t, 49.0, gs[1].Measured)

	rep.Overhead[1].Ratio = 0.84
	rep.Loads[1].Unpublished = 1
	for _, g := range goals(rep) {
		require.False(t, g.Met, g.Name)
	}
}

func TestOptions(t *testing.T) {
	d := (*Options)(nil).EnsureDefaults()
	require.Equal(t, []int{1, 16, 64, 256}, d.Concurrency)
	require.Equal(t, []float64{5000}, d.Rates)
	require.Equal(t, 10*time.Second, d.LoadDuration)
	require.Equal(t, 2, d.Rounds)
	require.NoError(t, d.Validate())
	require.Equal(t, 50_000, d.loadEvents(5000))
	for _, bad := range []Options{{Concurrency: []int{0}}, {Rates: []float64{0}}, {Duration: -1}, {Backlog: -1}} {
		require.Error(t, bad.EnsureDefaults().Validate(), "%+v", bad)
	}
	q, err := Profile("quick")
	require.NoError(t, err)
	require.Equal(t, "quick", q.Profile)
	_, err = Profile("slow")
	require.Error(t, err)
}
