package workloads

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/record"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/bench"
	"github.com/idemkv/idemkv/engine"
	"github.com/stretchr/testify/require"
)

// smallEngine keeps test stores small; the Pebble settings that matter
// (filters, compression) stay at their defaults.
func smallEngine() *engine.Options {
	return &engine.Options{CacheSize: 4 << 20, MemTableSize: 4 << 20}
}

// tinyOptions run one workload briefly at concurrency 1 and 4, checking
// every acknowledged key afterwards.
func tinyOptions(t *testing.T, workload string) *Options {
	return &Options{
		Options:   bench.Options{Dir: t.TempDir(), Engine: smallEngine()},
		Workloads: []string{workload}, Concurrency: []int{1, 4}, Duration: 100 * time.Millisecond,
		PreloadKeys: 300, SizingKeys: -1, BodyKeys: -1, VerifyKeys: -1, FsyncSamples: 5,
	}
}

// TestWorkloads runs every workload on both targets and checks the figures
// are sane and consistent with what each target is known to do.
func TestWorkloads(t *testing.T) {
	for _, wl := range Names() {
		t.Run(wl, func(t *testing.T) {
			rep, err := Run(context.Background(), tinyOptions(t, wl))
			require.NoError(t, err)
			require.Len(t, rep.Points, 4, "2 concurrencies x 2 targets")
			require.Len(t, rep.Comparisons, 2)
			for _, c := range rep.Comparisons {
				require.Equal(t, "engine", c.Target)
				require.Equal(t, "baseline", c.Reference)
				require.Greater(t, c.Ratio, 0.0)
			}
			durable := wl != replay && wl != mismatch
			for _, p := range rep.Points {
				what := p.Target + " c=" + string(rune('0'+p.Concurrency))
				require.Greater(t, p.Requests, int64(0), what)
				require.Greater(t, p.RequestsPerSec, 0.0, what)
				require.Greater(t, p.Latency.P50, 0.0, what)
				require.LessOrEqual(t, p.Latency.P50, p.Latency.P99, what)
				require.LessOrEqual(t, p.Latency.P99, p.Latency.P999, what)
				require.LessOrEqual(t, p.Latency.P999, p.Latency.Max*1.001, what)
				require.Greater(t, p.CPUSecondsPerRequest, 0.0, what)
				require.Greater(t, p.KeysStored, int64(0), what)
				require.Greater(t, p.TableBytes, uint64(0), what)
				require.Greater(t, p.DiskBytesPerKey, 0.0, what)
				require.Greater(t, p.VerifiedKeys, 0, what)
				o := p.Outcomes
				require.Equal(t, p.Requests, o.Acquired+o.Replay+o.InProgress+o.Mismatch, what)
				if durable {
					// Pebble counts flushes and compactions from Open; the
					// store is fresh, so they cover the point's writes.
					require.Greater(t, p.WriteAmp, 0.0, what)
					require.Less(t, p.WriteAmp, 10.0, what)
					require.Greater(t, p.Fsyncs, int64(0), what)
					require.Greater(t, p.WALFsyncsPerRequest, 0.0, what)
					require.Greater(t, p.SyncedBatches, int64(0), what)
				} else {
					require.Zero(t, p.WriteAmp, "nothing written: "+what)
					require.Zero(t, p.Fsyncs, what)
					require.Zero(t, p.SyncedBatches, what)
				}
				checkWorkload(t, wl, p, what)
			}
		})
	}
}

// checkWorkload checks what one workload's point must show.
func checkWorkload(t *testing.T, wl string, p Point, what string) {
	o := p.Outcomes
	switch wl {
	case unique, remote:
		require.Equal(t, p.Requests, o.Acquired, what)
		require.EqualValues(t, p.Requests, p.VerifiedKeys, "every acknowledged request replays: "+what)
		require.Equal(t, p.Requests, p.KeysStored, what)
		// The baseline commits exactly a claim and a completion per request:
		// this also checks the WAL record counter against known commits.
		if p.Target == "baseline" {
			require.Equal(t, 2*p.Requests, p.SyncedBatches, what)
		} else if wl == unique {
			require.LessOrEqual(t, p.SyncedBatches, p.Requests, "the engine makes at most one durable write per local request: "+what)
		} else {
			require.LessOrEqual(t, p.SyncedBatches, 2*p.Requests, what)
		}
	case retry:
		// Whether a retry finds its original finished (Replay) or still
		// running (InProgress) depends on timing; that it never re-runs
		// does not.
		require.Greater(t, o.Replay+o.InProgress, int64(0), what)
		require.EqualValues(t, o.Acquired, p.VerifiedKeys, what)
		if p.Target == "baseline" {
			require.Equal(t, 2*o.Acquired, p.SyncedBatches, what)
		}
	case hot:
		require.Equal(t, p.Requests-o.Acquired, o.Replay+o.InProgress, "every duplicate is answered, none re-run: "+what)
		require.Equal(t, (p.Requests+31)/32, o.Acquired, "one acquisition per hot key: "+what)
		require.EqualValues(t, o.Acquired, p.VerifiedKeys, what)
	case replay:
		require.Equal(t, p.Requests, o.Replay, what)
		require.EqualValues(t, 300, p.KeysStored, what)
	case mismatch:
		require.Equal(t, p.Requests, o.Mismatch, what)
	}
}

// forgetful is a store that acknowledges completions without making them:
// it releases the claim instead. The harness must catch it.
type forgetful struct{ Store }

func (f forgetful) Complete(ctx context.Context, l idemkv.Lease, _ idemkv.Result, _ func(idemkv.Effects) error) error {
	return f.Release(ctx, l, nil)
}

// wrongReplay replays a result other than the one stored.
type wrongReplay struct{ Store }

func (w wrongReplay) Claim(ctx context.Context, req idemkv.ClaimRequest) (idemkv.Claim, error) {
	c, err := w.Store.Claim(ctx, req)
	if c.Outcome == idemkv.Replay {
		c.Record.Result.Pointer += "x"
	}
	return c, err
}

// TestRunCatchesBrokenStores checks that the harness's own verification
// fails a store that loses acknowledged completions or replays the wrong
// result, rather than reporting its figures.
func TestRunCatchesBrokenStores(t *testing.T) {
	for _, tc := range []struct {
		name, workload string
		wrap           func(Store) Store
	}{
		{"lost completions", unique, func(s Store) Store { return forgetful{s} }},
		{"wrong replay", replay, func(s Store) Store { return wrongReplay{s} }},
		{"wrong replay of a retry", retry, func(s Store) Store { return wrongReplay{s} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tinyOptions(t, tc.workload)
			cfg.Concurrency = []int{2}
			cfg.Duration = 30 * time.Millisecond
			good := engineTarget(cfg.Engine)
			bad := Target{Name: "broken", Seed: good.Seed, Open: func(dir string, fs vfs.FS) (Store, error) {
				s, err := good.Open(dir, fs)
				if err != nil {
					return nil, err
				}
				return tc.wrap(s), nil
			}}
			cfg.Targets = []Target{good, bad}
			_, err := Run(context.Background(), cfg)
			require.Error(t, err)
			require.ErrorIs(t, err, bench.ErrViolation)
			require.Contains(t, err.Error(), "on broken")
		})
	}
}

// TestSizingAndOutputs runs a small sizing measurement and checks the
// table, the JSON and the charts.
func TestSizingAndOutputs(t *testing.T) {
	var steps []bench.Progress
	cfg := &Options{
		Options: bench.Options{Profile: "test", Dir: t.TempDir(), Engine: smallEngine(),
			Progress: func(p bench.Progress) { steps = append(steps, p) }},
		Workloads: []string{unique, replay}, Concurrency: []int{1, 4}, Duration: 50 * time.Millisecond,
		PreloadKeys: 200, SizingKeys: 2000, BodyKeys: 200, VerifyKeys: 50, FsyncSamples: 10,
	}
	rep, err := Run(context.Background(), cfg)
	require.NoError(t, err)

	require.Len(t, steps, 2*2*2+2*2, "points, then sizing with and without bodies, per target")
	require.Equal(t, bench.Progress{Done: 12, Total: 12, Step: "sizing with bodies baseline"}, steps[len(steps)-1])

	sz := rep.Sizing
	require.EqualValues(t, 432_000_000, sz.KeysPerDay)
	require.Len(t, sz.Targets, 2)
	for _, st := range sz.Targets {
		require.Equal(t, 2000, st.Keys)
		// A record is a ~64-byte key and a ~60-byte value before
		// compression; anything far outside means the measurement is off.
		require.Greater(t, st.BytesPerKey, 20.0, st.Target)
		require.Less(t, st.BytesPerKey, 400.0, st.Target)
		require.Greater(t, st.BytesPerKeyWithBody, st.BytesPerKey+300, "a 2 KiB body costs something: "+st.Target)
		require.InDelta(t, st.BytesPerKey*432e6, st.StoreBytesPerDay, 1)
		require.Greater(t, st.Headroom, 0.0)
		require.Contains(t, []int{1, 4}, st.PeakUniqueConcurrency)
	}
	require.Equal(t, "test", rep.Meta.Profile)
	require.NotEmpty(t, rep.Meta.CPUModel)
	require.Greater(t, rep.Fsync.P50US, 0.0)

	var table bytes.Buffer
	require.NoError(t, rep.WriteTable(&table))
	for _, want := range []string{"fsync on the data disk", "unique", "replay", "baseline", "Sizing against the guide", "432.0 M"} {
		require.Contains(t, table.String(), want)
	}

	var js bytes.Buffer
	require.NoError(t, rep.WriteJSON(&js))
	var back Report
	require.NoError(t, json.Unmarshal(js.Bytes(), &back))
	require.Equal(t, rep.Points, back.Points)

	dir := filepath.Join(t.TempDir(), "plots")
	files, err := rep.Plot(dir)
	require.NoError(t, err)
	require.Len(t, files, 4)
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		require.True(t, bytes.HasPrefix(b, []byte("\x89PNG")), f)
	}
}

// TestSamePebbleOptions checks that the baseline opens Pebble exactly as the
// engine does for the same engine.Options, by comparing the OPTIONS files
// Pebble writes: the comparison must isolate the commit path.
func TestSamePebbleOptions(t *testing.T) {
	opts := &engine.Options{CacheSize: 8 << 20, MemTableSize: 2 << 20, Compression: sstable.ZstdCompression,
		CompactionConcurrency: 3}
	var files [2][]byte
	for i, tg := range []Target{engineTarget(opts), baselineTarget(opts)} {
		dir := filepath.Join(t.TempDir(), tg.Name)
		s, err := tg.Open(dir, vfs.Default)
		require.NoError(t, err)
		require.NoError(t, s.Close())
		m, err := filepath.Glob(filepath.Join(dir, "OPTIONS-*"))
		require.NoError(t, err)
		require.Len(t, m, 1)
		files[i], err = os.ReadFile(m[0])
		require.NoError(t, err)
	}
	require.Contains(t, string(files[0]), "compression=ZSTD")
	require.Contains(t, string(files[0]), "mem_table_size=2097152")
	require.Equal(t, string(files[0]), string(files[1]))
}

// TestWALParser feeds the parser a log written by Pebble's record writer,
// split at random points, and checks it counts every record.
func TestWALParser(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 20 {
		var buf bytes.Buffer
		w := record.NewWriter(&buf)
		n := 1 + rng.IntN(300)
		for range n {
			rw, err := w.Next()
			require.NoError(t, err)
			size := 1 + rng.IntN(200)
			if rng.IntN(20) == 0 {
				size = 40_000 + rng.IntN(40_000) // spans blocks
			}
			_, err = rw.Write(bytes.Repeat([]byte{byte(size)}, size))
			require.NoError(t, err)
		}
		require.NoError(t, w.Close())
		var p walParser
		var got int64
		for b := buf.Bytes(); len(b) > 0; {
			k := min(len(b), 1+rng.IntN(5000))
			got += p.feed(b[:k])
			b = b[k:]
		}
		require.False(t, p.broken, "round %d", round)
		require.EqualValues(t, n, got, "round %d", round)
	}
}

func TestOptions(t *testing.T) {
	for _, name := range bench.Profiles() {
		o, err := Profile(name)
		require.NoError(t, err)
		require.NoError(t, o.EnsureDefaults().Validate())
		require.Equal(t, name, o.EnsureDefaults().Profile)
	}
	_, err := Profile("slow")
	require.Error(t, err)
	require.Error(t, (&Options{Workloads: []string{"nope"}}).Validate())
	require.Error(t, (&Options{Concurrency: []int{0}}).Validate())
	require.Error(t, (&Options{RetryFraction: 2}).Validate())
	require.Error(t, (&Options{Options: bench.Options{CompactionNice: 20}}).Validate())
	d := (*Options)(nil).EnsureDefaults()
	require.Equal(t, Names(), d.Workloads)
	require.Equal(t, []int{1, 16, 64, 256}, d.Concurrency)
	require.Equal(t, "custom", d.Profile)
	require.Equal(t, []string{"engine", "baseline"}, []string{d.Targets[0].Name, d.Targets[1].Name})
}

// TestScale: the scale measurement bulk-loads stores of the asked sizes and
// measures unique on the engine over them; the loaded keys are real
// records the engine replays.
func TestScale(t *testing.T) {
	cfg := tinyOptions(t, unique)
	cfg.Concurrency = []int{1}
	cfg.ScaleKeys = []int{500, 2_000}
	cfg.ScaleConcurrency = 2
	cfg.ScaleRounds = 2
	rep, err := Run(context.Background(), cfg)
	require.NoError(t, err)
	require.Len(t, rep.Scale, 4, "2 sizes x 2 rounds")
	for i, s := range rep.Scale {
		require.Equal(t, "engine", s.Point.Target)
		require.Equal(t, 2, s.Point.Concurrency)
		require.Positive(t, s.Point.Requests)
		require.Positive(t, s.Relative)
		require.Equal(t, cfg.ScaleKeys[i%2], s.LiveKeys, "sizes alternate")
		require.Equal(t, 1+i/2, s.Round)
	}
	require.Equal(t, 1.0, rep.Scale[0].Relative)
	require.Equal(t, 1.0, rep.Scale[2].Relative, "relative to the first size of the same round")
	var b strings.Builder
	rep.WriteTable(&b)
	require.Contains(t, b.String(), "Scale: unique on engine at concurrency 2")
	require.Contains(t, b.String(), "geometric mean of 2 rounds")
}

// TestScaleCheckpointIsFresh: a round measures a checkpoint of the loaded
// store, and what it writes does not reach the store the next round's
// checkpoint is taken from.
func TestScaleCheckpointIsFresh(t *testing.T) {
	dir := t.TempDir()
	opts := smallEngine()
	loaded := filepath.Join(dir, "loaded")
	require.NoError(t, bench.Seed(context.Background(), loaded, opts, 7, 100, 10, nil))
	id := idemkv.ID{Tenant: "t", Endpoint: "POST /x", Key: "written-in-round-1"}
	for round := 1; round <= 2; round++ {
		ck := filepath.Join(dir, fmt.Sprint("round-", round))
		require.NoError(t, checkpoint(loaded, ck, opts))
		e, err := engine.Open(ck, opts)
		require.NoError(t, err)
		c, err := e.Claim(context.Background(), idemkv.ClaimRequest{ID: id, Fingerprint: []byte{1}})
		require.NoError(t, err)
		require.Equal(t, idemkv.Acquired, c.Outcome, "round %d", round)
		require.NoError(t, e.Complete(context.Background(), c.Lease, idemkv.Result{Status: 201}, nil))
		require.NoError(t, e.Close())
	}
}

// TestSeededStoresPassCheck runs every measurement of a run that seeds
// stores (the preloaded store of replay, both sizing stores, a scale
// store) with the engine target's seeding wrapped to run engine.Check on
// each store it seeds: every one must be sound, in the layout the engine
// writes, before the harness opens it.
func TestSeededStoresPassCheck(t *testing.T) {
	o := tinyOptions(t, replay)
	o.Concurrency, o.Duration = []int{1}, 20*time.Millisecond
	o.SizingKeys, o.BodyKeys, o.ScaleKeys, o.ScaleConcurrency = 300, 50, []int{400}, 1
	eng := engineTarget(o.Engine)
	var seeded []int
	checking := eng
	checking.Seed = func(ctx context.Context, dir string, stream uint64, n, tenants int, body []byte) error {
		require.NoError(t, eng.Seed(ctx, dir, stream, n, tenants, body))
		e, err := engine.Open(dir, o.Engine)
		require.NoError(t, err)
		defer e.Close()
		rep, err := e.Check(ctx)
		require.NoError(t, err)
		require.Zero(t, rep.ProblemCount, "%v", rep.Problems)
		require.Equal(t, n, rep.Completed)
		seeded = append(seeded, n)
		return nil
	}
	o.Targets = []Target{checking, baselineTarget(o.Engine)}
	_, err := Run(context.Background(), o)
	require.NoError(t, err)
	require.Equal(t, []int{300, 300, 50, 400}, seeded, "preload, sizing, sizing with bodies, scale")
}
