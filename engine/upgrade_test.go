package engine

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine/internal/record"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/internal/upgradetest"
)

// layout3Fixture, layout4Fixture and layout5Fixture are the stores
// written by the last code that wrote layouts 3, 4 and 5, and the requests
// that wrote them (generate.go there): the same requests each time.
const (
	layout3Fixture = "testdata/layout3"
	layout4Fixture = "testdata/layout4"
	layout5Fixture = "testdata/layout5"
)

// migrationLog counts the engine's "store migrated" lines.
type migrationLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *migrationLog) Infof(format string, args ...any) {
	if s := fmt.Sprintf(format, args...); strings.Contains(s, "store migrated") {
		l.mu.Lock()
		l.lines = append(l.lines, s)
		l.mu.Unlock()
	}
}
func (l *migrationLog) Errorf(string, ...any) {}
func (l *migrationLog) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}

func (l *migrationLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.lines)
}

// fixtureOptions are the engine options the fixture was written with,
// with the clock at now.
func fixtureOptions(f *upgradetest.Fixture, clock *fakeclock.Clock, log *migrationLog) *Options {
	return &Options{Clock: clock, Lease: f.Lease(), Retention: f.Retention(), RetentionClasses: f.Classes(),
		NoBackgroundSweep: true, CacheSize: 1 << 20, MemTableSize: 1 << 20, Logger: log}
}

// requireFixtureStore checks a store opened from the fixture in the
// current layout (or read-only in its own): every invariant holds, every
// record, effect and unsettled record the old code wrote is there, and
// the pending index (which layout 3 lacked) counts the unsettled ones.
func requireFixtureStore(t *testing.T, f *upgradetest.Fixture, e *Engine) {
	t.Helper()
	rep, err := e.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%v", rep.Problems)
	require.True(t, rep.Layout)
	completed, uncertain, abandoned := len(f.Keys(upgradetest.Completed)), len(f.Keys(upgradetest.Uncertain)), len(f.Keys(upgradetest.Abandoned))
	require.Equal(t, [4]int{completed + uncertain + abandoned, completed, uncertain, abandoned},
		[4]int{rep.Records, rep.Completed, rep.Uncertain, rep.InProgress})
	require.Equal(t, uncertain+abandoned, rep.Pending)
	require.Equal(t, [2]int{len(f.Effects), len(f.Effects)}, [2]int{rep.Effects, rep.EffectsPaired})
	st, err := e.Stats()
	require.NoError(t, err)
	require.Equal(t, [2]int64{int64(uncertain), int64(abandoned)}, [2]int64{st.UncertainRecords, st.RemoteRecords})

	effects := map[string]string{}
	require.NoError(t, e.ScanData(ctx, nil, func(k, v []byte) bool {
		effects[string(k)] = string(v)
		return true
	}))
	require.Equal(t, f.Effects, effects)
}

// TestLayout3StoreUpgrades opens the store the layout-3 code wrote through
// httpidem over HTTP: a read-write Open migrates it (and only the first
// does); the uncertain record answers Reconciling; the uncertain and
// abandoned records are listed from the index the migration built; a
// remote claim abandoned by the old process is resumed with its operation
// id; retention classes keep the expiries they were written with. That
// the outcomes replay through today's middleware is httpidem's
// TestEarlierLayoutsReplay.
func TestLayout3StoreUpgrades(t *testing.T) {
	f := upgradetest.Load(t, layout3Fixture)
	require.Equal(t, 3, f.Layout)
	dir := f.CopyStore(t)
	clock := fakeclock.New(f.End.Add(time.Second))
	log := &migrationLog{}
	opts := fixtureOptions(f, clock, log)

	l, err := StoredLayout(dir, opts)
	require.NoError(t, err)
	require.Equal(t, uint64(3), l)
	ro := *opts
	ro.ReadOnly = true
	_, err = Open(dir, &ro)
	require.ErrorIs(t, err, ErrLayout, "a read-only Open cannot migrate")

	e, err := Open(dir, opts)
	require.NoError(t, err)
	require.Equal(t, 1, log.count(), "the first read-write Open migrates")
	requireFixtureStore(t, f, e)
	require.NoError(t, e.Close())
	l, err = StoredLayout(dir, nil)
	require.NoError(t, err)
	require.Equal(t, uint64(Layout), l)

	// A second Open finds the current layout and migrates nothing; so
	// does a read-only one now.
	r, err := Open(dir, &ro)
	require.NoError(t, err)
	require.NoError(t, r.Close())
	e, err = Open(dir, opts)
	require.NoError(t, err)
	defer e.Close()
	require.Equal(t, 1, log.count(), "a migrated store is not migrated again")
	requireFixtureStore(t, f, e)
	db := e.db
	v, closer, err := db.Get(layoutKey)
	require.NoError(t, err)
	require.Equal(t, uint64(Layout), binary.BigEndian.Uint64(v))
	require.NoError(t, closer.Close())
	require.Len(t, e.secret, 32, "the migration draws the store's secret")

	// The outcomes replay through today's middleware (package httpidem's
	// TestEarlierLayoutsReplay); here, through the engine alone.
	// The uncertain refund awaits reconciliation; the abandoned one is
	// listed once its lease (30 s from its claim) has run out.
	unc, aband := f.Keys(upgradetest.Uncertain)[0], f.Keys(upgradetest.Abandoned)[0]
	urec, err := e.Get(ctx, f.ID(unc))
	require.NoError(t, err)
	c, err := e.Claim(ctx, f.Claim(unc, urec.Fingerprint))
	require.NoError(t, err)
	require.Equal(t, idemkv.Reconciling, c.Outcome)
	listed := func() []string {
		page, err := e.List(ctx, idemkv.ListRequest{})
		require.NoError(t, err)
		var keys []string
		for _, r := range page.Records {
			keys = append(keys, r.ID.Key)
		}
		return keys
	}
	require.Equal(t, []string{unc.Key}, listed(), "the abandoned claim's lease is live")
	clock.Advance(f.Lease())
	require.Equal(t, []string{unc.Key, aband.Key}, listed(), "oldest first")

	// The abandoned refund is resumable: a retry takes it over under the
	// operation id the old process sent downstream.
	old, err := e.Get(ctx, f.ID(aband))
	require.NoError(t, err)
	resumeAbandoned(t, e, f, aband, old)
	require.Equal(t, []string{unc.Key}, listed())

	// Retention: the note's class keeps it an hour from its completion,
	// the payments' class 30 days.
	clock.Advance(time.Hour)
	for _, q := range f.Keys(upgradetest.Completed) {
		_, err := e.Get(ctx, f.ID(q))
		if q.Route == "note" {
			require.ErrorIs(t, err, idemkv.ErrNotFound, "%s has expired", q.Key)
		} else {
			require.NoError(t, err, q.Key)
		}
	}
}

// TestLayout4StoreUpgrades opens the store the layout-4 code wrote
// through httpidem over HTTP. A read-only Open reads it as it is: sound,
// still in layout 4 and without a secret, so it cannot claim. The first
// read-write Open migrates it, adding the marker and the store's secret
// in one batch with the epoch, and only the first does; the secret is
// drawn once. The abandoned refund, taken over, resumes the operation id
// the old process drew for it, not the one the store would derive. Once the uncertain
// refund is escalated (its mark stays unknown) and settled with no effect,
// its retry gets the derived id.
func TestLayout4StoreUpgrades(t *testing.T) {
	f := upgradetest.Load(t, layout4Fixture)
	require.Equal(t, 4, f.Layout)
	dir := f.CopyStore(t)
	clock := fakeclock.New(f.End.Add(time.Second))
	log := &migrationLog{}
	opts := fixtureOptions(f, clock, log)

	l, err := StoredLayout(dir, opts)
	require.NoError(t, err)
	require.Equal(t, uint64(4), l)
	ro := *opts
	ro.ReadOnly = true
	r, err := Open(dir, &ro)
	require.NoError(t, err, "a read-only Open reads layout 4 as it is")
	require.Nil(t, r.secret)
	requireFixtureStore(t, f, r)
	unc, aband := f.Keys(upgradetest.Uncertain)[0], f.Keys(upgradetest.Abandoned)[0]
	rec, err := r.Get(ctx, f.ID(unc))
	require.NoError(t, err)
	require.Equal(t, idemkv.StateUncertain, rec.State)
	require.True(t, rec.Marked.IsZero(), "marked by a store that did not keep the mark")
	_, err = r.Claim(ctx, idemkv.ClaimRequest{ID: f.ID(aband), Fingerprint: rec.Fingerprint, Mode: idemkv.ModeRemote})
	require.ErrorIs(t, err, ErrReadOnly)
	require.NoError(t, r.Close())
	l, err = StoredLayout(dir, opts)
	require.NoError(t, err)
	require.Equal(t, uint64(4), l, "a read-only Open changes nothing")
	require.Zero(t, log.count())

	e, err := Open(dir, opts)
	require.NoError(t, err)
	require.Equal(t, 1, log.count(), "the first read-write Open migrates")
	requireFixtureStore(t, f, e)
	require.Len(t, e.secret, record.SecretLen)
	secret := bytes.Clone(e.secret)
	require.NoError(t, e.Close())
	l, err = StoredLayout(dir, nil)
	require.NoError(t, err)
	require.Equal(t, uint64(Layout), l)

	e, err = Open(dir, opts)
	require.NoError(t, err)
	defer e.Close()
	require.Equal(t, 1, log.count(), "a migrated store is not migrated again")
	require.Equal(t, secret, e.secret, "the secret is drawn once")
	requireFixtureStore(t, f, e)

	// The abandoned refund, once its lease has run out, is resumed under
	// the operation id the layout-4 process drew and sent downstream.
	clock.Advance(f.Lease())
	old, err := e.Get(ctx, f.ID(aband))
	require.NoError(t, err)
	require.NotEqual(t, idemkv.DeriveOperationID(e.secret, old.ID, old.Fingerprint, 0), old.OperationID)
	resumeAbandoned(t, e, f, aband, old)

	rec, err = e.Get(ctx, f.ID(unc))
	require.NoError(t, err)
	derived := idemkv.DeriveOperationID(e.secret, rec.ID, rec.Fingerprint, 0)
	require.NotEqual(t, derived, rec.OperationID, "drawn at random by the layout-4 code")
	require.NoError(t, e.Escalate(ctx, idemkv.EscalateRequest{ID: rec.ID, Token: rec.Token, Note: "ops"}))
	rec, err = e.Get(ctx, f.ID(unc))
	require.NoError(t, err)
	require.True(t, rec.Escalated)
	require.True(t, rec.Marked.IsZero(), "escalating keeps the mark, and this one was never kept")
	require.NoError(t, e.Resolve(ctx, idemkv.ResolveRequest{ID: rec.ID, Token: rec.Token, NoEffect: true}))
	c, err := e.Claim(ctx, f.Claim(unc, rec.Fingerprint))
	require.NoError(t, err)
	require.Equal(t, idemkv.Acquired, c.Outcome)
	require.Equal(t, derived, c.Lease.OperationID, "a retry after no effect runs under the derived id")
	require.NoError(t, e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, nil))
	rep, err := e.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%v", rep.Problems)
}

// TestLayout5StoreUpgrades opens the store the layout-5 code wrote, whose
// remote records all store their operation ids: a read-only Open reads it
// as it is; the first read-write Open migrates it by writing the marker
// alone, keeping the secret; the abandoned refund, whose stored id is the derived one,
// is resumed under it, and its completion, written in layout 6, stores
// none.
func TestLayout5StoreUpgrades(t *testing.T) {
	f := upgradetest.Load(t, layout5Fixture)
	require.Equal(t, 5, f.Layout)
	dir := f.CopyStore(t)
	clock := fakeclock.New(f.End.Add(time.Second))
	log := &migrationLog{}
	opts := fixtureOptions(f, clock, log)

	l, err := StoredLayout(dir, opts)
	require.NoError(t, err)
	require.Equal(t, uint64(5), l)
	ro := *opts
	ro.ReadOnly = true
	r, err := Open(dir, &ro)
	require.NoError(t, err, "a read-only Open reads layout 5 as it is")
	requireFixtureStore(t, f, r)
	secret := bytes.Clone(r.secret)
	require.Len(t, secret, record.SecretLen)
	require.NoError(t, r.Close())
	l, err = StoredLayout(dir, opts)
	require.NoError(t, err)
	require.Equal(t, uint64(5), l, "a read-only Open changes nothing")

	e, err := Open(dir, opts)
	require.NoError(t, err)
	require.Equal(t, 1, log.count(), "the first read-write Open migrates")
	require.Equal(t, secret, e.secret, "the secret is kept")
	requireFixtureStore(t, f, e)
	require.NoError(t, e.Close())
	l, err = StoredLayout(dir, nil)
	require.NoError(t, err)
	require.Equal(t, uint64(Layout), l)
	e, err = Open(dir, opts)
	require.NoError(t, err)
	defer e.Close()
	require.Equal(t, 1, log.count(), "a migrated store is not migrated again")

	aband := f.Keys(upgradetest.Abandoned)[0]
	old, err := e.Get(ctx, f.ID(aband))
	require.NoError(t, err)
	stored, _ := storedRecord(t, e, old.ID)
	require.Equal(t, old.OperationID, stored.OperationID, "written in layout 5, with its id")
	require.Equal(t, idemkv.DeriveOperationID(e.secret, old.ID, old.Fingerprint, 0), old.OperationID)

	clock.Advance(f.Lease())
	resumeAbandoned(t, e, f, aband, old)
	stored, _ = storedRecord(t, e, old.ID)
	require.Equal(t, idemkv.StateCompleted, stored.State)
	require.Zero(t, stored.OperationID, "written in layout 6, without the derived id")
	rep, err := e.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.ProblemCount, "%v", rep.Problems)
}

// resumeAbandoned takes over the abandoned remote claim q, whose record
// was old, and requires the operation id the old process sent downstream,
// then completes it.
func resumeAbandoned(t *testing.T, e *Engine, f *upgradetest.Fixture, q upgradetest.Request, old idemkv.Record) {
	t.Helper()
	c, err := e.Claim(ctx, f.Claim(q, old.Fingerprint))
	require.NoError(t, err)
	require.Equal(t, idemkv.Acquired, c.Outcome)
	require.True(t, c.Lease.Takeover())
	require.Equal(t, old.OperationID, c.Lease.OperationID, "resumed under the id sent downstream")
	require.NoError(t, e.Complete(ctx, c.Lease, idemkv.Result{Status: 201}, nil))
}

// TestOpenRefusesAFutureLayout: the fixture's store marked with layout 99
// is refused read-write and read-only, and left unchanged; StoredLayout
// names it and refuses it too.
func TestOpenRefusesAFutureLayout(t *testing.T) {
	f := upgradetest.Load(t, layout3Fixture)
	dir := f.CopyStore(t)
	po := (&Options{}).EnsureDefaults().PebbleOptions()
	db, err := pebble.Open(dir, po)
	require.NoError(t, err)
	require.NoError(t, db.Set(layoutKey, binary.BigEndian.AppendUint64(nil, 99), pebble.Sync))
	require.NoError(t, db.Close())
	for _, ro := range []bool{false, true} {
		_, err := Open(dir, &Options{ReadOnly: ro, NoBackgroundSweep: true})
		require.ErrorIs(t, err, ErrLayout, "read-only %v", ro)
		require.ErrorContains(t, err, "layout 99")
	}
	l, err := StoredLayout(dir, nil)
	require.ErrorIs(t, err, ErrLayout)
	require.Equal(t, uint64(99), l)
	db, err = pebble.Open(dir, po)
	require.NoError(t, err)
	_, _, err = db.Get(pendingStart)
	require.ErrorIs(t, err, pebble.ErrNotFound)
	v, closer, err := db.Get(layoutKey)
	require.NoError(t, err)
	require.Equal(t, uint64(99), binary.BigEndian.Uint64(v))
	require.NoError(t, closer.Close())
	require.NoError(t, db.Close())
}

// TestStoredLayoutOfNoStore: StoredLayout creates no store where there is
// none (Pebble leaves its lock file), and reports a new, empty store as 0.
func TestStoredLayoutOfNoStore(t *testing.T) {
	dir := t.TempDir()
	_, err := StoredLayout(dir, nil)
	require.Error(t, err)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, ent := range entries {
		require.Equal(t, "LOCK", ent.Name(), "only Pebble's lock file")
	}

	db, err := pebble.Open(dir, (&Options{}).EnsureDefaults().PebbleOptions())
	require.NoError(t, err)
	require.NoError(t, db.Close())
	l, err := StoredLayout(dir, nil)
	require.NoError(t, err)
	require.Zero(t, l)
}

// TestLayout3MigrationCrash and TestLayout4MigrationCrash open the
// fixture's store on a crashable filesystem, taking a crash clone before every filesystem write of the
// Open that migrates it and of its Close. Every clone opens (the crash
// left the old layout or the current one, never a mix: the index of
// layout 3, the secret, the marker and the epoch are one synced batch),
// and is then in the current layout with every record, a complete
// pending index and a secret; the clones that crashed before the batch
// was durable are migrated by that second Open.
func TestLayout3MigrationCrash(t *testing.T) { testMigrationCrash(t, layout3Fixture) }

func TestLayout4MigrationCrash(t *testing.T) { testMigrationCrash(t, layout4Fixture) }

func TestLayout5MigrationCrash(t *testing.T) { testMigrationCrash(t, layout5Fixture) }

func testMigrationCrash(t *testing.T, fixture string) {
	f := upgradetest.Load(t, fixture)
	mem := vfs.NewCrashableMem()
	const dir = "db"
	require.NoError(t, mem.MkdirAll(dir, 0o755))
	entries, err := os.ReadDir(filepath.Join(f.Dir, "store"))
	require.NoError(t, err)
	for _, ent := range entries {
		b, err := os.ReadFile(filepath.Join(f.Dir, "store", ent.Name()))
		require.NoError(t, err)
		w, err := mem.Create(mem.PathJoin(dir, ent.Name()), vfs.WriteCategoryUnspecified)
		require.NoError(t, err)
		_, err = w.Write(b)
		require.NoError(t, err)
		require.NoError(t, w.Sync())
		require.NoError(t, w.Close())
	}
	for _, name := range []string{dir, ""} { // the store's directory and its entry
		d, err := mem.OpenDir(name)
		require.NoError(t, err)
		require.NoError(t, d.Sync())
		require.NoError(t, d.Close())
	}

	cp := &crashPoints{mem: mem, rng: rand.New(rand.NewPCG(1, 2))}
	clock := fakeclock.New(f.End.Add(time.Second))
	opts := fixtureOptions(f, clock, &migrationLog{})
	opts.FS = &crashFS{FS: mem, cp: cp}
	cp.setArmed(true)
	e, err := Open(dir, opts)
	require.NoError(t, err)
	require.NoError(t, e.Close())
	cp.gate() // a crash after the clean Close
	cp.setArmed(false)
	require.NotEmpty(t, cp.clones)

	migratedAgain, unopenable := 0, 0
	for _, cl := range cp.clones {
		log := &migrationLog{}
		o := fixtureOptions(f, clock, log)
		o.FS = cl.fs
		e, err := Open(dir, o)
		if err != nil && cl.pct > 0 && cl.pct < 100 && strings.Contains(err.Error(), "could not open manifest file") {
			unopenable++ // errManifestEntryLost: Pebble's manifest rotation, not the migration
			continue
		}
		require.NoError(t, err, "crash before fs operation %d (%d%% unsynced kept)", cl.op, cl.pct)
		migratedAgain += log.count()
		requireFixtureStore(t, f, e)
		require.Len(t, e.secret, record.SecretLen)
		require.NoError(t, e.Close())
	}
	t.Logf("%d crash clones: %d migrated by the Open after the crash, %d unopenable (manifest entry lost)",
		len(cp.clones), migratedAgain, unopenable)
	require.Positive(t, migratedAgain, "no clone crashed before the migration was durable")
	require.Less(t, migratedAgain, len(cp.clones)-unopenable, "no clone crashed after the migration was durable")
}
