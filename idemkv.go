package idemkv

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"
)

// Limits on the parts of an ID and on fingerprints. Backends may store
// anything within these limits; callers get ErrInvalidKey, ErrInvalidScope
// or ErrInvalidFingerprint outside them.
const (
	// MaxKeyLen is the longest idempotency key, in bytes.
	MaxKeyLen = 255
	// MaxScopeLen is the longest Tenant and the longest Endpoint, in bytes.
	MaxScopeLen = 255
	// MaxFingerprintLen is the longest fingerprint, in bytes.
	MaxFingerprintLen = 64
	// MaxPointerLen is the longest Result.Pointer, in bytes.
	MaxPointerLen = 1024
	// MaxNoteLen is the longest note kept with an uncertain record, in bytes.
	MaxNoteLen = 1024
	// MaxClassLen is the longest retention class name, in bytes (package
	// ttl validates names against it).
	MaxClassLen = 32
)

// Errors returned by a Store. Match them with errors.Is; a Store wraps them
// with context, naming a record by its key's hash (ID.Hash), never by the
// key itself, so that its errors can be logged as they are.
var (
	// ErrInvalidKey: the key is empty, longer than MaxKeyLen, or contains a
	// byte outside printable ASCII (0x20-0x7e).
	ErrInvalidKey = errors.New("idemkv: invalid idempotency key")
	// ErrInvalidScope: the tenant or endpoint is empty, longer than
	// MaxScopeLen, or not valid UTF-8.
	ErrInvalidScope = errors.New("idemkv: invalid scope")
	// ErrInvalidFingerprint: the fingerprint is empty or longer than
	// MaxFingerprintLen.
	ErrInvalidFingerprint = errors.New("idemkv: invalid fingerprint")
	// ErrInvalidResult: the result's status, pointer or body is out of range.
	ErrInvalidResult = errors.New("idemkv: invalid result")
	// ErrInvalidArgument: any other malformed argument (a zero lease, a
	// negative duration, an empty effect key).
	ErrInvalidArgument = errors.New("idemkv: invalid argument")
	// ErrFenced: the lease's token is no longer the record's current token
	// (another caller took the record over, or it was completed, released
	// or marked uncertain). Nothing was changed.
	ErrFenced = errors.New("idemkv: fenced: lease token is no longer current")
	// ErrNotFound: no live record exists for the ID.
	ErrNotFound = errors.New("idemkv: record not found")
	// ErrWrongState: the record is not in the state the operation requires
	// (for example, Resolve on a record that is not uncertain).
	ErrWrongState = errors.New("idemkv: record in wrong state")
	// ErrClosed: the store has been closed.
	ErrClosed = errors.New("idemkv: store closed")
	// ErrNoSpace: the store's disk is nearly full, so it refuses to start
	// new work (a claim that would acquire). Replays, reads and the work
	// already in progress continue; new claims succeed again once space
	// is freed. Answer it like an unavailable store (HTTP 503).
	ErrNoSpace = errors.New("idemkv: store is low on disk space; not starting new work")
	// ErrFailed: a durable write failed in a way that leaves its outcome
	// unknown. The store refuses all further work until it is reopened,
	// because it can no longer tell which results are durable.
	ErrFailed = errors.New("idemkv: store failed")
	// ErrConflict: the business data an apply function read kept changing
	// under it: every run of it, up to the store's bound, read a key that
	// another commit wrote before its own writes could commit. Nothing was
	// written; a holder's lease is still held.
	ErrConflict = errors.New("idemkv: conflict: data read by the operation changed before it could commit")
)

// ID addresses one idempotency record.
type ID struct {
	// Tenant is the caller's scope: the authenticated principal or account
	// the key belongs to. Never an untrusted string taken from the request.
	Tenant string
	// Endpoint names the operation, for example "POST /v1/payments".
	Endpoint string
	// Key is the client's idempotency key.
	Key string
}

// Validate reports whether id is well formed. It returns an error wrapping
// ErrInvalidScope or ErrInvalidKey.
func (id ID) Validate() error {
	if err := validateScope("tenant", id.Tenant); err != nil {
		return err
	}
	if err := validateScope("endpoint", id.Endpoint); err != nil {
		return err
	}
	return ValidateKey(id.Key)
}

// Hash returns a short digest that names id in logs and traces without
// its key, which can carry customer data: 16 lower-case hex digits, the
// first 8 bytes of SHA-256 over the tenant, a zero byte, the endpoint, a
// zero byte and the key. Every package of idemkv logs it as "key_hash",
// so an operator given a customer's key can compute it and find the
// request's lines:
//
//	printf '%s\0%s\0%s' TENANT ENDPOINT KEY | sha256sum | cut -c1-16
//
// It hides the key from a reader of the logs, not from one who can guess
// it: a low-entropy key (an order number) can be confirmed by hashing
// the candidates.
func (id ID) Hash() string {
	var buf [2*MaxScopeLen + MaxKeyLen + 2]byte
	b := append(buf[:0], id.Tenant...)
	b = append(b, 0)
	b = append(b, id.Endpoint...)
	b = append(b, 0)
	b = append(b, id.Key...)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

func validateScope(what, s string) error {
	switch {
	case s == "":
		return fmt.Errorf("%w: empty %s", ErrInvalidScope, what)
	case len(s) > MaxScopeLen:
		return fmt.Errorf("%w: %s is %d bytes, limit %d", ErrInvalidScope, what, len(s), MaxScopeLen)
	case !utf8.ValidString(s):
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalidScope, what)
	}
	return nil
}

// ValidateKey reports whether key is a well-formed idempotency key: 1 to
// MaxKeyLen bytes of printable ASCII. It returns an error wrapping
// ErrInvalidKey.
func ValidateKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	}
	if len(key) > MaxKeyLen {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrInvalidKey, len(key), MaxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("%w: byte 0x%02x at offset %d is not printable ASCII", ErrInvalidKey, c, i)
		}
	}
	return nil
}

// AppendTenantKey appends to dst a data key for tenant: the tenant's
// length in one byte, the tenant, then key. Two tenants' keys never
// collide, and AppendTenantKey(nil, tenant, nil) is the prefix of all of
// one tenant's keys, for a scan. A tenant that is not a valid scope is an
// ErrInvalidScope.
func AppendTenantKey(dst []byte, tenant string, key []byte) ([]byte, error) {
	if err := validateScope("tenant", tenant); err != nil {
		return dst, err
	}
	dst = append(dst, byte(len(tenant)))
	dst = append(dst, tenant...)
	return append(dst, key...), nil
}

// ValidateFingerprint reports whether fp is a usable fingerprint. It returns
// an error wrapping ErrInvalidFingerprint.
func ValidateFingerprint(fp []byte) error {
	if len(fp) == 0 {
		return fmt.Errorf("%w: empty", ErrInvalidFingerprint)
	}
	if len(fp) > MaxFingerprintLen {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrInvalidFingerprint, len(fp), MaxFingerprintLen)
	}
	return nil
}

// Mode says where the protected effect lives.
type Mode uint8

const (
	// ModeLocal: the effect is a set of writes to the same store, committed
	// atomically with the outcome by Complete. The claim itself need not be
	// durable.
	ModeLocal Mode = iota
	// ModeRemote: the effect happens outside the store. The claim is durable
	// before Claim returns, and carries an OperationID for the downstream.
	ModeRemote
)

func (m Mode) String() string {
	switch m {
	case ModeLocal:
		return "local"
	case ModeRemote:
		return "remote"
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// State is the state of a stored record. An absent record has no state.
type State uint8

const (
	// StateInProgress: a holder owns the record under a lease.
	StateInProgress State = iota + 1
	// StateUncertain: an attempt's effect may or may not have happened.
	// Retries see Reconciling until Resolve settles it.
	StateUncertain
	// StateCompleted: the outcome is final and replayed to every retry.
	StateCompleted
)

func (s State) String() string {
	switch s {
	case StateInProgress:
		return "in-progress"
	case StateUncertain:
		return "uncertain"
	case StateCompleted:
		return "completed"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Outcome is the answer to a Claim.
type Outcome uint8

const (
	// Acquired: the caller holds the lease and must run the operation.
	Acquired Outcome = iota + 1
	// InProgress: another holder has a live lease; retry later.
	InProgress
	// Replay: the operation completed; return the stored result.
	Replay
	// Mismatch: the key was used with a different fingerprint.
	Mismatch
	// Reconciling: an earlier attempt's outcome is unknown; do not re-run.
	Reconciling
)

func (o Outcome) String() string {
	switch o {
	case Acquired:
		return "acquired"
	case InProgress:
		return "in-progress"
	case Replay:
		return "replay"
	case Mismatch:
		return "mismatch"
	case Reconciling:
		return "reconciling"
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// Result is the compact final outcome of an operation: a status code, a
// pointer to what the operation created, and optionally a bounded body for
// byte-exact replay.
type Result struct {
	// Status is the outcome's status code, for HTTP the response status.
	// 0 to 65535.
	Status int
	// Pointer locates the object the operation created, for example
	// "/v1/payments/pay_42", so a replay can rebuild the response from it.
	// At most MaxPointerLen bytes.
	Pointer string
	// Body, if set, is replayed byte for byte. Backends bound its size.
	Body []byte
}

// Record is a stored record, as returned by Get and carried by Claim.
type Record struct {
	ID    ID
	State State
	// Mode of the attempt that created or last took over the record.
	Mode Mode
	// Fingerprint of the request that first claimed the key.
	Fingerprint []byte
	// Token is the current fencing token.
	Token uint64
	// Attempt counts acquisitions: 1 for the first, +1 per takeover.
	Attempt uint32
	// OperationID is the downstream identity (remote mode only).
	OperationID OperationID
	// Created is when the key was first claimed.
	Created time.Time
	// LeaseExpires is when the current lease runs out (StateInProgress),
	// as last renewed: a remote record's renewals are durable, so after a
	// crash it is still the last moment its holder could send downstream.
	LeaseExpires time.Time
	// Expires is when the record leaves the retention window. A completed
	// record past it is absent to every read; an unsettled one (in
	// progress or uncertain) is kept past it until it settles.
	Expires time.Time
	// Class is the retention class the first claim chose; "" is the
	// store's default class.
	Class string
	// Result is the final outcome (StateCompleted).
	Result Result
	// Effects counts the values the completion wrote through Effects: the
	// distinct keys whose last write in its apply was a Set (StateCompleted
	// only; 0 if it wrote none). Check uses it to pair an outcome with its
	// effects.
	Effects int
	// Marked is when the record was marked uncertain (StateUncertain), to
	// the millisecond at least (the engine keeps milliseconds, pgstore
	// microseconds): by its holder (Store.MarkUncertain), or by a claim
	// that found its remote lease run out. A holder sends nothing
	// downstream once it no longer holds its lease, so every call of the
	// attempt was sent before it; a reconciler's grace runs from it.
	// Zero on a record marked by a store that did not keep it.
	Marked time.Time
	// Note says why the record is uncertain or escalated (StateUncertain),
	// or, on a record an operator settled, what they noted (the audit
	// note of a ResolveRequest).
	Note string
	// Escalated marks an uncertain record that reconciliation gave up on:
	// it is never re-run or reconciled again, and waits for an operator
	// (StateUncertain only).
	Escalated bool
}

// Lease is a holder's right to finish one attempt of an operation.
type Lease struct {
	ID   ID
	Mode Mode
	// Token is the fencing token of this acquisition. Send it along with
	// any write that a downstream can fence on.
	Token uint64
	// Expires is when others may take the record over.
	Expires time.Time
	// Attempt is 1 for a first claim and more after a takeover.
	Attempt uint32
	// OperationID is the downstream identity (remote mode only).
	OperationID OperationID
}

// Validate reports whether l can name an acquisition: a valid ID and a
// token. It does not say whether the lease is still current; only the
// store knows that.
func (l *Lease) Validate() error {
	if err := l.ID.Validate(); err != nil {
		return err
	}
	if l.Token == 0 {
		return fmt.Errorf("%w: lease has no token", ErrInvalidArgument)
	}
	return nil
}

// Takeover reports whether this lease took over an earlier holder's expired
// lease. For a remote operation, the earlier attempt's downstream call may
// have landed: resume it with the same OperationID.
func (l Lease) Takeover() bool { return l.Attempt > 1 }

// ClaimRequest asks to claim an ID.
type ClaimRequest struct {
	ID          ID
	Fingerprint []byte
	Mode        Mode
	// Lease is how long the holder may work before others may take the
	// record over. Zero means the store's default.
	Lease time.Duration
	// Resumable declares that the downstream deduplicates on OperationID,
	// so an expired remote claim may be taken over and the same operation
	// re-sent. Without it, an expired remote claim becomes uncertain.
	Resumable bool
	// Generation selects the downstream identity of a new remote
	// operation (DeriveOperationID): zero, the default, gives every claim
	// of one logical request the same OperationID. An application that
	// truly wants the same request sent under a new downstream identity
	// (its downstream has voided the old key, say) claims with a
	// generation it has not used for the key. It applies only to a claim
	// that starts a new record: a takeover resumes the stored id.
	Generation uint32
	// Retention names the retention class that decides how long the
	// outcome is kept and replayed; "" means the store's default class.
	// Stores reject a class they are not configured with (an error
	// wrapping ErrInvalidArgument). The first claim's class stays with the
	// record: a retry naming another class does not change it.
	Retention string
}

// Validate reports whether req is well formed: a valid ID and
// fingerprint, a known mode, a non-negative lease. Its errors wrap
// ErrInvalidKey, ErrInvalidScope, ErrInvalidFingerprint or
// ErrInvalidArgument.
func (req *ClaimRequest) Validate() error {
	if err := req.ID.Validate(); err != nil {
		return err
	}
	if err := ValidateFingerprint(req.Fingerprint); err != nil {
		return err
	}
	if req.Mode != ModeLocal && req.Mode != ModeRemote {
		return fmt.Errorf("%w: unknown mode %d", ErrInvalidArgument, req.Mode)
	}
	if req.Lease < 0 {
		return fmt.Errorf("%w: negative lease %v", ErrInvalidArgument, req.Lease)
	}
	if len(req.Retention) > MaxClassLen {
		return fmt.Errorf("%w: retention class name is %d bytes, limit %d", ErrInvalidArgument, len(req.Retention), MaxClassLen)
	}
	return nil
}

// Claim is the answer to a ClaimRequest.
type Claim struct {
	Outcome Outcome
	// Lease is set when Outcome is Acquired.
	Lease Lease
	// Record is the record found, for every outcome but Acquired. For
	// InProgress and Mismatch it carries no result.
	Record Record
	// RetryAfter is set when Outcome is InProgress: when the current lease
	// runs out, or a short interval if its holder is finishing.
	RetryAfter time.Duration
}

// Store is the contract every idempotency backend implements. All methods
// are safe for concurrent use.
type Store interface {
	// Claim atomically claims req.ID if it is absent (or takes over an
	// expired lease), and otherwise reports why not. Two concurrent claims
	// of one ID never both acquire it. Errors: ErrInvalidKey,
	// ErrInvalidScope, ErrInvalidFingerprint, ErrInvalidArgument,
	// ErrNoSpace (a claim that would acquire, while the store is low on
	// disk), ErrClosed, ErrFailed, or an I/O error.
	Claim(ctx context.Context, req ClaimRequest) (Claim, error)

	// Complete stores r as the final outcome of the lease's operation, and
	// in the same atomic commit applies the writes that apply (if non-nil)
	// makes to Effects. It returns only once both are durable. If apply
	// returns an error, nothing is written, the lease is still held, and
	// the error is returned. Errors: ErrFenced, ErrConflict (apply read
	// data that changed before the commit), ErrInvalidResult,
	// ErrInvalidArgument, ErrClosed, ErrFailed, or an I/O error.
	Complete(ctx context.Context, l Lease, r Result, apply func(Effects) error) error

	// Release removes the claim because the operation provably had no
	// effect; a retry runs anew. In the same atomic commit, fenced on the
	// lease's token like the release itself, it applies the writes that
	// apply (if non-nil) makes to Effects: the attempt's compensations,
	// such as giving back what it held, so that an attempt that has lost
	// its lease can give back nothing the live one still uses. If apply
	// returns an error, nothing is written, the lease is still held, and
	// the error is returned. Errors: ErrFenced, ErrInvalidArgument,
	// ErrConflict, ErrClosed, ErrFailed, or an I/O error.
	Release(ctx context.Context, l Lease, apply func(Effects) error) error

	// MarkUncertain durably records that the operation's outcome is
	// unknown. Retries see Reconciling until Resolve. Errors as Release.
	MarkUncertain(ctx context.Context, l Lease, note string) error

	// Renew extends a lease by d from now (zero d: the default lease) if
	// its token is still current, and returns the renewed lease. A remote
	// claim's renewal is durable before Renew returns, so that after a
	// crash the record still says until when its holder could call
	// downstream. Errors as Release.
	Renew(ctx context.Context, l Lease, d time.Duration) (Lease, error)

	// Resolve settles an uncertain or abandoned record (see
	// ResolveRequest). Errors: ErrNotFound, ErrWrongState (completed, or
	// in progress under a live lease), ErrFenced (token is not current),
	// ErrInvalidResult, ErrInvalidArgument, ErrClosed, ErrFailed, or an
	// I/O error.
	Resolve(ctx context.Context, req ResolveRequest) error

	// Escalate marks an uncertain or abandoned record escalated (see
	// EscalateRequest). Errors as Resolve.
	Escalate(ctx context.Context, req EscalateRequest) error

	// List pages through the records that need settling (see
	// ListRequest), found through an index written in the same commit as
	// each record, never by a scan of all records. Errors:
	// ErrInvalidScope (a malformed tenant), ErrInvalidArgument (a
	// malformed cursor or a negative limit), ErrClosed, or an I/O error.
	List(ctx context.Context, req ListRequest) (ListPage, error)

	// Get returns the live record for id, including one held in progress.
	// Errors: ErrNotFound, ErrInvalidKey, ErrInvalidScope, ErrClosed, or an
	// I/O error.
	Get(ctx context.Context, id ID) (Record, error)

	// Close releases the store. Operations after Close return ErrClosed.
	Close() error
}
