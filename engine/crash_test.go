package engine

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/stretchr/testify/require"
)

// ---------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------

// crashFP, crashBody and crashEffectKey derive everything a crash test writes
// from the key alone, so that a check after a crash knows what must be there.
func crashFP(key string) []byte          { return []byte("fp-" + key) }
func crashBody(key string) []byte        { return []byte("body-" + key) }
func crashEffectKey(key string) []byte   { return []byte("effect/" + key) }
func crashEffectValue(tok uint64) []byte { return []byte(strconv.FormatUint(tok, 10)) }

// crashResult is the deterministic result stored for key.
func crashResult(key string) idemkv.Result {
	return idemkv.Result{Status: 201, Pointer: "/p/" + key, Body: crashBody(key)}
}

// ---------------------------------------------------------------------------
// Test 1: SIGKILL a real child process that writes with real fsyncs.
// ---------------------------------------------------------------------------

const (
	crashChildEnv     = "IDEMKV_CRASH_CHILD"      // set in the child: the store directory
	crashChildSeedEnv = "IDEMKV_CRASH_CHILD_SEED" // set in the child: its RNG seed
	crashSeedEnv      = "IDEMKV_CRASH_SEED"       // optional in the parent: replay a seed
	crashCyclesEnv    = "IDEMKV_CRASH_CYCLES"     // optional in the parent: more kills, for a soak
	crashKeysEnv      = "IDEMKV_CRASH_CHILD_KEYS" // set in the child: the size of the key space

	kill9KeysPerCycle = 200 // key space "k0".."k{n-1}", n = this × cycles, at least kill9MinKeys
	kill9MinKeys      = 1000
	kill9Hot          = 16 // keys drawn often, so that concurrent duplicates happen
	kill9Workers      = 4
	kill9Cycles       = 5 // default; see crashCyclesEnv
	// The remote lease is short so that a remote claim left behind by one
	// child run has expired by the next one: it is then either resumed
	// (Resumable keys) or turned uncertain and resolved.
	kill9RemoteLease = 200 * time.Millisecond
)

// kill9Options are the engine options of both the child and the parent's
// checks. The memtable is tiny so that flushes (and with them sstables,
// manifest edits and WAL rotation) happen during the child runs, not only
// WAL appends.
func kill9Options() *Options {
	return &Options{CacheSize: 4 << 20, MemTableSize: 64 << 10}
}

func kill9Key(i int) string { return "k" + strconv.Itoa(i) }

func TestCrashKill9(t *testing.T) {
	if dir := os.Getenv(crashChildEnv); dir != "" {
		runKill9Child(dir) // never returns
		return
	}
	seed := time.Now().UnixNano()
	if s := os.Getenv(crashSeedEnv); s != "" {
		var err error
		seed, err = strconv.ParseInt(s, 10, 64)
		require.NoError(t, err, "bad %s", crashSeedEnv)
	}
	t.Logf("seed %d (rerun with %s=%d)", seed, crashSeedEnv, seed)
	cycles := kill9Cycles
	if s := os.Getenv(crashCyclesEnv); s != "" {
		var err error
		cycles, err = strconv.Atoi(s)
		require.NoError(t, err, "bad %s", crashCyclesEnv)
	}
	rng := rand.New(rand.NewPCG(uint64(seed), 0x6b696c6c39))
	dir := t.TempDir()
	// The key space grows with the cycles, so that a long run keeps
	// writing new keys instead of replaying a space it has filled.
	keys := max(kill9MinKeys, kill9KeysPerCycle*cycles)

	acked := make(map[string]uint64) // key -> token of its one acknowledged completion
	start := time.Now()
	for cycle := range cycles {
		target := 20 + rng.IntN(181)
		res := runKill9Cycle(t, dir, seed+int64(cycle)*7919, target, keys)
		for _, a := range res.acks {
			if prev, ok := acked[a.key]; ok {
				t.Fatalf("cycle %d: key %q acknowledged twice, with tokens %d and %d: two owners", cycle, a.key, prev, a.token)
			}
			acked[a.key] = a.token
		}
		cen := verifyKill9Dir(t, dir, acked, keys)
		ents, err := os.ReadDir(dir)
		require.NoError(t, err)
		ssts := 0
		for _, de := range ents {
			if strings.HasSuffix(de.Name(), ".sst") {
				ssts++
			}
		}
		t.Logf("cycle %d: killed after %d ACK lines (target %d), %d replays seen; store: %+v, %d sstables; %d acknowledged in all",
			cycle, len(res.acks), target, res.replays, cen, ssts, len(acked))
	}
	t.Logf("%d cycles in %v", cycles, time.Since(start).Round(time.Millisecond))
}

type kill9Ack struct {
	key   string
	token uint64
}

type kill9Result struct {
	acks    []kill9Ack
	replays int
}

// runKill9Cycle starts a child writer on dir, kills it with SIGKILL once it
// has printed target ACK lines, and returns every acknowledgement it printed
// (including those printed between the decision to kill and its death).
func runKill9Cycle(t *testing.T, dir string, seed int64, target, keys int) kill9Result {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashKill9$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+dir, crashChildSeedEnv+"="+strconv.FormatInt(seed, 10),
		crashKeysEnv+"="+strconv.Itoa(keys))
	// The child exits when its stdin reaches EOF, that is when this process
	// is gone, so that no writer outlives a parent that died.
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())

	var waitOnce sync.Once
	var waitErr error
	wait := func() error {
		waitOnce.Do(func() { waitErr = cmd.Wait() })
		return waitErr
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = wait()
		_ = stdin.Close()
	})
	// A guard against a child that hangs (for example an engine deadlock):
	// it is not used for synchronisation, only to turn a hang into a failure.
	var hung atomic.Bool
	guard := time.AfterFunc(time.Minute, func() {
		hung.Store(true)
		_ = cmd.Process.Kill()
	})
	defer guard.Stop()

	var res kill9Result
	var other []string
	killed := false
	lines := 0
	r := bufio.NewReader(stdout)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			// EOF: the child is dead. A final line without its newline was
			// cut by the kill and is ignored.
			break
		}
		lines++
		f := strings.Fields(line)
		switch {
		case len(f) == 3 && f[0] == "ACK":
			tok, perr := strconv.ParseUint(f[2], 10, 64)
			require.NoError(t, perr, "bad ACK line %q", line)
			res.acks = append(res.acks, kill9Ack{key: f[1], token: tok})
		case len(f) == 2 && f[0] == "REPLAY":
			res.replays++
		default:
			other = append(other, strings.TrimSpace(line))
		}
		// Kill at a point decided by the lines read, never by time. The
		// second condition only guards against a key space that no longer
		// yields new completions.
		if !killed && (len(res.acks) >= target || lines >= 50*target) {
			if err := cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
				t.Fatalf("kill child: %v", err)
			}
			killed = true
		}
	}
	werr := wait()
	if hung.Load() {
		t.Fatalf("child made no progress for a minute (%d lines read); stderr:\n%s", lines, stderr.String())
	}
	if !killed {
		t.Fatalf("child exited by itself (%v) after %d lines; other output %q; stderr:\n%s", werr, lines, other, stderr.String())
	}
	if runtime.GOOS != "windows" && cmd.ProcessState.Exited() {
		t.Fatalf("child exited with %v before the kill landed; other output %q; stderr:\n%s", werr, other, stderr.String())
	}
	if strings.Contains(stderr.String(), "crash child:") {
		t.Fatalf("child reported a failure; stderr:\n%s", stderr.String())
	}
	if len(other) > 0 || stderr.Len() > 0 {
		t.Logf("child also wrote: stdout %q; stderr:\n%s", other, stderr.String())
	}
	return res
}

// verifyKill9Dir opens the store left by a killed child and checks every
// key of the key space.
func verifyKill9Dir(t *testing.T, dir string, acked map[string]uint64, keys int) Census {
	t.Helper()
	e, err := Open(dir, kill9Options())
	require.NoError(t, err, "reopen after SIGKILL")
	defer func() { require.NoError(t, e.Close()) }()

	for i := range keys {
		key := kill9Key(i)
		rec, err := e.Get(ctx, id(key))
		found := err == nil
		if !found {
			require.ErrorIs(t, err, idemkv.ErrNotFound, "Get %q", key)
		}
		completed := found && rec.State == idemkv.StateCompleted
		eff, err := e.GetData(ctx, crashEffectKey(key))
		hasEff := err == nil
		if !hasEff {
			require.ErrorIs(t, err, idemkv.ErrNotFound, "GetData %q", key)
		}

		if tok, ok := acked[key]; ok {
			require.True(t, completed, "acknowledged completion of %q (token %d) is lost: record %+v (found %v)", key, tok, rec, found)
			require.Equal(t, tok, rec.Token, "%q: record token is not the acknowledged one", key)
		}
		if completed {
			require.Equal(t, 201, rec.Result.Status, "%q", key)
			require.Equal(t, crashBody(key), rec.Result.Body, "%q: body not byte-identical", key)
			require.Equal(t, crashFP(key), rec.Fingerprint, "%q", key)
			require.True(t, hasEff, "%q: outcome (token %d) without its effect", key, rec.Token)
			require.Equal(t, string(crashEffectValue(rec.Token)), string(eff),
				"%q: the effect was written by another owner than the outcome", key)
		} else {
			require.False(t, hasEff, "%q: effect %q without an outcome (record found %v: %+v)", key, eff, found, rec)
		}
	}
	// Every completion incremented the shared counter and emitted one
	// event, in its commit: no update lost, no event without its commit.
	effects := 0
	require.NoError(t, e.ScanData(ctx, []byte("effect/"), func(_, _ []byte) bool { effects++; return true }))
	counter := 0
	if v, err := e.GetData(ctx, kill9CounterKey); err == nil {
		counter, err = strconv.Atoi(string(v))
		require.NoError(t, err)
	} else {
		require.ErrorIs(t, err, idemkv.ErrNotFound)
	}
	require.Equal(t, effects, counter, "the shared counter lost or gained an update")
	evs, err := e.ReadOutbox(ctx, 0, 1<<30)
	require.NoError(t, err)
	require.Len(t, evs, counter, "one event per committed completion")

	chk, err := e.Check(ctx)
	require.NoError(t, err)
	require.Zero(t, chk.ProblemCount, "check after SIGKILL: %v", chk.Problems)
	cen, err := e.Census(ctx)
	require.NoError(t, err)
	return cen
}

// runKill9Child is the child's side of TestCrashKill9: writers that run
// until the parent kills the process. Any violation it sees exits the
// process with a message starting "crash child:" on stderr.
func runKill9Child(dir string) {
	die := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "crash child: "+format+"\n", args...)
		os.Exit(3)
	}
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		die("stdin closed: the parent is gone")
	}()
	time.AfterFunc(2*time.Minute, func() { die("still running after two minutes") })

	seed, err := strconv.ParseInt(os.Getenv(crashChildSeedEnv), 10, 64)
	if err != nil {
		die("seed: %v", err)
	}
	keys, err := strconv.Atoi(os.Getenv(crashKeysEnv))
	if err != nil || keys <= kill9Hot {
		die("key space %q: %v", os.Getenv(crashKeysEnv), err)
	}
	e, err := Open(dir, kill9Options())
	if err != nil {
		die("open: %v", err)
	}
	hot := rand.New(rand.NewPCG(uint64(seed), 1)).IntN(keys - kill9Hot)
	var wg sync.WaitGroup
	for w := range kill9Workers {
		rng := rand.New(rand.NewPCG(uint64(seed), uint64(w)+2))
		wg.Go(func() {
			for {
				var i int
				if rng.IntN(3) == 0 {
					i = hot + rng.IntN(kill9Hot)
				} else {
					i = rng.IntN(keys)
				}
				if err := kill9ChildOp(e, rng, i); err != nil {
					die("%v", err)
				}
			}
		})
	}
	wg.Wait()
}

// kill9ChildOp runs one request for key i. Every 5th key is remote; every
// 10th is remote and resumable.
// kill9Apply is the child's apply function: the key's effect, a
// read-modify-write of one counter every completion shares (the
// commit-time check of reads, across crashes), and an event.
func kill9Apply(key string, tok uint64) func(idemkv.Effects) error {
	return func(w idemkv.Effects) error {
		var n uint64
		v, err := w.Get(kill9CounterKey)
		switch {
		case err == nil:
			n, err = strconv.ParseUint(string(v), 10, 64)
		case errors.Is(err, idemkv.ErrNotFound):
			err = nil
		}
		if err != nil {
			return err
		}
		if err := w.Set(kill9CounterKey, []byte(strconv.FormatUint(n+1, 10))); err != nil {
			return err
		}
		if err := w.Emit(idemkv.Event{Topic: "crash.completed", Key: key, Payload: crashEffectValue(tok)}); err != nil {
			return err
		}
		return w.Set(crashEffectKey(key), crashEffectValue(tok))
	}
}

var kill9CounterKey = []byte("counter")

func kill9ChildOp(e *Engine, rng *rand.Rand, i int) error {
	key := kill9Key(i)
	req := idemkv.ClaimRequest{ID: id(key), Fingerprint: crashFP(key), Mode: idemkv.ModeLocal}
	if i%5 == 0 {
		req.Mode = idemkv.ModeRemote
		req.Lease = kill9RemoteLease
		req.Resumable = i%10 == 0
	}
	c, err := e.Claim(ctx, req)
	if err != nil {
		return fmt.Errorf("claim %q: %w", key, err)
	}
	switch c.Outcome {
	case idemkv.Acquired:
		switch n := rng.IntN(32); {
		case n < 2: // the operation provably did nothing
			if err := e.Release(ctx, c.Lease, nil); err != nil && !errors.Is(err, idemkv.ErrFenced) {
				return fmt.Errorf("release %q: %w", key, err)
			}
			return nil
		case n < 3: // the outcome is unknown
			if err := e.MarkUncertain(ctx, c.Lease, "child gave up"); err != nil && !errors.Is(err, idemkv.ErrFenced) {
				return fmt.Errorf("mark uncertain %q: %w", key, err)
			}
			return nil
		}
		tok := c.Lease.Token
		err := e.Complete(ctx, c.Lease, crashResult(key), kill9Apply(key, tok))
		if errors.Is(err, idemkv.ErrFenced) {
			return nil // the remote lease ran out and another claim took it over or made it uncertain
		}
		if err != nil {
			return fmt.Errorf("complete %q: %w", key, err)
		}
		_, err = fmt.Fprintf(os.Stdout, "ACK %s %d\n", key, tok)
		return err
	case idemkv.Replay:
		if got, want := c.Record.Result, crashResult(key); got.Status != want.Status ||
			got.Pointer != want.Pointer || !bytes.Equal(got.Body, want.Body) {
			return fmt.Errorf("replay of %q: got %d %q %q, want %d %q %q", key,
				got.Status, got.Pointer, got.Body, want.Status, want.Pointer, want.Body)
		}
		_, err = fmt.Fprintf(os.Stdout, "REPLAY %s\n", key)
		return err
	case idemkv.InProgress:
		return nil
	case idemkv.Reconciling:
		// A reconciler settles it either way: as no effect (the record goes
		// and a retry runs anew), or as done, with the effect committed
		// atomically with the resolution, which is then acknowledged like a
		// completion. Racing resolvers may lose.
		tok := c.Record.Token
		req := idemkv.ResolveRequest{ID: id(key), Token: tok, NoEffect: true}
		if rng.IntN(2) == 0 {
			req = idemkv.ResolveRequest{ID: id(key), Token: tok, Result: crashResult(key),
				Apply: kill9Apply(key, tok)}
		}
		err := e.Resolve(ctx, req)
		if errors.Is(err, idemkv.ErrFenced) || errors.Is(err, idemkv.ErrNotFound) || errors.Is(err, idemkv.ErrWrongState) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("resolve %q: %w", key, err)
		}
		if !req.NoEffect {
			_, err = fmt.Fprintf(os.Stdout, "ACK %s %d\n", key, tok)
		}
		return err
	default:
		return fmt.Errorf("claim %q: unexpected outcome %v (record %+v)", key, c.Outcome, c.Record)
	}
}

// ---------------------------------------------------------------------------
// Test 2: a crash between any two filesystem operations (vfs.CrashableMem).
// ---------------------------------------------------------------------------

// crashPercents are the UnsyncedDataPercent values of the clones taken at
// every crash point: only synced data, half the unsynced data, all of it.
var crashPercents = []int{0, 50, 100}

// crashPoints counts the mutating filesystem operations and, while armed,
// takes crash clones of the filesystem before each one.
type crashPoints struct {
	mem *vfs.MemFS

	mu     sync.Mutex
	ops    int64 // mutating operations that have passed the gate
	armed  bool
	rng    *rand.Rand
	clones []crashClone
}

// crashClone is the filesystem as a crash just before operation op (1-based)
// could have left it: it holds none of the effects of operations >= op.
type crashClone struct {
	op  int64
	pct int
	fs  *vfs.MemFS
}

// gate is called before every mutating operation is delegated. The clone is
// taken with mu held, so no later operation can pass the gate (and so reach
// the filesystem) before the clone is done. CrashClone waits for writes
// already inside the MemFS; none of them needs mu.
func (c *crashPoints) gate() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ops++
	if !c.armed {
		return
	}
	for _, p := range crashPercents {
		fs := c.mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: p, RNG: c.rng})
		c.clones = append(c.clones, crashClone{op: c.ops, pct: p, fs: fs})
	}
}

func (c *crashPoints) count() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ops
}

func (c *crashPoints) setArmed(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armed = on
}

// crashFS is a vfs.FS that passes every mutating operation through the gate.
type crashFS struct {
	vfs.FS
	cp *crashPoints
}

var _ vfs.FS = (*crashFS)(nil)

func (fs *crashFS) wrap(f vfs.File, err error) (vfs.File, error) {
	if err != nil {
		return nil, err
	}
	return &crashFile{File: f, cp: fs.cp}, nil
}

func (fs *crashFS) Unwrap() vfs.FS { return fs.FS }

func (fs *crashFS) Create(name string, cat vfs.DiskWriteCategory) (vfs.File, error) {
	fs.cp.gate()
	return fs.wrap(fs.FS.Create(name, cat))
}

func (fs *crashFS) Link(oldname, newname string) error {
	fs.cp.gate()
	return fs.FS.Link(oldname, newname)
}

func (fs *crashFS) Open(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	return fs.wrap(fs.FS.Open(name, opts...))
}

func (fs *crashFS) OpenReadWrite(name string, cat vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	fs.cp.gate() // creates the file if it does not exist
	return fs.wrap(fs.FS.OpenReadWrite(name, cat, opts...))
}

func (fs *crashFS) OpenDir(name string) (vfs.File, error) {
	return fs.wrap(fs.FS.OpenDir(name)) // its Sync is gated
}

func (fs *crashFS) Remove(name string) error {
	fs.cp.gate()
	return fs.FS.Remove(name)
}

func (fs *crashFS) RemoveAll(name string) error {
	fs.cp.gate()
	return fs.FS.RemoveAll(name)
}

func (fs *crashFS) Rename(oldname, newname string) error {
	fs.cp.gate()
	return fs.FS.Rename(oldname, newname)
}

func (fs *crashFS) ReuseForWrite(oldname, newname string, cat vfs.DiskWriteCategory) (vfs.File, error) {
	fs.cp.gate()
	return fs.wrap(fs.FS.ReuseForWrite(oldname, newname, cat))
}

func (fs *crashFS) MkdirAll(dir string, perm os.FileMode) error {
	fs.cp.gate()
	return fs.FS.MkdirAll(dir, perm)
}

// crashFile gates the operations of a file that change what a crash leaves.
// SyncTo and Preallocate are no-ops on a MemFS and are not gated.
type crashFile struct {
	vfs.File
	cp *crashPoints
}

func (f *crashFile) Write(p []byte) (int, error) {
	f.cp.gate()
	return f.File.Write(p)
}

func (f *crashFile) WriteAt(p []byte, off int64) (int, error) {
	f.cp.gate()
	return f.File.WriteAt(p, off)
}

func (f *crashFile) Sync() error {
	f.cp.gate()
	return f.File.Sync()
}

func (f *crashFile) SyncData() error {
	f.cp.gate()
	return f.File.SyncData()
}

// durState is what a key's durable record should be after a crash. The
// zero value is an absent record.
type durState struct {
	State  idemkv.State
	Token  uint64
	OpID   idemkv.OperationID
	Result idemkv.Result // StateCompleted only
}

func (s durState) String() string {
	if s.State == 0 {
		return "absent"
	}
	return fmt.Sprintf("%v token=%d op=%v result=%+v", s.State, s.Token, s.OpID, s.Result)
}

// wlStep is one request of the scripted workload, with the operation
// counter read before it was issued and after it returned, and the durable
// state of every key once it returned.
type wlStep struct {
	name       string
	key        string
	start, end int64
	after      map[string]durState

	// What the request acknowledged, for the per-acknowledgement checks.
	completed uint64 // a completion with this token
	remote    uint64 // a durable remote claim with this token
	ended     uint64 // a release or NoEffect resolution of this token
}

// workload drives the engine through a script and keeps a model of the
// durable state of every key, as the acknowledgements define it.
type workload struct {
	t     *testing.T
	e     *Engine
	cp    *crashPoints
	clock *fakeclock.Clock
	opts  *Options
	model map[string]durState
	steps []wlStep
}

// step runs fn as one request on key. fn must update w.model for what the
// request durably changed, if it was acknowledged.
func (w *workload) step(name, key string, fn func()) *wlStep {
	start := w.cp.count()
	fn()
	end := w.cp.count()
	w.steps = append(w.steps, wlStep{name: name, key: key, start: start, end: end, after: maps.Clone(w.model)})
	return &w.steps[len(w.steps)-1]
}

func (w *workload) claim(key string, mode idemkv.Mode, resumable bool, want idemkv.Outcome) idemkv.Claim {
	return w.claimFP(key, crashFP(key), mode, resumable, want)
}

func (w *workload) claimFP(key string, fp []byte, mode idemkv.Mode, resumable bool, want idemkv.Outcome) idemkv.Claim {
	var c idemkv.Claim
	s := w.step(fmt.Sprintf("claim %s %v resumable=%v", key, mode, resumable), key, func() {
		var err error
		c, err = w.e.Claim(ctx, idemkv.ClaimRequest{ID: id(key), Fingerprint: fp, Mode: mode, Resumable: resumable})
		require.NoError(w.t, err, "claim %q", key)
		require.Equal(w.t, want, c.Outcome, "claim %q: record %+v", key, c.Record)
		cur := w.model[key]
		switch {
		case c.Outcome == idemkv.Acquired && mode == idemkv.ModeRemote:
			w.model[key] = durState{State: idemkv.StateInProgress, Token: c.Lease.Token, OpID: c.Lease.OperationID}
		case c.Outcome == idemkv.Reconciling && cur.State == idemkv.StateInProgress:
			// An expired durable remote claim was turned uncertain.
			require.Equal(w.t, cur.Token, c.Record.Token)
			w.model[key] = durState{State: idemkv.StateUncertain, Token: cur.Token, OpID: cur.OpID}
		}
	})
	if c.Outcome == idemkv.Acquired && mode == idemkv.ModeRemote {
		s.remote = c.Lease.Token
	}
	return c
}

func (w *workload) complete(key string, l idemkv.Lease, wantErr error) {
	s := w.step(fmt.Sprintf("complete %s token=%d", key, l.Token), key, func() {
		err := w.e.Complete(ctx, l, crashResult(key), func(fx idemkv.Effects) error {
			return fx.Set(crashEffectKey(key), crashEffectValue(l.Token))
		})
		if wantErr != nil {
			require.ErrorIs(w.t, err, wantErr, "complete %q", key)
			return
		}
		require.NoError(w.t, err, "complete %q", key)
		w.model[key] = durState{State: idemkv.StateCompleted, Token: l.Token, OpID: l.OperationID, Result: crashResult(key)}
	})
	if wantErr == nil {
		s.completed = l.Token
	}
}

func (w *workload) release(key string, l idemkv.Lease) {
	w.step(fmt.Sprintf("release %s token=%d", key, l.Token), key, func() {
		require.NoError(w.t, w.e.Release(ctx, l, nil), "release %q", key)
		if cur := w.model[key]; cur.State == idemkv.StateInProgress && cur.Token == l.Token {
			w.model[key] = durState{}
		}
	}).ended = l.Token
}

func (w *workload) markUncertain(key string, l idemkv.Lease) {
	w.step(fmt.Sprintf("mark-uncertain %s token=%d", key, l.Token), key, func() {
		require.NoError(w.t, w.e.MarkUncertain(ctx, l, "timeout"), "mark uncertain %q", key)
		w.model[key] = durState{State: idemkv.StateUncertain, Token: l.Token, OpID: l.OperationID}
	})
}

func (w *workload) resolveNoEffect(key string) {
	cur := w.model[key]
	require.Equal(w.t, idemkv.StateUncertain, cur.State)
	w.step("resolve-no-effect "+key, key, func() {
		require.NoError(w.t, w.e.Resolve(ctx, idemkv.ResolveRequest{ID: id(key), Token: cur.Token, NoEffect: true}))
		w.model[key] = durState{}
	}).ended = cur.Token
}

// resolveDone settles key's uncertain record as done, committing its effect
// with the resolution.
func (w *workload) resolveDone(key string) {
	cur := w.model[key]
	require.Equal(w.t, idemkv.StateUncertain, cur.State)
	w.step("resolve-done "+key, key, func() {
		require.NoError(w.t, w.e.Resolve(ctx, idemkv.ResolveRequest{ID: id(key), Token: cur.Token, Result: crashResult(key),
			Apply: func(fx idemkv.Effects) error { return fx.Set(crashEffectKey(key), crashEffectValue(cur.Token)) }}))
		w.model[key] = durState{State: idemkv.StateCompleted, Token: cur.Token, OpID: cur.OpID, Result: crashResult(key)}
	}).completed = cur.Token
}

// script is the workload: about 60 requests over 12 keys.
func (w *workload) script() {
	L, R := idemkv.ModeLocal, idemkv.ModeRemote

	// c1: local claim, complete, duplicate replays.
	a := w.claim("c1", L, false, idemkv.Acquired)
	w.claim("c1", L, false, idemkv.InProgress)
	w.complete("c1", a.Lease, nil)
	w.claim("c1", L, false, idemkv.Replay)

	// c2: a durable remote claim, then its completion.
	a = w.claim("c2", R, false, idemkv.Acquired)
	w.claim("c2", R, false, idemkv.InProgress)
	w.complete("c2", a.Lease, nil)

	// c3: a local claim released, claimed again, completed.
	a = w.claim("c3", L, false, idemkv.Acquired)
	w.release("c3", a.Lease)
	a = w.claim("c3", L, false, idemkv.Acquired)
	w.complete("c3", a.Lease, nil)

	// c4: a remote claim released (a durable delete), marked uncertain,
	// resolved as no effect, then run anew locally.
	a = w.claim("c4", R, false, idemkv.Acquired)
	w.release("c4", a.Lease)
	a = w.claim("c4", R, false, idemkv.Acquired)
	w.markUncertain("c4", a.Lease)
	w.claim("c4", R, false, idemkv.Reconciling)
	w.resolveNoEffect("c4")
	a = w.claim("c4", L, false, idemkv.Acquired)
	w.complete("c4", a.Lease, nil)

	// A clean restart: crash points fall inside a reopen (WAL replay, a new
	// manifest, the epoch advance) too, and later tokens are of epoch 2.
	w.step("restart", "", func() {
		require.NoError(w.t, w.e.Close())
		e, err := Open("db", w.opts)
		require.NoError(w.t, err)
		w.e = e
	})

	// c5: a local claim marked uncertain.
	a = w.claim("c5", L, false, idemkv.Acquired)
	w.markUncertain("c5", a.Lease)

	// c6: a remote claim whose holder vanishes; c8: a resumable one.
	w.claim("c6", R, false, idemkv.Acquired)
	r8 := w.claim("c8", R, true, idemkv.Acquired)

	// Move what is there into an sstable, so that crash points fall inside
	// a flush (sstable write, manifest edit, WAL rotation) too.
	w.flush()

	// c7: a local claim taken over after its lease ran out; the stale
	// holder is fenced, its effect never lands.
	stale := w.claim("c7", L, false, idemkv.Acquired)

	// c9: a completion whose apply fails writes nothing, keeps the lease.
	a9 := w.claim("c9", L, false, idemkv.Acquired)
	w.step("complete c9 with failing apply", "c9", func() {
		boom := errors.New("boom")
		err := w.e.Complete(ctx, a9.Lease, crashResult("c9"), func(fx idemkv.Effects) error {
			require.NoError(w.t, fx.Set(crashEffectKey("c9"), crashEffectValue(a9.Lease.Token)))
			return boom
		})
		require.ErrorIs(w.t, err, boom)
	})
	w.complete("c9", a9.Lease, nil)
	w.claimFP("c9", []byte("other"), L, false, idemkv.Mismatch)

	// c10: a remote claim renewed, then completed.
	a10 := w.claim("c10", R, false, idemkv.Acquired)
	w.step("renew c10", "c10", func() {
		l, err := w.e.Renew(ctx, a10.Lease, time.Minute)
		require.NoError(w.t, err)
		a10.Lease = l
	})

	w.step("advance clock 31s", "", func() { w.clock.Advance(31 * time.Second) })

	b := w.claim("c7", L, false, idemkv.Acquired)
	require.True(w.t, b.Lease.Takeover())
	w.complete("c7", stale.Lease, idemkv.ErrFenced)
	w.complete("c7", b.Lease, nil)
	w.claim("c7", L, false, idemkv.Replay)

	w.claim("c6", R, false, idemkv.Reconciling) // expired, not resumable
	w.claim("c6", L, false, idemkv.Reconciling)

	b8 := w.claim("c8", R, true, idemkv.Acquired) // durable takeover
	require.True(w.t, b8.Lease.Takeover())
	require.Equal(w.t, r8.Lease.OperationID, b8.Lease.OperationID)
	w.complete("c8", r8.Lease, idemkv.ErrFenced)
	w.complete("c8", b8.Lease, nil)

	w.claim("c10", R, false, idemkv.InProgress) // the renewal holds
	w.complete("c10", a10.Lease, nil)

	// c11: a remote claim released, then claimed locally and completed.
	a = w.claim("c11", R, false, idemkv.Acquired)
	w.release("c11", a.Lease)
	a = w.claim("c11", L, false, idemkv.Acquired)
	w.complete("c11", a.Lease, nil)

	// c12: claimed locally and left held at the crash: it leaves no trace.
	w.claim("c12", L, false, idemkv.Acquired)

	// c5 (marked uncertain) and c6 (expired remote) are settled as done,
	// with their effects.
	w.resolveDone("c5")
	w.resolveDone("c6")

	w.flush()
	w.step("compact", "", func() {
		require.NoError(w.t, w.e.db.Compact(ctx, []byte{nsMeta}, []byte{nsData + 1}, false))
	})

	for _, k := range []string{"c1", "c2", "c3", "c4", "c5", "c6", "c7", "c8", "c9", "c10", "c11"} {
		w.claim(k, L, false, idemkv.Replay)
	}
}

func (w *workload) flush() {
	w.step("flush", "", func() { require.NoError(w.t, w.e.db.Flush()) })
}

var crashKeys = []string{"c1", "c2", "c3", "c4", "c5", "c6", "c7", "c8", "c9", "c10", "c11", "c12"}

func TestCrashAtEveryWrite(t *testing.T) {
	seed := time.Now().UnixNano()
	if s := os.Getenv(crashSeedEnv); s != "" {
		var err error
		seed, err = strconv.ParseInt(s, 10, 64)
		require.NoError(t, err, "bad %s", crashSeedEnv)
	}
	t.Logf("seed %d (rerun with %s=%d)", seed, crashSeedEnv, seed)

	mem := vfs.NewCrashableMem()
	cp := &crashPoints{mem: mem, rng: rand.New(rand.NewPCG(uint64(seed), 0x63726173))}
	clock := fakeclock.New(t0)
	opts := Options{FS: &crashFS{FS: mem, cp: cp}, Clock: clock, Lease: 30 * time.Second,
		CacheSize: 1 << 20, MemTableSize: 256 << 10}
	const dir = "db"

	// Crash points are taken from the very first operation of the first
	// Open to the last one of Close, and once more after Close.
	start := time.Now()
	cp.setArmed(true)
	e, err := Open(dir, &opts)
	require.NoError(t, err)
	w := &workload{t: t, e: e, cp: cp, clock: clock, opts: &opts, model: make(map[string]durState)}
	openOps := cp.count()
	w.script()
	scriptOps := cp.count() - openOps
	require.NoError(t, w.e.Close())
	cp.gate() // a crash after a clean shutdown
	cp.setArmed(false)
	t.Logf("workload: %d requests, %d mutating fs operations (%d in Open), %d clones in %v",
		len(w.steps), cp.count(), openOps, len(cp.clones), time.Since(start).Round(time.Millisecond))
	require.Positive(t, scriptOps)

	// Check every clone, unless there are too many: then a random sample.
	clones := cp.clones
	const maxClones = 3000
	if len(clones) > maxClones {
		rng := rand.New(rand.NewPCG(uint64(seed), 2))
		rng.Shuffle(len(clones), func(i, j int) { clones[i], clones[j] = clones[j], clones[i] })
		clones = clones[:maxClones]
	}
	start = time.Now()
	unopenable := checkClones(t, w.steps, clones, opts, clock.Now())
	t.Logf("checked %d crash clones (%d crash points x %v%% unsynced data) in %v",
		len(clones), len(cp.clones)/len(crashPercents), crashPercents, time.Since(start).Round(time.Millisecond))
	if unopenable > 0 {
		t.Logf("%d clones kept a new manifest marker but not the new manifest's directory entry, "+
			"and Pebble could not open them (see errManifestEntryLost)", unopenable)
	}
}

// errManifestEntryLost marks a clone that Pebble cannot open because it
// holds a manifest marker whose manifest file is missing. Pebble rotates its
// manifest (at every Open, and when it grows) by creating and syncing
// MANIFEST-n, then creating marker.manifest.*.MANIFEST-n, removing the old
// marker, and only then syncing the directory. A crash before that directory
// sync may persist any subset of the unsynced directory entries; the MemFS
// crash model (0 < UnsyncedDataPercent < 100) can keep the marker's entry
// and drop the manifest's, and Open then fails with "could not open
// manifest file". That is Pebble's protocol, not the engine's (and in
// practice journaled filesystems persist directory entries in order), so it
// is tolerated, and counted, only in that exact form: a partial clone and
// that error.
var errManifestEntryLost = errors.New("manifest marker persisted without its manifest")

// checkClones checks the clones on a few goroutines.
// It returns how many clones were tolerated as errManifestEntryLost.
func checkClones(t *testing.T, steps []wlStep, clones []crashClone, opts Options, now time.Time) int {
	var next, unopenable atomic.Int64
	var failed atomic.Bool
	var wg sync.WaitGroup
	for range max(1, runtime.GOMAXPROCS(0)) {
		wg.Go(func() {
			for !failed.Load() {
				i := int(next.Add(1)) - 1
				if i >= len(clones) {
					return
				}
				err := checkClone(steps, clones[i], opts, now)
				if errors.Is(err, errManifestEntryLost) {
					unopenable.Add(1)
				} else if err != nil {
					failed.Store(true)
					t.Errorf("crash before fs operation %d (%d%% unsynced data kept): %v",
						clones[i].op, clones[i].pct, err)
				}
				clones[i].fs = nil // let the memory go
			}
		})
	}
	wg.Wait()
	return int(unopenable.Load())
}

// checkClone opens the engine on one crash clone and compares every key
// with what the acknowledgements allow.
func checkClone(steps []wlStep, cl crashClone, opts Options, now time.Time) (err error) {
	// Which requests had returned before the crash, and which one (in this
	// sequential script, at most one) was in flight.
	last := -1
	for i, s := range steps {
		if s.end < cl.op {
			last = i
		}
	}
	inflight := -1
	if j := last + 1; j < len(steps) && steps[j].start < cl.op {
		inflight = j
	}
	acked := map[string]durState{}
	if last >= 0 {
		acked = steps[last].after
	}
	where := func() string {
		s := "no request had returned"
		if last >= 0 {
			s = fmt.Sprintf("last returned: #%d %q", last, steps[last].name)
		}
		if inflight >= 0 {
			s += fmt.Sprintf("; in flight: #%d %q", inflight, steps[inflight].name)
		}
		return s
	}

	opts.FS = cl.fs
	opts.Clock = fakeclock.New(now)
	e, err := Open("db", &opts)
	if err != nil && cl.pct > 0 && cl.pct < 100 && strings.Contains(err.Error(), "could not open manifest file") {
		return fmt.Errorf("%w: %w", errManifestEntryLost, err)
	}
	if err != nil {
		return fmt.Errorf("reopen: %w (%s)", err, where())
	}
	defer func() {
		if cerr := e.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("close: %w", cerr)
		}
	}()
	chk, err := e.Check(ctx)
	if err != nil {
		return fmt.Errorf("check: %w (%s)", err, where())
	}
	if chk.ProblemCount > 0 {
		return fmt.Errorf("check: %v (%s)", chk.Problems, where())
	}

	for _, key := range crashKeys {
		got := durState{}
		rec, gerr := e.Get(ctx, id(key))
		switch {
		case gerr == nil:
			got = durState{State: rec.State, Token: rec.Token, OpID: rec.OperationID}
			if rec.State == idemkv.StateCompleted {
				got.Result = rec.Result
			}
		case !errors.Is(gerr, idemkv.ErrNotFound):
			return fmt.Errorf("get %q: %w", key, gerr)
		}

		allowed := []durState{acked[key]}
		if inflight >= 0 && steps[inflight].key == key {
			allowed = append(allowed, steps[inflight].after[key])
		}
		ok := false
		for _, a := range allowed {
			if durEqual(a, got) {
				ok = true
			}
		}
		if !ok {
			return fmt.Errorf("key %q is %v, want one of %v (%s)", key, got, allowed, where())
		}

		// No effect without its outcome, no outcome without its effect, and
		// both of one owner.
		eff, derr := e.GetData(ctx, crashEffectKey(key))
		hasEff := derr == nil
		if !hasEff && !errors.Is(derr, idemkv.ErrNotFound) {
			return fmt.Errorf("get data %q: %w", key, derr)
		}
		switch {
		case got.State == idemkv.StateCompleted && !hasEff:
			return fmt.Errorf("key %q: outcome (token %d) without its effect (%s)", key, got.Token, where())
		case got.State != idemkv.StateCompleted && hasEff:
			return fmt.Errorf("key %q: effect %q without an outcome, record %v (%s)", key, eff, got, where())
		case hasEff && string(eff) != string(crashEffectValue(got.Token)):
			return fmt.Errorf("key %q: effect of token %s, outcome of token %d (%s)", key, eff, got.Token, where())
		}

		// A completion replays byte for byte.
		if got.State == idemkv.StateCompleted {
			c, cerr := e.Claim(ctx, idemkv.ClaimRequest{ID: id(key), Fingerprint: crashFP(key)})
			if cerr != nil {
				return fmt.Errorf("claim %q: %w", key, cerr)
			}
			if c.Outcome != idemkv.Replay || c.Record.Result.Status != 201 ||
				!bytes.Equal(c.Record.Result.Body, crashBody(key)) {
				return fmt.Errorf("claim %q after crash: %v %+v, want a replay of %q", key, c.Outcome, c.Record.Result, crashBody(key))
			}
		}
	}

	// The same promises, stated per acknowledgement rather than per key
	// (the model above already implies them).
	// A release or resolution in flight may or may not have landed.
	ended := map[uint64]bool{}
	for _, s := range steps[:max(last+1, inflight+1)] {
		if s.ended != 0 {
			ended[s.ended] = true
		}
	}
	for _, s := range steps[:last+1] {
		if s.completed == 0 && s.ended == 0 && s.remote == 0 {
			continue
		}
		rec, gerr := e.Get(ctx, id(s.key))
		if gerr != nil && !errors.Is(gerr, idemkv.ErrNotFound) {
			return fmt.Errorf("get %q: %w", s.key, gerr)
		}
		found := gerr == nil
		switch {
		case s.completed != 0:
			if !found || rec.State != idemkv.StateCompleted || rec.Token != s.completed ||
				!bytes.Equal(rec.Result.Body, crashBody(s.key)) {
				return fmt.Errorf("acknowledged %q is lost: record %+v (found %v) (%s)", s.name, rec, found, where())
			}
		case s.ended != 0:
			if found && rec.Token == s.ended {
				return fmt.Errorf("acknowledged %q, yet the record came back: %+v (%s)", s.name, rec, where())
			}
		case s.remote != 0 && !ended[s.remote]:
			if !found {
				return fmt.Errorf("acknowledged durable %q is lost (%s)", s.name, where())
			}
		}
	}
	return nil
}

func durEqual(a, b durState) bool {
	return a.State == b.State && a.Token == b.Token && a.OpID == b.OpID &&
		a.Result.Status == b.Result.Status && a.Result.Pointer == b.Result.Pointer &&
		bytes.Equal(a.Result.Body, b.Result.Body)
}
