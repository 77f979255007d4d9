package pgstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/ttl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Store is an idemkv.Store, and an idemkv.Outbox, on PostgreSQL. Any
// number of processes may open the same database and share its records.
// All methods are safe for concurrent use.
type Store struct {
	pool *pgxpool.Pool
	opts *Options
	// listenConfig connects the listener of the outbox and of settled
	// records, which keeps a connection of its own, outside the pool
	// (outbox.go).
	listenConfig *pgx.ConnConfig
	// watches are the watches of records held by other processes
	// (watch.go).
	watches watchers

	closed atomic.Bool
	stop   context.CancelFunc
	bg     sync.WaitGroup
	outbox chan struct{}
	// announce holds a wish to tell other processes' relays that this
	// one committed events (announceEvents); at most one waits.
	announce chan struct{}
	counter  counters
	// relayID names this store as the outbox's reader; relayUntil is when
	// its hold on the outbox runs out (outbox.go).
	relayID    string
	relayMu    sync.Mutex
	relayUntil time.Time
	// sql holds the statements that depend on the options (the retention
	// classes' windows, LISTEN/NOTIFY).
	sql statements
	// secret is the database's secret (idemkv_secret), read at Open and
	// never changed: every process sharing the database derives the same
	// operation id for a request under it.
	secret []byte
	opIDs  *idemkv.OperationIDs // derives under secret
	// dbClock is Options.Clock when it is the database's (clock.go).
	dbClock *dbClock
}

type statements struct {
	complete, release, resolve, resolveNoEffect, update, local writeSQL
	releaseBare, uncertain, abandoned, escalate                string
}

// newStatements builds the statements for o. Those that settle a record
// held by an attempt (complete, release, mark uncertain) wake its
// watchers (watch.go); the others settle records nobody can watch.
func newStatements(o *Options) statements {
	// Other processes' relays hear of a commit's events from the
	// notifier, after the commit (announceEvents): a NOTIFY in the commit
	// would make every commit with events in the cluster wait its turn.
	woke := settledSQL
	if o.NoListen {
		woke = noNotifySQL
	}
	at5, at1 := expiresSQL(o, "$5"), expiresSQL(o, "$1")
	return statements{
		complete:        newWriteSQL(fmt.Sprintf(completeRecSQL, at5), 7, woke),
		release:         newWriteSQL(releaseRecSQL, 3, woke),
		resolve:         newWriteSQL(fmt.Sprintf(resolveRecSQL, at5), 9, noNotifySQL),
		resolveNoEffect: newWriteSQL(resolveNoEffectRecSQL, 4, noNotifySQL),
		update:          newWriteSQL("SELECT $5::timestamptz AS at", 0, noNotifySQL), // a row for the writes; $5 is the commit's time
		local:           newLocalSQL(o),
		releaseBare:     wakeSQL(releaseBareSQL, woke),
		uncertain:       wakeSQL(fmt.Sprintf(markUncertainSQL, at1), woke),
		abandoned:       wakeSQL(abandonedSQL, woke),
		escalate:        fmt.Sprintf(escalateSQL, at1),
	}
}

// Open connects to the database named by dsn (a postgres:// URL or a
// key=value string, as pgx reads them; a multi-host URL with
// target_session_attrs=read-write finds the primary), migrates its idemkv
// schema to SchemaVersion, and returns the store. opts may be nil.
func Open(ctx context.Context, dsn string, opts *Options) (*Store, error) {
	o := opts.withDefaults()
	if err := o.validate(); err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: pgstore: connection string: %w", idemkv.ErrInvalidArgument, err)
	}
	if o.MaxConns > 0 {
		cfg.MaxConns = o.MaxConns
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["plan_cache_mode"]; !ok &&
		!strings.Contains(cfg.ConnConfig.RuntimeParams["options"], "plan_cache_mode") {
		// The store's statements are point reads and writes by key, which
		// pgx prepares once a connection: a generic plan serves every
		// execution, where the server's default would plan most of them
		// again (about a fifth of the one-statement RunLocal's cost). Set
		// after connecting, not as a startup parameter, which a pooler
		// such as PgBouncer refuses; a server without the setting keeps
		// its default.
		after := cfg.AfterConnect
		cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
			_, _ = conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan")
			if after != nil {
				return after(ctx, conn)
			}
			return nil
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgstore: connect: %w", err)
	}
	if err := migrate(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	secret, err := readSecret(ctx, pool)
	if err != nil {
		pool.Close()
		return nil, err
	}
	var dbc *dbClock // nil when Options.Clock is set
	if o.Clock == nil {
		if dbc, err = newDBClock(ctx, pool, o.local); err != nil {
			pool.Close()
			return nil, err
		}
		o.Clock = dbc
	}
	o.Sweep.Clock = o.Clock
	bgctx, stop := context.WithCancel(context.Background())
	s := &Store{pool: pool, opts: o, listenConfig: listenerConfig(cfg.ConnConfig), relayID: newEventID(), stop: stop,
		outbox: make(chan struct{}, 1), announce: make(chan struct{}, 1), sql: newStatements(o), secret: secret, opIDs: idemkv.NewOperationIDs(secret),
		dbClock: dbc}
	s.startNotifier(ctx, bgctx)
	if dbc != nil {
		s.bg.Go(func() { dbc.run(bgctx) })
	}
	if !o.NoBackgroundSweep {
		sw, err := ttl.New(s, &o.Sweep)
		if err != nil {
			stop()
			s.bg.Wait()
			pool.Close()
			return nil, fmt.Errorf("%w: pgstore: %w", idemkv.ErrInvalidArgument, err)
		}
		s.bg.Go(func() { _ = sw.Run(bgctx) })
	}
	return s, nil
}

// Close stops the store's background work and closes its connections.
// Operations after Close return idemkv.ErrClosed.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.stop()
	s.bg.Wait()
	s.releaseRelay()
	s.pool.Close()
	return nil
}

// Now reads the store's clock (Options.Clock): Store is an idemkv.Clock,
// for the reconciler and the relay.
func (s *Store) Now() time.Time { return s.opts.Clock.Now() }

// Pool returns the store's connection pool, for a service's own queries
// on the same database.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

func (s *Store) open() error {
	if s.closed.Load() {
		return idemkv.ErrClosed
	}
	return nil
}

// dbErr wraps a database error with what was being done; after Close it
// is ErrClosed.
func (s *Store) dbErr(what string, err error) error {
	if s.closed.Load() {
		return idemkv.ErrClosed
	}
	return fmt.Errorf("pgstore: %s: %w", what, err)
}

// serialization reports an error that aborted a transaction only because
// it ran concurrently with another (SQLSTATE 40001 serialization_failure,
// 40P01 deadlock_detected): running it again may succeed. CockroachDB
// reports its transaction retries as 40001.
func serialization(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01")
}

// pauseAfterConflict waits before a transaction that failed to serialize
// runs again: a random pause that grows with the runs so far (up to
// about 30 ms), so that transactions that conflicted do not meet again
// at once. PostgreSQL locks what a transaction read by index page, so
// writers of different keys on one page conflict too; spreading their
// retries is what lets them all commit.
func pauseAfterConflict(ctx context.Context, runs int) error {
	t := time.NewTimer(rand.N(250 * time.Microsecond << min(runs, 7)))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// window is the retention window of class ("" is the default class); a
// class no longer configured gets the longest.
func (s *Store) window(class string) time.Duration {
	if class == "" {
		return s.opts.Retention
	}
	if w, ok := s.opts.RetentionClasses[class]; ok {
		return w
	}
	return s.opts.RetentionClasses.Longest()
}

// PostgreSQL's text holds valid UTF-8 without NUL; the contract allows a
// NUL in a tenant or an endpoint, and any bytes in a pointer, a note or an
// event key. This store refuses those up front, with the contract's
// errors, rather than fail in the database.

// pgText reports whether s fits a text column.
func pgText(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

// validateID checks id against the contract and against text columns.
func validateID(id idemkv.ID) error {
	if err := id.Validate(); err != nil {
		return err
	}
	if !pgText(id.Tenant) || !pgText(id.Endpoint) {
		return fmt.Errorf("%w: a tenant or endpoint with a NUL byte (the PostgreSQL store keeps them as text)", idemkv.ErrInvalidScope)
	}
	return nil
}

// validateNote checks a note against the contract and text columns.
func validateNote(note string) error {
	if len(note) > idemkv.MaxNoteLen {
		return fmt.Errorf("%w: note is %d bytes, limit %d", idemkv.ErrInvalidArgument, len(note), idemkv.MaxNoteLen)
	}
	if !pgText(note) {
		return fmt.Errorf("%w: a note that is not UTF-8 text without NUL (the PostgreSQL store keeps it as text)", idemkv.ErrInvalidArgument)
	}
	return nil
}

func (s *Store) validateResult(r *idemkv.Result) error {
	if !pgText(r.Pointer) {
		return fmt.Errorf("%w: a pointer that is not UTF-8 text without NUL (the PostgreSQL store keeps it as text)", idemkv.ErrInvalidResult)
	}
	return r.Validate(s.opts.MaxBodySize)
}

// recordColumns are the columns scanRecord reads, in its order.
const recordColumns = `state, mode, fingerprint, token, attempt, operation_id, created,
	lease_expires, expires, class, status, pointer, body, effects, note, escalated, marked`

// scanRecord reads recordColumns into a Record for id.
func scanRecord(row pgx.Row, id idemkv.ID, extra ...any) (idemkv.Record, error) {
	var (
		r               = idemkv.Record{ID: id}
		state, mode     int16
		token           int64
		attempt         int32
		opID            []byte
		lease, marked   *time.Time
		status, effects int32
	)
	dest := append([]any{&state, &mode, &r.Fingerprint, &token, &attempt, &opID, &r.Created,
		&lease, &r.Expires, &r.Class, &status, &r.Result.Pointer, &r.Result.Body, &effects, &r.Note, &r.Escalated,
		&marked}, extra...)
	if err := row.Scan(dest...); err != nil {
		return idemkv.Record{}, err
	}
	r.State, r.Mode = idemkv.State(state), idemkv.Mode(mode)
	r.Token, r.Attempt = uint64(token), uint32(attempt)
	copy(r.OperationID[:], opID)
	// pgx reads timestamps in the local zone; the store's times are UTC.
	r.Created, r.Expires = r.Created.UTC(), r.Expires.UTC()
	if lease != nil {
		r.LeaseExpires = lease.UTC()
	}
	r.Result.Status, r.Effects = int(status), int(effects)
	if r.State != idemkv.StateCompleted {
		r.Result = idemkv.Result{}
	}
	// Every statement that takes a record out of the uncertain state
	// clears marked; one run by a process of an earlier version (a
	// rolling upgrade) does not know the column, so only an uncertain
	// record's is read.
	if marked != nil && r.State == idemkv.StateUncertain {
		r.Marked = marked.UTC()
	}
	return r, nil
}

func leaseOf(r *idemkv.Record) idemkv.Lease {
	return idemkv.Lease{ID: r.ID, Mode: r.Mode, Token: r.Token, Expires: r.LeaseExpires,
		Attempt: r.Attempt, OperationID: r.OperationID}
}

// counters are the store's event counts, for Counts.
type counters struct {
	claims, acquired, replays, mismatches, inProgress, completed, conflicts, fenced atomic.Int64
}

// Counts implements idemkv.DataStore: what this process's Store did
// since Open.
func (s *Store) Counts() idemkv.Counts {
	c := &s.counter
	return idemkv.Counts{Claims: c.claims.Load(), Acquired: c.acquired.Load(), Replays: c.replays.Load(),
		Mismatches: c.mismatches.Load(), InProgress: c.inProgress.Load(),
		Completed: c.completed.Load(), Conflicts: c.conflicts.Load(), Fenced: c.fenced.Load()}
}

// Health reports whether the database answers.
func (s *Store) Health(ctx context.Context) error {
	if err := s.open(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := s.pool.Ping(ctx); err != nil {
		return s.dbErr("ping", err)
	}
	if s.dbClock != nil {
		return s.dbClock.stale()
	}
	return nil
}

func (s *Store) fenced(l idemkv.Lease) error {
	s.counter.fenced.Add(1)
	return fmt.Errorf("%w: token %d for key_hash %s", idemkv.ErrFenced, l.Token, l.ID.Hash())
}

// validateLease checks l against the contract and against text columns.
func validateLease(l *idemkv.Lease) error {
	if err := l.Validate(); err != nil {
		return err
	}
	return validateID(l.ID)
}

// listenerApp is the application_name of the listener's connection, when
// the DSN names none: an operator tells it from the pool's connections in
// pg_stat_activity.
const listenerApp = "idemkv listener"

// listenerConfig is the pool's connection config for the listener.
func listenerConfig(c *pgx.ConnConfig) *pgx.ConnConfig {
	lc := c.Copy()
	if lc.RuntimeParams["application_name"] == "" {
		lc.RuntimeParams["application_name"] = listenerApp
	}
	return lc
}
