// Package ttl is idemkv's retention policy: the retention classes a claim
// chooses from, and the sweeper that deletes records once their retention
// has passed, keeping storage bounded.
//
// # Retention classes
//
// A record is kept, and replayed, for the window of its class, counted
// from when it was completed. Classes are configured by name (for example
// "http" for 24 hours, "money" for 30 days: a financial natural key should
// outlive any response cache); a claim that names no class gets
// DefaultClass. See docs/operations.md for how to size a window.
//
// # The sweeper
//
// Expiry itself needs no sweeper: every read treats a record past its
// expiry as absent at once. The sweeper only gives the space back. It
// works in passes, each a series of chunks in the target's key order:
// Target.SweepChunk calls that read a bounded number of records, delete
// those that have expired and may go (the engine drops whole expiry
// buckets), and save the position reached in the same atomic write. So a
// pass interrupted by a crash or a restart resumes where it stopped, and
// sweeping twice is harmless. The reads are rate-limited (Options.Rate),
// so a pass takes a bounded share of the machine while foreground
// requests run.
//
// Never deleted, whatever their expiry: a record whose outcome is not
// settled (in progress, or uncertain until a reconciler resolves it), and
// a key that a holder in this process is working on. A pass counts those
// it meets past their expiry as held (Pass.Held).
//
// Why the engine keeps completed records in expiry buckets rather than
// deleting them one by one: see docs/design.md, "Expiry and the sweeper",
// for the measurements.
package ttl

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/idemkv/idemkv"
)

// DefaultClass is the class of a claim that names none.
const DefaultClass = "default"

// ErrUnknownClass is returned (wrapped) for a class name not configured.
var ErrUnknownClass = errors.New("ttl: unknown retention class")

// Classes maps retention class names to their windows. The zero value has
// no classes; Lookup of "" or DefaultClass then fails unless the default
// is set.
type Classes map[string]time.Duration

// WithDefault returns a copy of c that has DefaultClass, with window
// unless c names it already: a store's classes, its default retention
// among them.
func (c Classes) WithDefault(window time.Duration) Classes {
	out := make(Classes, len(c)+1)
	maps.Copy(out, c)
	if _, ok := out[DefaultClass]; !ok {
		out[DefaultClass] = window
	}
	return out
}

// ValidateName reports whether name can name a class: 1 to idemkv.MaxClassLen
// bytes of a-z, 0-9, '-' and '_'.
func ValidateName(name string) error {
	if name == "" || len(name) > idemkv.MaxClassLen {
		return fmt.Errorf("ttl: retention class name %q: want 1 to %d bytes", name, idemkv.MaxClassLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return fmt.Errorf("ttl: retention class name %q: byte %q not in [a-z0-9_-]", name, c)
		}
	}
	return nil
}

// Validate reports whether every name is valid and every window positive
// and at most MaxWindow.
func (c Classes) Validate() error {
	for _, name := range c.Names() {
		if err := ValidateName(name); err != nil {
			return err
		}
		if w := c[name]; w <= 0 || w > MaxWindow {
			return fmt.Errorf("ttl: retention class %q: window %v not in (0, %v]", name, w, MaxWindow)
		}
	}
	return nil
}

// MaxWindow bounds a class's window: ten years.
const MaxWindow = 10 * 365 * 24 * time.Hour

// Lookup returns the window of the class called name; "" means
// DefaultClass. Its error wraps ErrUnknownClass.
func (c Classes) Lookup(name string) (time.Duration, error) {
	if name == "" {
		name = DefaultClass
	}
	w, ok := c[name]
	if !ok {
		return 0, fmt.Errorf("%w %q (configured: %v)", ErrUnknownClass, name, c.Names())
	}
	return w, nil
}

// Names returns the class names, sorted.
func (c Classes) Names() []string {
	names := make([]string, 0, len(c))
	for n := range c {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Longest returns the longest window, or 0 if there are no classes.
func (c Classes) Longest() time.Duration {
	var m time.Duration
	for _, w := range c {
		m = max(m, w)
	}
	return m
}

// Target is a store the sweeper can sweep. The engine implements it; a
// SQL store would implement SweepChunk as a bounded DELETE.
type Target interface {
	// SweepCursor returns the saved position of the current pass: nil if
	// the next chunk starts a pass.
	SweepCursor() ([]byte, error)
	// SweepChunk examines up to n records after cursor (from the start of
	// the key space if cursor is nil), deletes those that are expired at
	// now and may be deleted, and saves the position reached, all in one
	// atomic write. Chunk.Next is that position, nil when the chunk
	// reached the end of the key space (the pass is over, and the saved
	// position is the start again).
	SweepChunk(ctx context.Context, cursor []byte, n int, now time.Time) (Chunk, error)
}

// Chunk is what one SweepChunk call did.
type Chunk struct {
	// Next is where the next chunk starts; nil at the end of a pass.
	Next []byte
	// Examined is the number of records read.
	Examined int
	// Deleted is the number of expired records deleted.
	Deleted int
	// DeletedBytes is the size of the deleted records' keys and values.
	DeletedBytes int64
	// Held is the number of records past their expiry that were kept
	// because their outcome is not settled or a holder is working on them.
	Held int
}

// Pass is what one pass, or the part of it run so far, did.
type Pass struct {
	Started, Ended time.Time
	Chunks         int
	Examined       int
	Deleted        int
	DeletedBytes   int64
	Held           int
	// Resumed reports that the pass started from a saved position.
	Resumed bool
}

func (p *Pass) add(c Chunk) {
	p.Chunks++
	p.Examined += c.Examined
	p.Deleted += c.Deleted
	p.DeletedBytes += c.DeletedBytes
	p.Held += c.Held
}

// The defaults of Options.
const (
	DefaultInterval  = 10 * time.Minute
	DefaultRate      = 50_000
	DefaultChunkSize = 64
	DefaultRetryWait = time.Second
)

// Options configure a Sweeper. A nil *Options, and every zero field, means
// the default documented on the field.
type Options struct {
	// Interval is the time from the start of one pass to the start of the
	// next. A pass that takes longer is followed at once by the next.
	// Default: 10 minutes. A record is deleted at most one interval plus
	// one pass after it expires.
	Interval time.Duration
	// Rate is how many records per second a pass examines at most.
	// Default: 50,000. Negative: no limit. A pass that reads N records
	// takes at least N/Rate seconds; see docs/operations.md for sizing.
	Rate float64
	// ChunkSize is the number of records per SweepChunk. Default: 64.
	// Smaller chunks hold a CPU for less time at once.
	ChunkSize int
	// Clock decides expiry. Default: the system clock. The engine passes
	// its own.
	Clock idemkv.Clock
	// After returns a channel that receives after d; the background loop
	// waits on it between passes. Default: time.After. Tests inject it to
	// start passes without waiting.
	After func(d time.Duration) <-chan time.Time
	// OnPass, if set, is called after every pass with what it did.
	OnPass func(Pass)
	// RetryWait is how long the background loop waits after a failed pass
	// before it tries again. It doubles with each failure in a row, up to
	// Interval, and is jittered to between half and all of that, so that a
	// transient fault (a read error, a full disk) costs a retry, not the
	// sweeper. Default: 1 second.
	RetryWait time.Duration
	// OnError, if set, is called with the error of every failed pass of
	// the background loop and the number of failures in a row.
	OnError func(err error, inARow int)
}

// EnsureDefaults returns a copy of o (which may be nil) with every zero
// field set to its default.
func (o *Options) EnsureDefaults() *Options {
	var c Options
	if o != nil {
		c = *o
	}
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.Rate == 0 {
		c.Rate = DefaultRate
	}
	if c.ChunkSize == 0 {
		c.ChunkSize = DefaultChunkSize
	}
	if c.Clock == nil {
		c.Clock = idemkv.SystemClock{}
	}
	if c.After == nil {
		c.After = time.After
	}
	if c.RetryWait == 0 {
		c.RetryWait = DefaultRetryWait
	}
	return &c
}

// Validate reports whether o's fields are in range.
func (o *Options) Validate() error {
	c := o.EnsureDefaults()
	switch {
	case c.Interval < 0:
		return fmt.Errorf("ttl: negative interval %v", c.Interval)
	case c.ChunkSize < 1 || c.ChunkSize > 1<<16:
		return fmt.Errorf("ttl: chunk size %d not in [1, 65536]", c.ChunkSize)
	case c.RetryWait < 0:
		return fmt.Errorf("ttl: negative retry wait %v", c.RetryWait)
	}
	return nil
}

// Stats are a sweeper's totals.
type Stats struct {
	// Passes is the number of passes finished.
	Passes int64
	// Deleted and DeletedBytes count every record deleted.
	Deleted      int64
	DeletedBytes int64
	// Examined counts every record read.
	Examined int64
	// Last is the last finished pass; Current the one running, if any.
	Last, Current Pass
	// Running reports that a pass is under way.
	Running bool
	// Failures counts the passes that ended with an error other than
	// their context's. FailingSince is when the first of the latest
	// failures in a row began, zero once a pass succeeds; LastError is the
	// latest failure's error, kept after a success for diagnosis.
	Failures     int64
	FailingSince time.Time
	LastError    error
}

// HeldPastExpiry is the number of records past their expiry kept by the
// last finished pass (or by the current one, if it has held more so far).
func (s Stats) HeldPastExpiry() int { return max(s.Last.Held, s.Current.Held) }

// Sweeper sweeps one Target. Its methods are safe for concurrent use; one
// pass runs at a time.
type Sweeper struct {
	t       Target
	opts    *Options
	limiter *rate.Limiter

	pass sync.Mutex // held by the running pass

	mu    sync.Mutex
	stats Stats
}

// New returns a sweeper of t. It does nothing until Pass or Run is called.
func New(t Target, opts *Options) (*Sweeper, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	o := opts.EnsureDefaults()
	lim := rate.NewLimiter(rate.Limit(o.Rate), o.ChunkSize)
	if o.Rate < 0 {
		lim = rate.NewLimiter(rate.Inf, o.ChunkSize)
	}
	return &Sweeper{t: t, opts: o, limiter: lim}, nil
}

// Stats returns the sweeper's totals.
func (s *Sweeper) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// Pass runs the current pass to its end: from the saved position if a pass
// was interrupted, else over the whole key space. It waits for a pass
// already running to end first. Expiry is decided by the clock's time at
// each chunk.
func (s *Sweeper) Pass(ctx context.Context) (Pass, error) {
	s.pass.Lock()
	defer s.pass.Unlock()
	cursor, err := s.t.SweepCursor()
	if err != nil {
		s.failed(s.opts.Clock.Now(), err)
		return Pass{}, err
	}
	p := Pass{Started: s.opts.Clock.Now(), Resumed: cursor != nil}
	s.mu.Lock()
	s.stats.Running, s.stats.Current = true, p
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.stats.Running, s.stats.Current = false, Pass{}
		s.mu.Unlock()
	}()
	for {
		if err := s.limiter.WaitN(ctx, s.opts.ChunkSize); err != nil {
			if _, ok := ctx.Deadline(); ok && ctx.Err() == nil {
				// The wait would outlast ctx's deadline: the pass stops here,
				// as it would at the deadline.
				return p, context.DeadlineExceeded
			}
			return p, err
		}
		c, err := s.t.SweepChunk(ctx, cursor, s.opts.ChunkSize, s.opts.Clock.Now())
		if err != nil {
			if ctx.Err() == nil {
				s.failed(p.Started, err)
			}
			return p, err
		}
		p.add(c)
		s.mu.Lock()
		s.stats.Examined += int64(c.Examined)
		s.stats.Deleted += int64(c.Deleted)
		s.stats.DeletedBytes += int64(c.DeletedBytes)
		s.stats.Current = p
		s.mu.Unlock()
		if cursor = c.Next; cursor == nil {
			break
		}
	}
	p.Ended = s.opts.Clock.Now()
	s.mu.Lock()
	s.stats.Passes++
	s.stats.Last = p
	s.stats.FailingSince = time.Time{}
	s.mu.Unlock()
	if s.opts.OnPass != nil {
		s.opts.OnPass(p)
	}
	return p, nil
}

// failed records a pass, started at start, that failed with err.
func (s *Sweeper) failed(start time.Time, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.Failures++
	s.stats.LastError = err
	if s.stats.FailingSince.IsZero() {
		s.stats.FailingSince = start
	}
}

// Run sweeps until ctx ends: a pass at once, then one every Interval
// (measured from pass start to pass start). After a failed pass it tries
// again after RetryWait, doubled for each failure in a row up to Interval
// and jittered; it returns only ctx's error.
func (s *Sweeper) Run(ctx context.Context) error {
	inARow := 0
	for {
		start := time.Now()
		_, err := s.Pass(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		wait := s.opts.Interval - time.Since(start)
		if err != nil {
			inARow++
			if s.opts.OnError != nil {
				s.opts.OnError(err, inARow)
			}
			wait = s.retryWait(inARow)
		} else {
			inARow = 0
		}
		if wait <= 0 {
			// Yield to cancellation between back-to-back passes.
			if err := ctx.Err(); err != nil {
				return err
			}
			continue
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.opts.After(wait):
		}
	}
}

// retryWait is the wait before the next pass after n failed passes in a
// row: RetryWait doubled n-1 times, at most Interval (or RetryWait, if
// longer), jittered to between half and all of it so that the sweepers
// of many processes do not retry in step.
func (s *Sweeper) retryWait(n int) time.Duration {
	d := s.opts.RetryWait << min(n-1, 30)
	if d <= 0 || d > max(s.opts.Interval, s.opts.RetryWait) {
		d = max(s.opts.Interval, s.opts.RetryWait)
	}
	return d/2 + rand.N(d/2+1)
}
