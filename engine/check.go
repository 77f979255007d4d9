package engine

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/record"
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
	// swept). Every other value is a problem.
	Effects        int `json:"effects"`
	EffectsPaired  int `json:"effects_paired"`
	EffectsExpired int `json:"effects_expired"`
	// Superseded counts completed records some of whose effects are no
	// longer stored under their stamp: a later operation overwrote or
	// deleted them. Check cannot tell those from effects that were lost;
	// a record with more effects stored than it counts is a problem.
	Superseded int `json:"superseded"`
	// Layout says whether the layout marker is stored (a store only lacks
	// it before its first Open that writes).
	Layout bool `json:"layout"`
	// SweepCursor says whether a sweep pass is under way (its position is
	// stored).
	SweepCursor bool `json:"sweep_cursor"`
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
//     layout marker (record.Layout), the epoch (8 bytes) and the sweeper's
//     position (a record key);
//   - every record key decodes to a valid ID and encodes back to itself;
//   - every record decodes (the codec itself refuses unknown states and
//     flags, results on records that are not completed, and fields beyond
//     the contract's limits), with a token issued in the stored epoch or
//     before, an attempt of at least 1 and a valid fingerprint;
//   - a record in progress on disk is a remote claim (local claims are
//     never written) with an operation id, as is every remote record;
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
// 200 bytes (with the record's name) for each unsettled record and each
// completed one that wrote effects. A store that fails an invariant is
// reported, not repaired. Check reads through the same Pebble snapshot
// from start to end; open the store read-only (Options.ReadOnly) to
// inspect one that no process is using.
// It fails only if the store cannot be read.
func (e *Engine) Check(ctx context.Context) (CheckReport, error) {
	if err := e.enter(); err != nil {
		return CheckReport{}, err
	}
	defer e.exit()
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

	it, err := snap.NewIter(nil)
	if err != nil {
		return CheckReport{}, fmt.Errorf("engine: check: %w", err)
	}
	defer it.Close()
	pairs := make(map[uint64]*pairing)
	n := 0
	for valid := it.First(); valid; valid = it.Next() {
		if n++; n%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return CheckReport{}, err
			}
		}
		k := it.Key()
		val, err := it.ValueAndErr()
		if err != nil {
			return CheckReport{}, fmt.Errorf("engine: check: %w", err)
		}
		switch {
		case len(k) == 0:
			r.add("", "empty key")
		case k[0] == nsMeta:
			e.checkMeta(&r, k, val)
		case k[0] == nsRecord:
			e.checkRecord(&r, k, val, now, epochKnown, pairs)
		case k[0] == nsData:
			checkEffect(&r, k, val, now, pairs)
		default:
			r.add(hex.EncodeToString(k), "key in unknown namespace %#x", k[0])
		}
	}
	if err := it.Error(); err != nil {
		return CheckReport{}, fmt.Errorf("engine: check: %w", err)
	}
	for _, p := range pairs {
		switch {
		case p.found > p.want:
			r.add(p.name, "%d effects carry its token %d, but it counts %d", p.found, p.token, p.want)
		case p.found < p.want:
			r.Superseded++
		}
	}
	if r.Records > 0 && !epochKnown && r.ProblemCount == 0 {
		r.add(hex.EncodeToString(epochKey), "records but no epoch")
	}
	if (r.Records > 0 || r.Effects > 0) && !r.Layout {
		r.add(hex.EncodeToString(layoutKey), "records or effects but no layout marker")
	}
	return r, nil
}

func (e *Engine) checkMeta(r *CheckReport, k, v []byte) {
	switch {
	case bytes.Equal(k, epochKey):
		// Read above.
	case bytes.Equal(k, layoutKey):
		r.Layout = true
		if len(v) != 8 || binary.BigEndian.Uint64(v) != record.Layout {
			r.add(hex.EncodeToString(k), "layout marker %x, want layout %d", v, record.Layout)
		}
	case bytes.Equal(k, sweepKey):
		r.SweepCursor = true
		if _, err := decodeRecordKey(v); err != nil {
			r.add(hex.EncodeToString(k), "sweeper position is not a record key: %v", err)
		}
	default:
		r.add(hex.EncodeToString(k), "unknown metadata key")
	}
}

// pairing is what Check knows of a record that effects may name by its
// token: every unsettled record and every completed one that counts
// effects.
type pairing struct {
	name        string
	token       uint64
	state       idemkv.State
	expires     time.Time
	want, found int
}

// checkEffect checks one value in the data namespace against the records
// read before it (the record namespace sorts first): its stamp must name a
// completed record that counts it, or an outcome that has expired.
func checkEffect(r *CheckReport, k, v []byte, now time.Time, pairs map[uint64]*pairing) {
	r.Effects++
	name := "data " + strconv.Quote(string(k[1:]))
	tok, exp, _, err := record.SplitStamp(v)
	if err != nil {
		r.add(name, "%v", err)
		return
	}
	p := pairs[tok]
	switch {
	case p == nil && now.Before(exp):
		r.add(name, "written by token %d, whose outcome (retained until %s) is not stored", tok, exp.UTC().Format(time.RFC3339))
	case p == nil:
		r.EffectsExpired++
	case p.state != idemkv.StateCompleted:
		r.add(name, "written by token %d, whose record %s is %s", tok, p.name, p.state)
	case !p.expires.Equal(exp):
		r.add(name, "stamped with expiry %s, but its record %s expires %s", exp.UTC().Format(time.RFC3339), p.name, p.expires.UTC().Format(time.RFC3339))
	default:
		p.found++
		r.EffectsPaired++
	}
}

func (e *Engine) checkRecord(r *CheckReport, k, v []byte, now time.Time, epochKnown bool, pairs map[uint64]*pairing) {
	r.Records++
	id, err := decodeRecordKey(k)
	name := hex.EncodeToString(k)
	if err != nil {
		r.add(name, "record key does not decode: %v", err)
		return
	}
	name = id.Tenant + "/" + id.Endpoint + "/" + id.Key
	if err := id.Validate(); err != nil {
		r.add(name, "record key names an invalid ID: %v", err)
	}
	if !bytes.Equal(appendRecordKey(nil, id), k) {
		r.add(name, "record key does not encode back to itself")
	}
	rec, err := record.Decode(v)
	if err != nil {
		r.add(name, "record does not decode: %v", err)
		return
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
	if rec.Mode == idemkv.ModeRemote && rec.OperationID.IsZero() {
		r.add(name, "remote record without an operation id")
	}
	if rec.Effects > 0 || rec.State != idemkv.StateCompleted {
		if prev := pairs[rec.Token]; prev != nil {
			r.add(name, "token %d is also the token of %s", rec.Token, prev.name)
			return
		}
		pairs[rec.Token] = &pairing{name: name, token: rec.Token, state: rec.State, expires: rec.Expires, want: rec.Effects}
	}
}
