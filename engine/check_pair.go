package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine/internal/record"
)

// Check's pairing of effects with the outcomes whose tokens they carry,
// in shares of the tokens when the pairings outgrow Options.CheckMemory.

// checkPairBytes is what one pairing costs in memory, map overhead
// included, for Options.CheckMemory.
const checkPairBytes = 48

// maxCheckShares bounds the passes of Check. Tokens issued by the engine
// split evenly into shares; only a corrupt store's could need more, and
// Check then goes over its memory budget rather than reading the store
// more often (or dividing by a zero that a doubling past 2^63 would give).
const maxCheckShares = 1 << 12

// pairCheck pairs effects with the records whose tokens they carry, one
// share of the tokens per pass: the tokens t with t%shares == share.
type pairCheck struct {
	r      *CheckReport
	now    time.Time
	budget int // pairings a pass may hold
	shares uint64
	share  uint64
	pairs  map[uint64]pairing
	// dups are the records that repeat a token, found in the first pass
	// but reported only for share 0 (later passes find the others again).
	dups []dupToken
	// named are the problems that name a record by token; the record's
	// name is filled in at the end (nameProblems), so that a pairing need
	// not hold it.
	named []namedProblem
	// pending is the pending-index entries the unsettled records call for,
	// by key, with the state byte each must hold (check_pending.go).
	pending map[string]byte
	// unsettled are the record keys of the unsettled records, which sort
	// before the expiry buckets, with their creation times: a completed
	// record there must not share one created before it expired
	// (check_pending.go).
	unsettled map[string]time.Time
	// outbox follows the outbox's keys through the scan (check_outbox.go).
	outbox outboxCheck
}

// pairing is what Check knows of a record that effects may name by its
// token: every unsettled record and every completed one that counts
// effects. The key is kept elsewhere, so that memory stays small.
type pairing struct {
	state   idemkv.State
	expires int64 // Unix seconds, as stored
	want    uint32
	found   uint32
}

type dupToken struct {
	token uint64
	name  string
}

// namedProblem is a problem whose text names the record holding token with
// %[1]s, filled in by nameProblems.
type namedProblem struct {
	key    string
	token  uint64
	format string
}

func (pc *pairCheck) mine(token uint64) bool { return token%pc.shares == pc.share }

// addEvicted pairs the mark of an evicted outcome that counted effects:
// they stay, and are paired with it as with a completed record.
func (pc *pairCheck) addEvicted(token uint64, expires int64, effects uint32) {
	if !pc.mine(token) {
		return
	}
	name := fmt.Sprintf("the evicted outcome of token %d", token)
	if _, dup := pc.pairs[token]; dup {
		if pc.share == 0 {
			pc.dups = append(pc.dups, dupToken{token, name})
		} else {
			pc.named = append(pc.named, namedProblem{name, token, dupFormat})
		}
		return
	}
	pc.pairs[token] = pairing{state: idemkv.StateCompleted, expires: expires, want: effects}
}

// addRecord pairs a record that effects may name, and in the first pass
// narrows the share when the pairings outgrow the budget.
func (pc *pairCheck) addRecord(id idemkv.ID, rec *idemkv.Record) {
	if rec.Effects == 0 && rec.State == idemkv.StateCompleted || !pc.mine(rec.Token) {
		return
	}
	if _, dup := pc.pairs[rec.Token]; dup {
		if pc.share == 0 {
			pc.dups = append(pc.dups, dupToken{rec.Token, recordName(id)})
		} else {
			pc.named = append(pc.named, namedProblem{recordName(id), rec.Token, dupFormat})
		}
		return
	}
	pc.pairs[rec.Token] = pairing{state: rec.State, expires: rec.Expires.Unix(), want: uint32(rec.Effects)}
	for len(pc.pairs) > pc.budget && pc.share == 0 && pc.shares < maxCheckShares {
		pc.shares *= 2
		for t := range pc.pairs {
			if !pc.mine(t) {
				delete(pc.pairs, t)
			}
		}
	}
}

// addEffect pairs the effect under key k, stamped with token and expiry
// exp.
func (pc *pairCheck) addEffect(k []byte, token uint64, exp time.Time) {
	if !pc.mine(token) {
		return
	}
	pc.flushDups()
	r := pc.r
	p, ok := pc.pairs[token]
	switch {
	case !ok && pc.now.Before(exp):
		r.add(effectName(k), "written by token %d, whose outcome (retained until %s) is not stored", token, exp.UTC().Format(time.RFC3339))
	case !ok:
		r.EffectsExpired++
	case p.state != idemkv.StateCompleted:
		pc.named = append(pc.named, namedProblem{effectName(k), token, "written by token %[2]d, whose record %[1]s is " + p.state.String()})
	case p.expires != exp.Unix():
		pc.named = append(pc.named, namedProblem{effectName(k), token, "stamped with expiry " + exp.UTC().Format(time.RFC3339) +
			", but its record %[1]s expires " + time.Unix(p.expires, 0).UTC().Format(time.RFC3339)})
	default:
		p.found++
		pc.pairs[token] = p
		r.EffectsPaired++
	}
}

// settle ends a pass: a record with more effects than it counts is a
// problem, one with fewer was superseded.
func (pc *pairCheck) settle() {
	pc.flushDups()
	pc.endOutbox()
	for t, p := range pc.pairs {
		switch {
		case p.found > p.want:
			pc.named = append(pc.named, namedProblem{"", t, fmt.Sprintf("%d effects carry its token %%[2]d, but it counts %d", p.found, p.want)})
		case p.found < p.want:
			pc.r.Superseded++
		}
	}
}

// flushDups reports, once the shares are final (at the first effect or
// the end of the first pass), the repeated tokens of share 0.
func (pc *pairCheck) flushDups() {
	for _, d := range pc.dups {
		if pc.mine(d.token) {
			pc.named = append(pc.named, namedProblem{d.name, d.token, dupFormat})
		}
	}
	pc.dups = nil
}

const dupFormat = "token %[2]d is also the token of %[1]s"

// nameProblems reports the problems that name a record by its token,
// reading the record keys once more to find the names: the first record
// in key order that effects may name, as pairing kept.
func (pc *pairCheck) nameProblems(ctx context.Context, snap *pebble.Snapshot) error {
	if len(pc.named) == 0 {
		return nil
	}
	names := make(map[uint64]string, len(pc.named))
	for _, np := range pc.named {
		names[np.token] = ""
	}
	err := scanSnapshot(ctx, snap, &pebble.IterOptions{LowerBound: recordStart, UpperBound: expiryEnd},
		func(it *pebble.Iterator) error {
			if k := it.Key(); k[0] == nsData {
				return nil
			}
			if id, rec, ok := pairable(it); ok {
				if have, want := names[rec.Token]; want && have == "" {
					names[rec.Token] = recordName(id)
				}
			}
			return nil
		})
	if err != nil {
		return err
	}
	for _, np := range pc.named {
		key := np.key
		if key == "" {
			key = names[np.token]
		}
		pc.r.add(key, np.format, names[np.token], np.token)
	}
	return nil
}

// pairable decodes the record at it, if it is one effects may name.
func pairable(it *pebble.Iterator) (id idemkv.ID, rec idemkv.Record, ok bool) {
	v, err := it.ValueAndErr()
	if err != nil {
		return id, rec, false
	}
	if rec, err = record.Decode(v); err != nil || rec.Effects == 0 && rec.State == idemkv.StateCompleted {
		return id, rec, false
	}
	if id, err = storedRecordID(it.Key()); err != nil {
		return id, rec, false
	}
	return id, rec, true
}
