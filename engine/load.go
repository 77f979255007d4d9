package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"iter"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/objstorage/objstorageprovider"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine/internal/record"
	"github.com/idemkv/idemkv/ttl"
)

// ErrExists is returned by Load for a record whose ID is already live in
// the store, or given twice.
var ErrExists = errors.New("idemkv: record already stored")

// loadRunBytes is the size of a run: the records Load sorts in memory and
// writes as one sstable. Load holds two runs at a time (one being filled,
// one being written), whatever the number of records.
var loadRunBytes = 64 << 20 // tests lower it

// loadFilePrefix names the sstables Load writes in the store's directory
// before Pebble ingests them; one left by a Load that crashed is removed
// by the next Load.
const loadFilePrefix = "idemkv-load-"

// LoadOptions are the options of Load. The zero value is valid.
type LoadOptions struct {
	// Records is how many records the caller expects to load. Load sizes
	// the claim filter for the store with them (and the records already
	// stored) and saves it, so that the next Open starts with it instead
	// of scanning every record key. With 0, or too few, the filter is
	// sized too small and rebuilt, by a scan, after the next Open.
	Records int64
	// Progress, if set, is called after each run is ingested with the
	// records stored so far.
	Progress func(stored int)
}

// Load writes recs into the store in dir, creating it if needed, exactly
// as the engine writes records: an unsettled record under its record key,
// a completed one in the expiry bucket of its class. It is the one way to
// seed a store in bulk (benchmarks, tests, imports); the store it leaves
// passes Check, and Open reads it like any other. No process may hold the
// store: Load opens it itself (Pebble's lock refuses a second opener).
//
// Each record is stored as given, except that it gets a fresh fencing
// token, later than every token the store has handed out, and defaults for
// the zero fields a claim would have set: Attempt 1, Created now, a lease
// from now for an in-progress record, the operation id a claim would
// derive for a remote one (generation 0), and Expires at the end of its
// class's window from now. The ID, fingerprint, state, class and result
// must be ones the engine accepts; a record in progress must be remote (a
// local claim is never stored), and none may claim effects
// (Record.Effects): Load writes no business data.
//
// An ID already live in the store, or given twice, fails with ErrExists.
//
// Load sorts the records in runs of about 64 MiB, writes each run as an
// sstable and has Pebble ingest it, so its memory does not grow with the
// number of records, and no record passes through the write-ahead log or
// a memtable. Records given in the order the store keeps them (completed
// records by expiry bucket, then by key; see SortKey) make runs that do
// not overlap, which Pebble places straight in the last level: nothing is
// rewritten by compactions afterwards. Records in any other order are
// stored all the same, and compacted later. Each record's ID is checked
// against the claim filter as it goes, and only those the filter does not
// rule out are looked up in the store. If Load fails, the runs ingested
// before the failure stay, and the store is still sound. It returns how
// many records it stored.
func Load(ctx context.Context, dir string, opts *Options, recs iter.Seq[idemkv.Record], lo *LoadOptions) (int, error) {
	if lo == nil {
		lo = &LoadOptions{}
	}
	o := *opts.EnsureDefaults()
	o.NoBackgroundSweep, o.ReplayCacheSize, o.ReadOnly = true, -1, false
	if o.ClaimFilterBitsPerKey > 0 && lo.Records > 0 {
		o.claimFilterMinKeys = max(o.claimFilterMinKeys, 2*lo.Records)
	}
	if err := removeLoadFiles(o.FS, dir); err != nil {
		return 0, fmt.Errorf("engine: load: %w", err)
	}
	e, err := Open(dir, &o)
	if err != nil {
		return 0, err
	}
	l := loader{e: e, now: e.clock.Now(), progress: lo.Progress}
	n, err := l.load(ctx, recs)
	if err == nil {
		err = e.Flush()
	}
	if cerr := e.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return n, fmt.Errorf("engine: load: %w", err)
	}
	return n, nil
}

// SortKey returns the key by which a store opened with opts orders rec
// once Load has filled in its defaults: records given to Load in
// increasing SortKey (bytes.Compare) make runs that do not overlap. A
// completed record's Expires must be set, since it picks its bucket.
func SortKey(opts *Options, rec *idemkv.Record) []byte {
	k := appendRecordKey(nil, rec.ID)
	if rec.State != idemkv.StateCompleted {
		return k
	}
	class := rec.Class
	if class == ttl.DefaultClass {
		class = ""
	}
	end := record.BucketEnd(record.Seconds(rec.Expires), opts.EnsureDefaults().window(class)/bucketsPerWindow)
	return record.AppendExpiryKey(nil, record.AppendBucket(nil, class, end), k)
}

// removeLoadFiles removes the sstables a crashed Load left behind.
func removeLoadFiles(fs vfs.FS, dir string) error {
	names, err := fs.List(dir)
	if err != nil {
		return nil // no directory yet: Open creates it
	}
	for _, name := range names {
		if strings.HasPrefix(name, loadFilePrefix) {
			if err := fs.Remove(filepath.Join(dir, name)); err != nil {
				return err
			}
		}
	}
	return nil
}

// loader is the state of one Load: the engine it opened for itself (no
// other caller sees it, so no slot guards its writes), the run being
// filled, and the one being written.
type loader struct {
	e        *Engine
	now      time.Time
	progress func(int)

	run *loadRun
	// prev is the run being written and ingested, nil if none; its records
	// are not in the store yet, so duplicates are looked for in its keys.
	prev    *loadRun
	written chan error // the result of writing prev
	// it reads the store as of the last ingestion.
	it     *pebble.Iterator
	n      int
	stored int
	tables int
}

// loadRun is a run of records: the keys and values putRecord writes for
// them, and their record keys.
type loadRun struct {
	kvs     []loadKV
	arena   []byte
	bytes   int
	records int
	// ids indexes the run's records by the xxhash of their record key:
	// the kv that holds the record, which ends with the key; a record
	// whose hash another already has is in more.
	ids  map[uint64]int32
	more map[string]struct{}
}

type loadKV struct{ k, v []byte }

func newLoadRun() *loadRun {
	return &loadRun{arena: make([]byte, 0, loadRunBytes+loadRunBytes/8), ids: make(map[uint64]int32),
		more: make(map[string]struct{})}
}

// addID notes that the run's last kv holds the record of record key k,
// whose hash is h.
func (r *loadRun) addID(k []byte, h uint64) {
	if _, ok := r.ids[h]; ok {
		r.more[string(k)] = struct{}{}
		return
	}
	r.ids[h] = int32(len(r.kvs) - 1)
}

// has reports whether the run holds record key k, whose hash is h.
func (r *loadRun) has(k []byte, h uint64) bool {
	if i, ok := r.ids[h]; ok && bytes.HasSuffix(r.kvs[i].k, k[1:]) {
		return true
	}
	_, ok := r.more[string(k)]
	return ok
}

// Set implements batchWriter.
func (r *loadRun) Set(k, v []byte, _ *pebble.WriteOptions) error {
	if len(r.arena)+len(k)+len(v) > cap(r.arena) {
		r.arena = make([]byte, 0, max(cap(r.arena), len(k)+len(v))) // the old one stays referenced by kvs
	}
	off := len(r.arena)
	r.arena = append(append(r.arena, k...), v...)
	r.kvs = append(r.kvs, loadKV{k: r.arena[off : off+len(k) : off+len(k)], v: r.arena[off+len(k) : len(r.arena) : len(r.arena)]})
	r.bytes += len(k) + len(v)
	return nil
}

// Delete implements batchWriter. putRecord deletes only what a record
// replaces, and Load's records replace nothing.
func (r *loadRun) Delete([]byte, *pebble.WriteOptions) error {
	panic("engine: load: a new record deletes nothing")
}

func (l *loader) load(ctx context.Context, recs iter.Seq[idemkv.Record]) (int, error) {
	defer func() {
		if l.prev != nil {
			<-l.written
		}
		if l.it != nil {
			_ = l.it.Close()
		}
	}()
	<-l.e.ClaimFilterBuilt()
	// The filter now holds every key stored: keep it from being rebuilt
	// while runs not yet ingested are in it but not in the store.
	l.e.filter.stop()
	<-l.e.filter.done
	if err := l.refresh(); err != nil {
		return 0, err
	}
	l.run = newLoadRun()
	for rec := range recs {
		if err := l.add(&rec); err != nil {
			return l.n, err
		}
		if l.run.bytes >= loadRunBytes {
			if err := l.flushRun(ctx); err != nil {
				return l.n, err
			}
		}
	}
	if l.run.records > 0 {
		if err := l.flushRun(ctx); err != nil {
			return l.n, err
		}
	}
	if err := l.wait(); err != nil {
		return l.n, err
	}
	return l.n, nil
}

// add puts rec, completed with its defaults, into the run.
func (l *loader) add(rec *idemkv.Record) error {
	e := l.e
	if err := l.fill(rec); err != nil {
		return err
	}
	k := appendRecordKey(nil, rec.ID)
	h := xxhash.Sum64(k)
	// The filter holds every key stored and every key of the runs, so a
	// key it has not seen is new; it is added in the same step.
	st := e.table.stripe(k)
	st.mu.Lock()
	maybe := st.mu.filter == nil || st.mu.filter.TestAndAdd(k)
	st.mu.Unlock()
	if maybe {
		if err := l.checkNew(k, h, rec.ID); err != nil {
			return err
		}
	}
	e.putRecord(l.run, k, nil, rec)
	l.run.addID(k, h)
	e.filter.adds.Add(1)
	l.run.records++
	l.n++
	return nil
}

// checkNew fails with ErrExists if record key k, whose hash is h, is in a
// run or live in the store.
func (l *loader) checkNew(k []byte, h uint64, id idemkv.ID) error {
	if l.run.has(k, h) || l.prev != nil && l.prev.has(k, h) {
		return fmt.Errorf("%w: %s/%s/%q given twice", ErrExists, id.Tenant, id.Endpoint, id.Key)
	}
	if _, found, err := l.e.readWith(l.it, k, l.now); err != nil {
		return err
	} else if found {
		return fmt.Errorf("%w: %s/%s/%q", ErrExists, id.Tenant, id.Endpoint, id.Key)
	}
	return nil
}

// fill checks rec and sets its token and the defaults of its zero fields.
func (l *loader) fill(rec *idemkv.Record) error {
	e := l.e
	req := idemkv.ClaimRequest{ID: rec.ID, Fingerprint: rec.Fingerprint, Mode: rec.Mode, Retention: rec.Class}
	if err := req.Validate(); err != nil {
		return err
	}
	class, err := e.claimClass(rec.Class)
	if err != nil {
		return err
	}
	switch {
	case rec.State < idemkv.StateInProgress || rec.State > idemkv.StateCompleted:
		return fmt.Errorf("%w: record state %d", idemkv.ErrInvalidArgument, rec.State)
	case rec.State == idemkv.StateInProgress && rec.Mode != idemkv.ModeRemote:
		return fmt.Errorf("%w: a local claim in progress is never stored", idemkv.ErrInvalidArgument)
	case rec.Effects != 0:
		return fmt.Errorf("%w: Load writes no effects, and the record counts %d", idemkv.ErrInvalidArgument, rec.Effects)
	case len(rec.Note) > idemkv.MaxNoteLen:
		return fmt.Errorf("%w: note is %d bytes, limit %d", idemkv.ErrInvalidArgument, len(rec.Note), idemkv.MaxNoteLen)
	}
	if err := e.validateResult(&rec.Result); err != nil {
		return err
	}
	rec.Class = class
	if rec.Token, err = e.nextToken(); err != nil {
		return err
	}
	if rec.Attempt == 0 {
		rec.Attempt = 1
	}
	if rec.Created.IsZero() {
		rec.Created = l.now.Truncate(time.Second)
	}
	// A remote record given no operation id has the derived one, which
	// the codec leaves out.
	if rec.State == idemkv.StateInProgress && rec.LeaseExpires.IsZero() {
		rec.LeaseExpires = l.now.Add(e.opts.Lease)
	}
	if rec.State != idemkv.StateInProgress {
		rec.LeaseExpires = time.Time{}
	}
	if rec.Expires.IsZero() {
		rec.Expires = e.expiresAt(l.now, class)
	}
	rec.Expires = record.Seconds(rec.Expires)
	if rec.Created.After(rec.Expires) || rec.Created.Unix() < 0 {
		// The codec keeps creation as seconds before expiry: a record
		// created after it expires would be read back with another
		// creation, and its pending-index entry with it.
		return fmt.Errorf("%w: created %v, after its expiry %v or before 1970", idemkv.ErrInvalidArgument, rec.Created, rec.Expires)
	}
	rec.Created = rec.Created.Truncate(time.Second)
	return nil
}

// flushRun waits for the run before to be ingested, then hands the
// current one to a goroutine that writes and ingests it, and starts the
// next: filling one run overlaps writing the other.
func (l *loader) flushRun(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := l.wait(); err != nil {
		return err
	}
	r := l.run
	l.prev, l.written = r, make(chan error, 1)
	run := l.tables
	name := filepath.Join(l.e.dir, fmt.Sprintf("%s%06d", loadFilePrefix, run))
	l.tables++
	go func() { l.written <- l.e.ingestRun(ctx, name, run, r) }()
	l.run = newLoadRun()
	return nil
}

// wait waits for the run being written, if any, and makes what it
// stored visible to lookups.
func (l *loader) wait() error {
	if l.prev == nil {
		return nil
	}
	err := <-l.written
	l.stored += l.prev.records
	l.prev = nil
	if err != nil {
		return err
	}
	if l.progress != nil {
		l.progress(l.stored)
	}
	return l.refresh()
}

// refresh opens a new iterator, which sees every run ingested.
func (l *loader) refresh() error {
	if l.it != nil {
		if err := l.it.Close(); err != nil {
			return err
		}
	}
	var err error
	l.it, err = l.e.db.NewIter(&pebble.IterOptions{UseL6Filters: true})
	return err
}

// testHookIngested, if set, is called after each run is ingested, with
// the run's number; an error fails the Load there.
var testHookIngested func(run int) error

// ingestRun sorts r, writes it as sstables, one for each namespace it
// writes (the few pending-index and unsettled records apart from the
// completed ones, whose tables then never overlap another run's), and has
// Pebble ingest them. The files are removed whatever happens (Pebble links
// or copies them).
func (e *Engine) ingestRun(ctx context.Context, name string, run int, r *loadRun) error {
	kvs := r.kvs
	if !slices.IsSortedFunc(kvs, cmpLoadKV) {
		// A copy: the loader still finds the run's records by index.
		kvs = slices.Clone(kvs)
		slices.SortFunc(kvs, cmpLoadKV)
	}
	var names []string
	defer func() {
		for _, n := range names {
			_ = e.opts.FS.Remove(n)
		}
	}()
	for len(kvs) > 0 {
		ns := kvs[0].k[0]
		end := 1
		for end < len(kvs) && kvs[end].k[0] == ns {
			end++
		}
		names = append(names, fmt.Sprintf("%s-%d.sst", name, len(names)))
		if err := e.writeTable(names[len(names)-1], kvs[:end]); err != nil {
			return err
		}
		kvs = kvs[end:]
	}
	if err := e.db.Ingest(ctx, names); err != nil {
		return fmt.Errorf("ingest run: %w", err)
	}
	if testHookIngested != nil {
		return testHookIngested(run)
	}
	return nil
}

// writeTable writes kvs, in order, as the sstable name, in the format
// the store's last level is written in.
func (e *Engine) writeTable(name string, kvs []loadKV) error {
	f, err := e.opts.FS.Create(name, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	wo := e.popts.MakeWriterOptions(len(e.popts.Levels)-1, e.db.FormatMajorVersion().MaxTableFormat())
	w := sstable.NewWriter(objstorageprovider.NewFileWritable(f), wo)
	for _, kv := range kvs {
		if err := w.Set(kv.k, kv.v); err != nil {
			_ = w.Close()
			return err
		}
	}
	return w.Close()
}

func cmpLoadKV(a, b loadKV) int { return bytes.Compare(a.k, b.k) }
