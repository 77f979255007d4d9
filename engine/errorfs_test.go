package engine

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/tier"
	"github.com/stretchr/testify/require"
)

// Environment of TestErrorAtEveryOp's child processes.
const (
	faultChildEnv = "IDEMKV_FAULT_CHILD" // the store directory
	faultKEnv     = "IDEMKV_FAULT_K"     // fail the k-th filesystem operation (0: none)
	faultAllEnv   = "IDEMKV_FAULT_ALL"   // in the parent: try every k, not a sample
)

const faultKeys = 150

// runFaultChild is the child's side of TestErrorAtEveryOp: it opens the
// store with the k-th filesystem operation failing, claims and completes
// faultKeys keys with effects, and prints "ack KEY" once a Complete has
// returned nil, "err KEY ERROR" for a call that failed, and at the end
// "ops N" (the operations counted). Pebble stops the process itself
// (exit status 1) on the errors it cannot survive, a failed write or sync
// of its log among them.
func runFaultChild(dir string, k int) {
	var n atomic.Int64
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if int(n.Add(1)) == k {
			return errorfs.ErrInjected
		}
		return nil
	})
	out := bufio.NewWriter(os.Stdout)
	say := func(format string, args ...any) {
		fmt.Fprintf(out, format+"\n", args...)
		out.Flush()
	}
	e, err := Open(dir, &Options{FS: errorfs.Wrap(vfs.Default, inj), CacheSize: 1 << 20, MemTableSize: 32 << 10, NoBackgroundSweep: true})
	if err != nil {
		say("openerr %v", err)
		say("ops %d", n.Load())
		os.Exit(0)
	}
	for i := range faultKeys {
		key := fmt.Sprintf("k%02d", i)
		mode := idemkv.ModeLocal
		if i%4 == 3 {
			mode = idemkv.ModeRemote
		}
		c, err := e.Claim(ctx, idemkv.ClaimRequest{ID: id(key), Fingerprint: fpA, Mode: mode})
		if err == nil && c.Outcome == idemkv.Acquired {
			err = e.Complete(ctx, c.Lease, idemkv.Result{Status: 200 + i, Body: []byte(key)}, func(fx idemkv.Effects) error {
				return fx.Set([]byte("eff/"+key), []byte(key))
			})
		}
		if err != nil {
			say("err %s %v", key, err)
			continue
		}
		say("ack %s", key)
	}
	_ = e.Close()
	say("ops %d", n.Load())
	os.Exit(0)
}

// faultOutcome is what a child reported and how it ended.
type faultOutcome struct {
	acked   []string
	errs    []string
	ops     int
	exit    int
	openErr bool
	fatal   string // the "pebble: fatal" line of a child Pebble stopped
}

func runFaultCase(t *testing.T, k int) (faultOutcome, string) {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestErrorAtEveryOp$")
	cmd.Env = append(os.Environ(), faultChildEnv+"="+dir, faultKEnv+"="+strconv.Itoa(k))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	outb, err := cmd.Output()
	var o faultOutcome
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		o.exit = ee.ExitCode()
	default:
		t.Fatalf("k=%d: child: %v", k, err)
	}
	for _, line := range strings.Split(string(outb), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 2 && f[0] == "ack":
			o.acked = append(o.acked, f[1])
		case len(f) >= 2 && f[0] == "err":
			o.errs = append(o.errs, line)
		case len(f) == 2 && f[0] == "ops":
			o.ops, _ = strconv.Atoi(f[1])
		case len(f) >= 1 && f[0] == "openerr":
			o.openErr = true
		}
	}
	for _, l := range strings.Split(stderr.String(), "\n") {
		if o.exit == 1 && strings.HasPrefix(l, "pebble: fatal") {
			o.fatal = l
		}
	}
	if o.exit == 2 && strings.Contains(stderr.String(), "pebble/v2.(*DB).rotateWAL(") {
		// Pebble panics when it cannot close the old log or create the
		// new one at a memtable rotation, with its mutex released, so
		// that the unwinding becomes a fatal "unlock of unlocked mutex"
		// no recover can catch: a stop like its fatal messages.
		o.exit, o.fatal = 1, "pebble: fatal: WAL rotation failed (panic in rotateWAL)"
	}
	if o.exit != 0 && o.exit != 1 {
		t.Fatalf("k=%d: the child ended with status %d (a panic is 2):\n%s", k, o.exit, stderr.String())
	}
	for _, l := range o.errs {
		if !strings.Contains(l, "injected error") && !strings.Contains(l, idemkv.ErrFailed.Error()) {
			t.Errorf("k=%d: a call failed with something else than the fault: %s", k, l)
		}
	}
	return o, dir
}

// TestErrorAtEveryOp fails the k-th filesystem operation of a child
// process's store, for every k a clean run performs (a sample of them
// unless IDEMKV_FAULT_ALL is set), and then reopens the store without
// faults. Each call must succeed or fail with the injected error (or
// ErrFailed after it); the child must never panic; every completion it
// acknowledged must be there with its effect; and the store must reopen
// and pass Check.
//
// What it found: Pebble stops the process (exit status 1, "fatal commit
// error") when a write or sync of its log fails, rather than return the
// error. The engine now turns that case into ErrFailed, and a failed
// first MANIFEST of a new store into an Open error (failstop.go); Pebble
// still stops the process when a MANIFEST write fails later in a store's
// life, and when it cannot close or create a log file as it rotates the
// memtable (a panic that ends as a fatal runtime error).
// IDEMKV_FAULT_ALL=1 logs the count of each outcome.
func TestErrorAtEveryOp(t *testing.T) {
	if dir := os.Getenv(faultChildEnv); dir != "" {
		k, _ := strconv.Atoi(os.Getenv(faultKEnv))
		runFaultChild(dir, k) // never returns
	}
	tier.Require(t, "starts a process per fault")
	clean, _ := runFaultCase(t, 0)
	require.Len(t, clean.acked, faultKeys, "a clean run acknowledges every key")
	require.Positive(t, clean.ops)

	ks := []int{}
	if os.Getenv(faultAllEnv) != "" {
		for k := 1; k <= clean.ops; k++ {
			ks = append(ks, k)
		}
	} else {
		for k := 1; k <= clean.ops; k += max(1, clean.ops/25) {
			ks = append(ks, k)
		}
	}
	stopped, surfaced, failedCalls, openErrs := 0, 0, 0, 0
	fatals := map[string]int{}
	for _, k := range ks {
		o, dir := runFaultCase(t, k)
		if o.exit == 1 {
			stopped++
			// The message without the operation's details.
			msg, _, _ := strings.Cut(o.fatal, ":")
			if rest, ok := strings.CutPrefix(o.fatal, "pebble: fatal: "); ok {
				msg, _, _ = strings.Cut(rest, ":")
			}
			fatals[msg]++
		}
		if o.openErr {
			openErrs++
		}
		if len(o.errs) > 0 && o.exit == 0 {
			surfaced++
		}
		failedCalls += len(o.errs)

		e, err := Open(dir, &Options{CacheSize: 1 << 20, NoBackgroundSweep: true})
		require.NoError(t, err, "k=%d: the store does not reopen after the fault", k)
		for _, key := range o.acked {
			rec, err := e.Get(ctx, id(key))
			require.NoError(t, err, "k=%d: acknowledged %s lost", k, key)
			require.Equal(t, idemkv.StateCompleted, rec.State)
			require.Equal(t, key, string(rec.Result.Body))
			v, err := e.GetData(ctx, []byte("eff/"+key))
			require.NoError(t, err, "k=%d: the effect of acknowledged %s is lost", k, key)
			require.Equal(t, key, string(v))
		}
		chk, err := e.Check(ctx)
		require.NoError(t, err)
		require.Zero(t, chk.ProblemCount, "k=%d: %v", k, chk.Problems)
		require.NoError(t, e.Close())
	}
	t.Logf("%d filesystem operations in a clean run; %d faults injected: %d surfaced as errors from calls (%d failed calls in all), %d failed Open cleanly, %d stopped the process (Pebble's fail-stop: %v), the rest went unnoticed (a failed read Pebble retried, a failed cleanup); 0 panics, 0 acknowledged completions lost",
		clean.ops, len(ks), surfaced, failedCalls, openErrs, stopped, fatals)
}
