package engine

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	"github.com/cockroachdb/pebble/v2"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine/internal/record"
)

// MaxCheckProblems bounds the problems a CheckReport lists; the rest are
// only counted.
const MaxCheckProblems = 1000

// CheckProblem is one broken invariant found by Check.
type CheckProblem struct {
	// Key names the entry: "tenant/endpoint/key" for a record, the hex
	// of the raw key otherwise.
	Key string `json:"key"`
	// What says which invariant it breaks.
	What string `json:"what"`
}

func (p CheckProblem) String() string { return p.Key + ": " + p.What }

// CheckReport is what Check found.
type CheckReport struct {
	// Epoch is the stored epoch: every token was issued in it or before.
	Epoch uint64 `json:"epoch"`
	// Records counts the stored records, by state; Expired counts the
	// completed ones past their expiry that the sweeper has not yet
	// deleted.
	Records    int `json:"records"`
	InProgress int `json:"in_progress"`
	Uncertain  int `json:"uncertain"`
	Completed  int `json:"completed"`
	Expired    int `json:"expired"`
	// Effects counts the values written through Effects. EffectsPaired
	// counts those whose outcome is still stored and counts them;
	// EffectsExpired those whose outcome has expired (and may have been
	// swept); EffectsStandalone those written by Engine.Update, outside
	// any outcome. Every other value is a problem.
	Effects           int `json:"effects"`
	EffectsPaired     int `json:"effects_paired"`
	EffectsExpired    int `json:"effects_expired"`
	EffectsStandalone int `json:"effects_standalone"`
	// Pending counts the entries of the pending index (records that may
	// need settling; List reads it).
	Pending int `json:"pending"`
	// Events counts the outbox's events not yet acknowledged, and
	// OutboxAcked is its cursor: the sequence of the last event a relay
	// acknowledged.
	Events      int    `json:"events"`
	OutboxAcked uint64 `json:"outbox_acked"`
	// Superseded counts completed records some of whose effects are no
	// longer stored under their stamp: a later operation overwrote or
	// deleted them. Check cannot tell those from effects that were lost;
	// a record with more effects stored than it counts is a problem.
	Superseded int `json:"superseded"`
	// EvictedOutcomes counts the marks of evicted outcomes that counted
	// effects (Engine.Evict): their effects are paired with the mark.
	EvictedOutcomes int `json:"evicted_outcomes"`
	// Layout says whether the layout marker is stored (a store only lacks
	// it before its first Open that writes).
	Layout bool `json:"layout"`
	// Secret says whether the store's secret is stored (a store in layout
	// 4 has none).
	Secret bool `json:"secret"`
	// SweepCursor says whether a sweep pass is under way (its position is
	// stored).
	SweepCursor bool `json:"sweep_cursor"`
	// Passes is how many times Check read the store to pair effects with
	// outcomes: more than one when pairing needed more than
	// Options.CheckMemory. (Problems that name a record by its token cost
	// one more read of the record keys.)
	Passes int `json:"passes"`
	// Problems lists the first MaxCheckProblems broken invariants;
	// ProblemCount counts them all. A store is sound when it is zero.
	Problems     []CheckProblem `json:"problems"`
	ProblemCount int            `json:"problem_count"`
}

func (r *CheckReport) add(key, format string, args ...any) {
	r.ProblemCount++
	if len(r.Problems) < MaxCheckProblems {
		r.Problems = append(r.Problems, CheckProblem{Key: key, What: fmt.Sprintf(format, args...)})
	}
}

// Check reads the whole store and verifies the invariants the engine keeps
// on disk:
//
//   - every key is in a known namespace; the metadata holds only the
//     layout marker (record.Layout, or 4 or 5 on a store opened
//     read-only in that layout), the epoch (8 bytes), the store's secret
//     (32 bytes; a marked store in layout 5 or later has one), the sweeper's position (a record
//     key), the clock's mark and the marks of evicted outcomes;
//   - every record key decodes to a valid ID and encodes back to itself;
//   - every record decodes (the codec itself refuses unknown states and
//     flags, results on records that are not completed, and fields beyond
//     the contract's limits), with a token issued in the stored epoch or
//     before, an attempt of at least 1 and a valid fingerprint;
//   - a record in progress on disk is a remote claim (local claims are
//     never written) with an operation id, as is every remote record;
//   - the pending index holds exactly one entry for each unsettled record,
//     in the section its state calls for, and nothing else;
//   - every effect value carries a stamp (the token of the operation that
//     wrote it and its outcome's expiry) naming a completed record with
//     that expiry which counts effects, or an outcome that has expired;
//     no record holds more effects than it counts, and no two records
//     that effects can name share a token.
//
// An effect is paired with its outcome while the outcome is retained;
// after that, the stamp's expiry is all that vouches for it. A record some
// of whose effects a later operation overwrote or deleted cannot be told
// from one whose effects were lost: it is counted as Superseded, not
// reported. Deletes leave nothing to check. Pairing holds in memory about
// 48 bytes for each unsettled record and each completed one that wrote
// effects; past Options.CheckMemory, Check pairs the tokens a share at a
// time, one more pass over the snapshot for each share, and finds the
// same problems as one pass would. A store that fails an invariant is
// reported, not repaired. Check reads through the same Pebble snapshot
// from start to end; open the store read-only (Options.ReadOnly) to
// inspect one that no process is using.
// It fails only if the store cannot be read.
func (e *Engine) Check(ctx context.Context) (CheckReport, error) {
	if err := e.gate.enter(); err != nil {
		return CheckReport{}, err
	}
	defer e.gate.exit()
	snap := e.db.NewSnapshot()
	defer snap.Close()
	var r CheckReport
	now := e.clock.Now()

	epochKnown := false
	v, closer, err := snap.Get(epochKey)
	switch {
	case errors.Is(err, pebble.ErrNotFound):
	case err != nil:
		return CheckReport{}, fmt.Errorf("engine: check: %w", err)
	default:
		if len(v) != 8 {
			r.add(hex.EncodeToString(epochKey), "epoch is %d bytes, want 8", len(v))
		} else {
			r.Epoch, epochKnown = binary.BigEndian.Uint64(v), true
		}
		closer.Close()
	}

	// The first pass checks every entry and pairs the tokens of share 0.
	// While the pairings outgrow the budget, the number of shares doubles:
	// share 0 of 2n is part of share 0 of n, so what is kept stays
	// complete. Effects sort after records, so the number of shares is
	// final before the first effect is read. Passes 1 to n-1 then pair
	// shares 1 to n-1 and check nothing else.
	pc := &pairCheck{r: &r, now: now, shares: 1, pairs: make(map[uint64]pairing),
		budget: max(1, int(e.opts.CheckMemory/checkPairBytes))}
	if err := e.checkPass(ctx, snap, pc, epochKnown); err != nil {
		return CheckReport{}, err
	}
	pc.missingPending()
	r.Passes = 1
	for pc.share = 1; pc.share < pc.shares; pc.share++ {
		pc.pairs = make(map[uint64]pairing)
		if err := e.checkPass(ctx, snap, pc, epochKnown); err != nil {
			return CheckReport{}, err
		}
		r.Passes++
	}
	if err := pc.nameProblems(ctx, snap); err != nil {
		return CheckReport{}, err
	}
	if r.Records > 0 && !epochKnown && r.ProblemCount == 0 {
		r.add(hex.EncodeToString(epochKey), "records but no epoch")
	}
	if (r.Records > 0 || r.Effects > 0) && !r.Layout {
		r.add(hex.EncodeToString(layoutKey), "records or effects but no layout marker")
	}
	if r.Layout && e.layout > layoutWithoutSecret && !r.Secret {
		// Written with the marker: without it, the ids of new remote
		// records would no longer be the ones given before.
		r.add(hex.EncodeToString(secretKey), "layout %d but no secret", e.layout)
	}
	return r, nil
}

func (e *Engine) checkMeta(r *CheckReport, k, v []byte) {
	switch {
	case bytes.Equal(k, epochKey):
		// Read above.
	case bytes.Equal(k, layoutKey):
		r.Layout = true
		if len(v) != 8 || binary.BigEndian.Uint64(v) != e.layout {
			r.add(hex.EncodeToString(k), "layout marker %x, want layout %d", v, e.layout)
		}
	case bytes.Equal(k, secretKey):
		r.Secret = true
		if len(v) != record.SecretLen {
			r.add(hex.EncodeToString(k), "secret is %d bytes, want %d", len(v), record.SecretLen)
		}
	case bytes.Equal(k, clockKey):
		if len(v) != 8 {
			r.add(hex.EncodeToString(k), "clock mark is %d bytes, want 8", len(v))
		}
	case bytes.Equal(k, sweepKey):
		r.SweepCursor = true
		if err := checkSweepCursor(v); err != nil {
			r.add(hex.EncodeToString(k), "%v", err)
		}
	default:
		r.add(hex.EncodeToString(k), "unknown metadata key")
	}
}

// storedRecordID decodes the ID of a record stored under k, a record key
// or an expiry key.
func storedRecordID(k []byte) (idemkv.ID, error) {
	if len(k) > 0 && k[0] == nsExpiry {
		_, _, _, rk, err := record.SplitExpiryKey(k)
		if err != nil {
			return idemkv.ID{}, err
		}
		k = rk
	}
	return decodeRecordKey(k)
}

func recordName(id idemkv.ID) string { return id.Tenant + "/" + id.Endpoint + "/" + id.Key }

func effectName(k []byte) string { return "data " + strconv.Quote(string(k[1:])) }

// checkPass reads the snapshot once. The first pass (share 0) checks
// every entry; the others only pair their share, and check the effects
// and events that name it.
func (e *Engine) checkPass(ctx context.Context, snap *pebble.Snapshot, pc *pairCheck, epochKnown bool) error {
	// Records before effects, for pairing: the expiry namespace sorts
	// after the data namespace, so it is read out of key order.
	dataStart, dataEnd := []byte{nsData}, []byte{nsData + 1}
	spans := [][2][]byte{{nil, dataStart}, {expiryStart, expiryEnd}, {dataStart, dataEnd}, {expiryEnd, nil}}
	if pc.share > 0 {
		spans = [][2][]byte{{record.EvictedPrefix, prefixEnd(record.EvictedPrefix)}, {recordStart, recordEnd}, {expiryStart, expiryEnd},
			{dataStart, dataEnd}, {record.OutboxEventPrefix, prefixEnd(record.OutboxEventPrefix)}}
	}
	for _, span := range spans {
		if err := e.checkSpan(ctx, snap, pc, epochKnown, &pebble.IterOptions{LowerBound: span[0], UpperBound: span[1]}); err != nil {
			return err
		}
	}
	pc.settle()
	return nil
}

// checkSpan is checkPass over the entries within o's bounds.
func (e *Engine) checkSpan(ctx context.Context, snap *pebble.Snapshot, pc *pairCheck, epochKnown bool, o *pebble.IterOptions) error {
	return scanSnapshot(ctx, snap, o, func(it *pebble.Iterator) error {
		k := it.Key()
		if pc.share > 0 {
			// Only pairing: every problem of an entry was reported by the
			// first pass, which skipped pairing the same entries.
			switch {
			case bytes.HasPrefix(k, record.EvictedPrefix):
				v, err := it.ValueAndErr()
				if err != nil {
					return fmt.Errorf("engine: check: %w", err)
				}
				if tok, exp, n, err := record.SplitEvicted(k, v); err == nil {
					pc.addEvicted(tok, exp, n)
				}
			case k[0] == nsRecord || k[0] == nsExpiry:
				v, err := it.ValueAndErr()
				if err != nil {
					return fmt.Errorf("engine: check: %w", err)
				}
				rec, err := record.Decode(v)
				if err != nil || !pc.mine(rec.Token) {
					return nil
				}
				if id, err := storedRecordID(k); err == nil {
					pc.addRecord(id, &rec)
				}
			case k[0] == nsData:
				v, err := it.ValueAndErr()
				if err != nil {
					return fmt.Errorf("engine: check: %w", err)
				}
				if tok, exp, _, err := record.SplitStamp(v); err == nil && !exp.IsZero() {
					pc.addEffect(k, tok, exp)
				}
			case bytes.HasPrefix(k, record.OutboxEventPrefix):
				v, err := it.ValueAndErr()
				if err != nil {
					return fmt.Errorf("engine: check: %w", err)
				}
				pc.pairEvent(k, v)
			}
			return nil
		}
		val, err := it.ValueAndErr()
		if err != nil {
			return fmt.Errorf("engine: check: %w", err)
		}
		r := pc.r
		switch {
		case len(k) == 0:
			r.add("", "empty key")
		case bytes.HasPrefix(k, record.EvictedPrefix):
			tok, exp, n, err := record.SplitEvicted(k, val)
			if err != nil {
				r.add(hex.EncodeToString(k), "%v", err)
				return nil
			}
			r.EvictedOutcomes++
			pc.addEvicted(tok, exp, n)
		case k[0] == nsMeta:
			e.checkMeta(r, k, val)
		case k[0] == nsRecord || k[0] == nsExpiry:
			e.checkRecord(pc, k, val, epochKnown)
		case k[0] == nsData:
			checkEffect(pc, k, val)
		case k[0] == nsPending:
			pc.checkPending(k, val)
		case k[0] == record.NSOutbox:
			pc.checkOutbox(k, val)
		default:
			r.add(hex.EncodeToString(k), "key in unknown namespace %#x", k[0])
		}
		return nil
	})
}

// scanSnapshot calls fn for each entry of snap within o's bounds, and
// stops at fn's first error or when ctx ends.
func scanSnapshot(ctx context.Context, snap *pebble.Snapshot, o *pebble.IterOptions, fn func(*pebble.Iterator) error) error {
	it, err := snap.NewIter(o)
	if err != nil {
		return fmt.Errorf("engine: check: %w", err)
	}
	defer it.Close()
	n := 0
	for valid := it.First(); valid; valid = it.Next() {
		if n++; n%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		if err := fn(it); err != nil {
			return err
		}
	}
	if err := it.Error(); err != nil {
		return fmt.Errorf("engine: check: %w", err)
	}
	return nil
}

// checkEffect checks one value in the data namespace: it must carry a
// stamp, which pairing then follows to its record.
func checkEffect(pc *pairCheck, k, v []byte) {
	pc.r.Effects++
	tok, exp, _, err := record.SplitStamp(v)
	if err != nil {
		pc.r.add(effectName(k), "%v", err)
		return
	}
	if exp.IsZero() {
		pc.r.EffectsStandalone++
		return
	}
	pc.addEffect(k, tok, exp)
}
func (e *Engine) checkRecord(pc *pairCheck, k, v []byte, epochKnown bool) {
	r, now := pc.r, pc.now
	r.Records++
	rk, name := k, hex.EncodeToString(k)
	var (
		class  string
		end    uint64
		bucket bool
	)
	if k[0] == nsExpiry {
		var err error
		if _, class, end, rk, err = record.SplitExpiryKey(k); err != nil {
			r.add(name, "expiry key does not decode: %v", err)
			return
		}
		bucket = true
	}
	id, err := decodeRecordKey(rk)
	if err != nil {
		r.add(name, "record key does not decode: %v", err)
		return
	}
	name = recordName(id)
	if err := id.Validate(); err != nil {
		r.add(name, "record key names an invalid ID: %v", err)
	}
	if !bytes.Equal(appendRecordKey(nil, id), rk) {
		r.add(name, "record key does not encode back to itself")
	}
	rec, err := record.Decode(v)
	if err != nil {
		r.add(name, "record does not decode: %v", err)
		return
	}
	switch {
	case bucket && rec.State != idemkv.StateCompleted:
		r.add(name, "a record %s is in an expiry bucket (only completed records are)", rec.State)
	case bucket && rec.Class != class:
		r.add(name, "record of class %q is in a bucket of class %q", rec.Class, class)
	case bucket && uint64(rec.Expires.Unix()) > end:
		r.add(name, "record expires at %d, after its bucket ends at %d", rec.Expires.Unix(), end)
	case bucket && now.Before(rec.Expires) && pc.liveTwice(rk, rec.Expires):
		r.add(name, "a completed record is in an expiry bucket, and an unsettled one created before it expired is under its record key")
	case !bucket && rec.State == idemkv.StateCompleted:
		r.add(name, "a completed record is under its record key, not in an expiry bucket")
	case !bucket:
		pc.expectPending(k, &rec)
	}
	switch rec.State {
	case idemkv.StateInProgress:
		r.InProgress++
		if rec.Mode != idemkv.ModeRemote {
			r.add(name, "a local claim is in progress on disk (local claims are never written)")
		}
	case idemkv.StateUncertain:
		r.Uncertain++
	case idemkv.StateCompleted:
		r.Completed++
		if !now.Before(rec.Expires) {
			r.Expired++
		}
	}
	if rec.Token == 0 {
		r.add(name, "token is zero")
	} else if epochKnown && rec.Token>>tokenSeqBits > r.Epoch {
		r.add(name, "token %d is from epoch %d, after the stored epoch %d", rec.Token, rec.Token>>tokenSeqBits, r.Epoch)
	}
	if rec.Attempt < 1 {
		r.add(name, "attempt is %d", rec.Attempt)
	}
	if err := idemkv.ValidateFingerprint(rec.Fingerprint); err != nil {
		r.add(name, "%v", err)
	}
	if rec.Mode == idemkv.ModeRemote && rec.OperationID.IsZero() && (e.secret == nil || e.layout < record.Layout) {
		// In layout 6 the id is derived under the secret (engine/opid.go).
		r.add(name, "remote record without an operation id")
	}
	pc.addRecord(id, &rec)
}
