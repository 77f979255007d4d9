package engine

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/stretchr/testify/require"
)

// smallRuns makes Load write runs of about 64 KiB, so that a few thousand
// records make many runs.
func smallRuns(t *testing.T) {
	prev := loadRunBytes
	loadRunBytes = 64 << 10
	t.Cleanup(func() { loadRunBytes = prev })
}

// dayRecords is n completed records spread over a day of expiries, with
// a few unsettled ones, in the store's order when sorted is set and
// shuffled (deterministically) otherwise.
func dayRecords(opts *Options, n int, sorted bool) []idemkv.Record {
	var recs []idemkv.Record
	for i := range n {
		r := idemkv.Record{ID: id(fmt.Sprintf("day-%07d", i)), State: idemkv.StateCompleted, Fingerprint: fpA,
			Result:  idemkv.Result{Status: 201, Pointer: fmt.Sprintf("/p/%d", i)},
			Expires: t0.Add(time.Duration(1+i%1440) * time.Minute)}
		r.Created = r.Expires.Add(-24 * time.Hour)
		if i%97 == 0 {
			r.State, r.Mode, r.Expires, r.Created = idemkv.StateUncertain, idemkv.ModeRemote, time.Time{}, time.Time{}
		}
		recs = append(recs, r)
	}
	if sorted {
		slices.SortFunc(recs, func(a, b idemkv.Record) int { return bytes.Compare(SortKey(opts, &a), SortKey(opts, &b)) })
	} else {
		for i := range recs { // a fixed permutation
			j := (i * 7919) % len(recs)
			recs[i], recs[j] = recs[j], recs[i]
		}
	}
	return recs
}

// Records given in the store's order are written as runs that do not
// overlap and land in the last level: nothing is left for compactions.
// The store passes Check, and the first Open uses the claim filter Load
// saved, with every loaded key in it.
func TestLoadSortedRunsLandInTheLastLevel(t *testing.T) {
	smallRuns(t)
	clock := fakeclock.New(t0)
	dir := t.TempDir()
	opts := loadOpts(clock)
	opts.Retention = 48 * time.Hour
	recs := dayRecords(opts, 20000, true)
	var progress []int
	n, err := Load(ctx, dir, opts, slices.Values(recs), &LoadOptions{Records: int64(len(recs)), Progress: func(s int) { progress = append(progress, s) }})
	require.NoError(t, err)
	require.Equal(t, len(recs), n)
	require.Greater(t, len(progress), 10, "many runs")
	require.Equal(t, len(recs), progress[len(progress)-1])

	opts.ReplayCacheSize = -1
	e, err := Open(dir, opts)
	require.NoError(t, err)
	defer e.Close()
	// The completed records' tables are all in the last level.
	levels, err := e.db.SSTables(pebble.WithKeyRangeFilter(expiryStart, expiryEnd))
	require.NoError(t, err)
	for level, tables := range levels[:len(levels)-1] {
		require.Empty(t, tables, "level %d", level)
	}
	require.Greater(t, len(levels[len(levels)-1]), 10)
	st, err := e.Stats()
	require.NoError(t, err)
	require.True(t, st.ClaimFilterSaved, "Load's filter is used at Open")
	require.GreaterOrEqual(t, st.ClaimFilterKeys, int64(2*len(recs)))

	rep, err := e.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%v", rep.Problems)
	require.Equal(t, len(recs), rep.Records)
	for _, r := range recs {
		c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: r.ID, Fingerprint: fpA, Mode: r.Mode})
		require.NoError(t, err)
		require.NotEqual(t, idemkv.Acquired, c.Outcome, r.ID.Key)
	}
}

// Records in any order are stored all the same.
func TestLoadUnsortedRecords(t *testing.T) {
	smallRuns(t)
	clock := fakeclock.New(t0)
	dir := t.TempDir()
	opts := loadOpts(clock)
	opts.Retention = 48 * time.Hour
	recs := dayRecords(opts, 5000, false)
	_, err := Load(ctx, dir, opts, slices.Values(recs), &LoadOptions{Records: int64(len(recs))})
	require.NoError(t, err)
	e, err := Open(dir, opts)
	require.NoError(t, err)
	defer e.Close()
	rep, err := e.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%v", rep.Problems)
	require.Equal(t, len(recs), rep.Records)
	for _, r := range recs {
		_, err := e.Get(ctx, r.ID)
		require.NoError(t, err, r.ID.Key)
	}
}

// A duplicate is caught wherever its first copy is: in the run being
// filled, in the run being ingested, or in the store.
func TestLoadFindsDuplicatesAcrossRuns(t *testing.T) {
	smallRuns(t)
	clock := fakeclock.New(t0)
	opts := loadOpts(clock)
	opts.Retention = 48 * time.Hour
	recs := dayRecords(opts, 3000, true)
	for _, back := range []int{1, 400, 2500} {
		dir := t.TempDir()
		withDup := append(slices.Clone(recs), recs[len(recs)-back])
		_, err := Load(ctx, dir, opts, slices.Values(withDup), &LoadOptions{Records: int64(len(withDup))})
		require.ErrorIs(t, err, ErrExists, "duplicate of the record %d back", back)
	}
}

// A Load that dies part way (the machine crashes after some runs were
// ingested) leaves a store that opens, passes Check and holds whole runs;
// its filter was never saved, so Open builds it by scanning and finds
// every stored key; the next Load removes the sstable the crash left.
func TestLoadCrashLeavesASoundStore(t *testing.T) {
	smallRuns(t)
	clock := fakeclock.New(t0)
	mem := vfs.NewCrashableMem()
	opts := loadOpts(clock)
	opts.FS, opts.Retention = mem, 48*time.Hour
	recs := dayRecords(opts, 20000, true)
	var crashed *vfs.MemFS
	stop := errors.New("stop")
	testHookIngested = func(run int) error {
		if run == 5 {
			crashed = mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
			return stop
		}
		return nil
	}
	t.Cleanup(func() { testHookIngested = nil })
	_, err := Load(ctx, "/db", opts, slices.Values(recs), &LoadOptions{Records: int64(len(recs))})
	require.ErrorIs(t, err, stop)
	testHookIngested = nil

	f, err := crashed.Create("/db/"+loadFilePrefix+"000099.sst", vfs.WriteCategoryUnspecified)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	opts.FS = crashed
	e, err := Open("/db", opts)
	require.NoError(t, err)
	<-e.ClaimFilterBuilt()
	st, err := e.Stats()
	require.NoError(t, err)
	require.False(t, st.ClaimFilterSaved)
	rep, err := e.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%v", rep.Problems)
	require.Positive(t, rep.Records)
	require.Less(t, rep.Records, len(recs))
	// The stored records are a prefix of recs (the runs are in order).
	for _, r := range recs[:rep.Records] {
		c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: r.ID, Fingerprint: fpA, Mode: r.Mode})
		require.NoError(t, err)
		require.NotEqual(t, idemkv.Acquired, c.Outcome, r.ID.Key)
	}
	require.NoError(t, e.Close())

	_, err = Load(ctx, "/db", opts, slices.Values(recs[rep.Records:]), nil)
	require.NoError(t, err)
	_, err = crashed.Stat("/db/" + loadFilePrefix + "000099.sst")
	require.True(t, errors.Is(err, os.ErrNotExist), "the crashed Load's sstable is removed")
}

// Without a claim filter, every record is checked against the runs and
// the store.
func TestLoadFindsDuplicatesWithoutAFilter(t *testing.T) {
	smallRuns(t)
	clock := fakeclock.New(t0)
	opts := loadOpts(clock)
	opts.Retention, opts.ClaimFilterBitsPerKey = 48*time.Hour, -1
	recs := dayRecords(opts, 3000, true)
	for _, back := range []int{1, 400, 2500} {
		withDup := append(slices.Clone(recs), recs[len(recs)-back])
		_, err := Load(ctx, t.TempDir(), opts, slices.Values(withDup), nil)
		require.ErrorIs(t, err, ErrExists, "duplicate of the record %d back", back)
	}
}

// A run finds its records by hash, and tells apart two keys whose hashes
// are equal.
func TestLoadRunKeysWithEqualHashes(t *testing.T) {
	r := newLoadRun()
	a, b := appendRecordKey(nil, id("a")), appendRecordKey(nil, id("b"))
	require.NoError(t, r.Set(a, []byte("va"), nil))
	r.addID(a, 7)
	require.NoError(t, r.Set(b, []byte("vb"), nil))
	r.addID(b, 7) // the same hash
	require.True(t, r.has(a, 7))
	require.True(t, r.has(b, 7))
	require.False(t, r.has(appendRecordKey(nil, id("c")), 7))
	require.False(t, r.has(a, 8))
}
