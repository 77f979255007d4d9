package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/record"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/stretchr/testify/require"
)

// smallEngine keeps test stores small; the Pebble settings that matter
// (filters, compression) stay at their defaults.
func smallEngine() *engine.Options {
	return &engine.Options{CacheSize: 4 << 20, MemTableSize: 4 << 20}
}

// tinyConfig runs one workload briefly at concurrency 1 and 4, checking
// every acknowledged key afterwards.
func tinyConfig(t *testing.T, workload string) Config {
	return Config{
		Workloads: []string{workload}, Concurrency: []int{1, 4}, Duration: 100 * time.Millisecond,
		Dir: t.TempDir(), Engine: smallEngine(), PreloadKeys: 300, SizingKeys: -1, BodyKeys: -1,
		VerifyKeys: -1, FsyncSamples: 5,
	}
}

// TestWorkloads runs every workload on both targets and checks the figures
// are sane and consistent with what each target is known to do.
func TestWorkloads(t *testing.T) {
	for _, wl := range Workloads() {
		t.Run(wl, func(t *testing.T) {
			rep, err := Run(context.Background(), tinyConfig(t, wl))
			require.NoError(t, err)
			require.Len(t, rep.Points, 4, "2 concurrencies x 2 targets")
			require.Len(t, rep.Comparisons, 2)
			for _, c := range rep.Comparisons {
				require.Equal(t, "engine", c.Target)
				require.Equal(t, "baseline", c.Reference)
				require.Greater(t, c.Ratio, 0.0)
			}
			durable := wl != Replay && wl != Mismatch
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
				require.Greater(t, p.WriteAmp, 0.0, what)
				require.Greater(t, p.VerifiedKeys, 0, what)
				o := p.Outcomes
				require.Equal(t, p.Requests, o.Acquired+o.Replay+o.InProgress+o.Mismatch, what)
				if durable {
					require.Greater(t, p.Fsyncs, int64(0), what)
					require.Greater(t, p.WALFsyncsPerRequest, 0.0, what)
					require.Greater(t, p.SyncedBatches, int64(0), what)
				} else {
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
	case Unique, Remote:
		require.Equal(t, p.Requests, o.Acquired, what)
		require.EqualValues(t, p.Requests, p.VerifiedKeys, "every acknowledged request replays: "+what)
		require.Equal(t, p.Requests, p.KeysStored, what)
		// The baseline commits exactly a claim and a completion per request:
		// this also checks the WAL record counter against known commits.
		if p.Target == "baseline" {
			require.Equal(t, 2*p.Requests, p.SyncedBatches, what)
		} else if wl == Unique {
			require.LessOrEqual(t, p.SyncedBatches, p.Requests, "the engine makes at most one durable write per local request: "+what)
		} else {
			require.LessOrEqual(t, p.SyncedBatches, 2*p.Requests, what)
		}
	case Retry:
		// Whether a retry finds its original finished (Replay) or still
		// running (InProgress) depends on timing; that it never re-runs
		// does not.
		require.Greater(t, o.Replay+o.InProgress, int64(0), what)
		require.EqualValues(t, o.Acquired, p.VerifiedKeys, what)
		if p.Target == "baseline" {
			require.Equal(t, 2*o.Acquired, p.SyncedBatches, what)
		}
	case Hot:
		require.Equal(t, p.Requests-o.Acquired, o.Replay+o.InProgress, "every duplicate is answered, none re-run: "+what)
		require.Equal(t, (p.Requests+31)/32, o.Acquired, "one acquisition per hot key: "+what)
		require.EqualValues(t, o.Acquired, p.VerifiedKeys, what)
	case Replay:
		require.Equal(t, p.Requests, o.Replay, what)
		require.EqualValues(t, 300, p.KeysStored, what)
	case Mismatch:
		require.Equal(t, p.Requests, o.Mismatch, what)
	}
}

// forgetful is a store that acknowledges completions without making them:
// it releases the claim instead. The harness must catch it.
type forgetful struct{ Store }

func (f forgetful) Complete(ctx context.Context, l idemkv.Lease, _ idemkv.Result, _ func(idemkv.Effects) error) error {
	return f.Release(ctx, l)
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
		{"lost completions", Unique, func(s Store) Store { return forgetful{s} }},
		{"wrong replay", Replay, func(s Store) Store { return wrongReplay{s} }},
		{"wrong replay of a retry", Retry, func(s Store) Store { return wrongReplay{s} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tinyConfig(t, tc.workload)
			cfg.Concurrency = []int{2}
			cfg.Duration = 30 * time.Millisecond
			good := EngineTarget(cfg.Engine)
			bad := Target{Name: "broken", Open: func(dir string, fs vfs.FS) (Store, error) {
				s, err := good.Open(dir, fs)
				if err != nil {
					return nil, err
				}
				return tc.wrap(s), nil
			}}
			cfg.Targets = []Target{good, bad}
			_, err := Run(context.Background(), cfg)
			require.Error(t, err)
			require.True(t, errors.Is(err, errViolation), "%v", err)
			require.Contains(t, err.Error(), "on broken")
		})
	}
}

// TestSizingAndOutputs runs a small sizing measurement and checks the
// table, the JSON and the charts.
func TestSizingAndOutputs(t *testing.T) {
	cfg := Config{
		Profile: "test", Workloads: []string{Unique, Replay}, Concurrency: []int{1, 4},
		Duration: 50 * time.Millisecond, Dir: t.TempDir(), Engine: smallEngine(), PreloadKeys: 200,
		SizingKeys: 2000, BodyKeys: 200, VerifyKeys: 50, FsyncSamples: 10,
	}
	var steps []Progress
	cfg.Progress = func(p Progress) { steps = append(steps, p) }
	rep, err := Run(context.Background(), cfg)
	require.NoError(t, err)

	require.Len(t, steps, 2*2*2+2*2, "points, then sizing with and without bodies, per target")
	require.Equal(t, Progress{Done: 12, Total: 12, Step: "sizing with bodies baseline"}, steps[len(steps)-1])

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

// TestDocsNameEveryJSONField checks that docs/benchmarks.md documents every
// field of the JSON report, so the names stay stable and explained.
func TestDocsNameEveryJSONField(t *testing.T) {
	doc, err := os.ReadFile("../docs/benchmarks.md")
	require.NoError(t, err)
	rep := Report{Points: []Point{{}}, Comparisons: []Comparison{{}}, Sizing: Sizing{Targets: []SizingTarget{{}}}, Scale: []ScalePoint{{}}}
	var js bytes.Buffer
	require.NoError(t, rep.WriteJSON(&js))
	var v any
	require.NoError(t, json.Unmarshal(js.Bytes(), &v))
	ttlRep := TTLReport{Runs: []TTLRun{{Samples: []TTLSample{{}}}}}
	js.Reset()
	require.NoError(t, ttlRep.WriteJSON(&js))
	var tv any
	require.NoError(t, json.Unmarshal(js.Bytes(), &tv))
	httpRep := HTTPReport{Targets: []HTTPTarget{{}}}
	js.Reset()
	require.NoError(t, httpRep.WriteJSON(&js))
	var hv any
	require.NoError(t, json.Unmarshal(js.Bytes(), &hv))
	v = []any{v, tv, hv}
	names := map[string]bool{}
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				names[k] = true
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(v)
	var missing []string
	for n := range names {
		if !regexp.MustCompile("`" + regexp.QuoteMeta(n) + "`").Match(doc) {
			missing = append(missing, n)
		}
	}
	sort.Strings(missing)
	require.Empty(t, missing, "JSON fields not documented in docs/benchmarks.md")
}

// TestSamePebbleOptions checks that the baseline opens Pebble exactly as the
// engine does for the same engine.Options, by comparing the OPTIONS files
// Pebble writes: the comparison must isolate the commit path.
func TestSamePebbleOptions(t *testing.T) {
	opts := &engine.Options{CacheSize: 8 << 20, MemTableSize: 2 << 20, Compression: sstable.ZstdCompression,
		CompactionConcurrency: 3}
	var files [2][]byte
	for i, tg := range []Target{EngineTarget(opts), BaselineTarget(opts)} {
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

func TestKeys(t *testing.T) {
	uuid := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	seen := map[idemkv.ID]bool{}
	for s := range uint64(3) {
		for i := range uint64(1000) {
			id := keyOf(s<<20, i, 1000)
			require.NoError(t, id.Validate())
			require.Regexp(t, uuid, id.Key)
			require.True(t, strings.HasPrefix(id.Tenant, "acct_"))
			require.False(t, seen[id], "duplicate key")
			seen[id] = true
			require.Equal(t, id, keyOf(s<<20, i, 1000), "keys are derived, not drawn")
			require.Len(t, fingerprint(s, i, false), 9)
			require.NotEqual(t, fingerprint(s, i, false), fingerprint(s, i, true))
			require.Len(t, resultOf(s, i, nil).Pointer, pointerLen)
		}
	}
	require.Len(t, sizingBody(2048), 2048)
	require.True(t, json.Valid(sizingBody(2048)))
}

func TestConfig(t *testing.T) {
	for _, name := range Profiles() {
		c, err := Profile(name)
		require.NoError(t, err)
		require.NoError(t, c.Validate())
		require.Equal(t, name, c.ensureDefaults().Profile)
	}
	_, err := Profile("slow")
	require.Error(t, err)
	require.Error(t, Config{Workloads: []string{"nope"}}.Validate())
	require.Error(t, Config{Concurrency: []int{0}}.Validate())
	require.Error(t, Config{RetryFraction: 2}.Validate())
	d := Config{}.ensureDefaults()
	require.Equal(t, Workloads(), d.Workloads)
	require.Equal(t, []int{1, 16, 64, 256}, d.Concurrency)
	require.True(t, slices.Equal([]string{"engine", "baseline"}, []string{d.Targets[0].Name, d.Targets[1].Name}))
	for _, w := range Workloads() {
		require.NotEmpty(t, Describe(w))
	}
	require.Empty(t, Describe("nope"))
}

// TestScale: the scale measurement bulk-loads stores of the asked sizes and
// measures unique on the engine over them; the loaded keys are real
// records the engine replays.
func TestScale(t *testing.T) {
	cfg := tinyConfig(t, Unique)
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
	require.NoError(t, bulkLoad(context.Background(), loaded, opts, 7, 100, 10))
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

func TestBulkLoadReplays(t *testing.T) {
	dir := t.TempDir()
	opts := smallEngine()
	require.NoError(t, bulkLoad(context.Background(), dir, opts, 7, 100, 10))
	e, err := engine.Open(dir, opts)
	require.NoError(t, err)
	defer e.Close()
	rep, err := e.Check(context.Background())
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%v", rep.Problems)
	require.Equal(t, 100, rep.Completed)
	for i := range uint64(100) {
		c, err := e.Claim(context.Background(), idemkv.ClaimRequest{ID: keyOf(7, i, 10), Fingerprint: fingerprint(7, i, false)})
		require.NoError(t, err)
		require.Equal(t, idemkv.Replay, c.Outcome)
		require.Equal(t, resultOf(7, i, nil), c.Record.Result)
	}
}

// TestTTLRun runs a tiny retention measurement end to end: both runs, the
// cost measurement, the extrapolation and the outputs.
func TestTTLRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for seconds")
	}
	cfg := TTLConfig{Retention: 2 * time.Second, Periods: 2, Rate: 400, Clients: 4,
		SampleEvery: 250 * time.Millisecond, CostKeys: 2000, Tenants: 10, Dir: t.TempDir()}
	rep, err := RunTTL(context.Background(), cfg)
	require.NoError(t, err)
	require.Len(t, rep.Runs, 2)
	sw, none := rep.Runs[0], rep.Runs[1]
	require.Equal(t, "sweeper", sw.Name)
	require.Positive(t, sw.Requests)
	require.Positive(t, sw.Swept, "records expired during the run must be swept")
	require.Zero(t, none.Swept)
	require.NotEmpty(t, sw.Samples)
	require.Positive(t, sw.TableBytesPerLiveKey)
	require.Equal(t, 2000, rep.Cost.Keys)
	require.Positive(t, rep.Cost.DeletedPerSec)
	require.Positive(t, rep.Cost.CPUPerMillionDeleted)
	require.Less(t, rep.Cost.TableBytesAfter, rep.Cost.TableBytesBefore/10, "space comes back")
	require.InDelta(t, 432e6, rep.Guide.KeysPerDay, 1)
	require.Positive(t, rep.Guide.SweeperCores)

	var out bytes.Buffer
	require.NoError(t, rep.WriteTable(&out))
	require.Contains(t, out.String(), "no-sweeper")
	out.Reset()
	require.NoError(t, rep.WriteJSON(&out))
	var back TTLReport
	require.NoError(t, json.Unmarshal(out.Bytes(), &back))
	require.Equal(t, rep.Runs[0].Requests, back.Runs[0].Requests)
	f, err := rep.Plot(t.TempDir())
	require.NoError(t, err)
	require.FileExists(t, f)

	require.Error(t, TTLConfig{Periods: 1}.Validate())
	require.Error(t, TTLConfig{Retention: time.Millisecond}.Validate())
	_, err = TTLProfile("slow")
	require.Error(t, err)
}
