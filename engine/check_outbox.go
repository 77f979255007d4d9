package engine

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"

	"github.com/idemkv/idemkv"

	"github.com/idemkv/idemkv/engine/internal/record"
)

// outboxCheck follows the outbox through a check's scan, which meets the
// cursor (0x06 'c') first, then the events in sequence (0x06 'e'), then
// the entities' last sequences (0x06 'n').
type outboxCheck struct {
	// next is the sequence the next event must have: the events after
	// the cursor are contiguous (an ack deletes a prefix).
	next uint64
	// entities are the highest entity sequences the events carry, by
	// entity key; each entity's stored last sequence must reach it.
	entities map[string]uint64
}

// checkOutbox checks one key of the outbox: the cursor is never past an
// event still stored, events decode, are numbered without gaps, carry a
// token, and no entity's stored last sequence is behind its events.
func (pc *pairCheck) checkOutbox(k, v []byte) {
	r, oc := pc.r, &pc.outbox
	name := hex.EncodeToString(k)
	switch {
	case bytes.Equal(k, record.OutboxCursorKey):
		if len(v) != 8 {
			r.add(name, "outbox cursor is %d bytes, want 8", len(v))
			return
		}
		r.OutboxAcked = binary.BigEndian.Uint64(v)
	case bytes.HasPrefix(k, record.OutboxEventPrefix):
		r.Events++
		seq, err := record.OutboxEventSeq(k)
		if err != nil {
			r.add(name, "%v", err)
			return
		}
		switch {
		case seq <= r.OutboxAcked:
			r.add(name, "outbox event %d is still stored, but the cursor has acknowledged through %d", seq, r.OutboxAcked)
		case oc.next != 0 && seq != oc.next:
			r.add(name, "outbox event %d follows event %d: events %d to %d are missing", seq, oc.next-1, oc.next, seq-1)
		case oc.next == 0 && seq != r.OutboxAcked+1:
			r.add(name, "the first outbox event is %d, but the cursor is at %d: events %d to %d are missing", seq, r.OutboxAcked, r.OutboxAcked+1, seq-1)
		}
		oc.next = seq + 1
		ev, token, err := record.DecodeEvent(seq, v)
		if err != nil {
			r.add(name, "%v", err)
			return
		}
		pc.checkEventToken(name, seq, token)
		if oc.entities == nil {
			oc.entities = make(map[string]uint64)
		}
		ek := string(record.OutboxEntityKey(ev.Topic, ev.Key))
		oc.entities[ek] = max(oc.entities[ek], ev.EntitySeq)
	case len(k) > 2 && k[1] == 'n':
		if len(v) != 8 {
			r.add(name, "outbox entity sequence is %d bytes, want 8", len(v))
			return
		}
		if want := oc.entities[string(k)]; binary.BigEndian.Uint64(v) < want {
			r.add(name, "outbox entity's last sequence is %d, but an event carries %d", binary.BigEndian.Uint64(v), want)
		}
		delete(oc.entities, string(k))
	default:
		r.add(name, "unknown outbox key")
	}
}

// endOutbox reports, at the end of a pass, the entities whose events were
// met but whose last sequence was not: the next event of such an entity
// would be numbered from 1 again.
func (pc *pairCheck) endOutbox() {
	for _, ek := range slices.Sorted(maps.Keys(pc.outbox.entities)) {
		pc.r.add(hex.EncodeToString([]byte(ek)), "outbox events carry this entity's sequences up to %d, but its last sequence is not stored",
			pc.outbox.entities[ek])
	}
	pc.outbox.entities = nil
}

// checkEventToken checks the token of outbox event seq against the
// records paired in this pass: an event commits with its outcome, so its
// token never names a record still in progress or uncertain. (One whose
// record has expired, or was written by Update, names none.)
func (pc *pairCheck) checkEventToken(name string, seq, token uint64) {
	if p, ok := pc.pairs[token]; ok && p.state != idemkv.StateCompleted {
		pc.named = append(pc.named, namedProblem{name, token, "outbox event " + fmt.Sprint(seq) + " was emitted by token %[2]d, whose record %[1]s is " + p.state.String()})
	}
}

// pairEvent is checkEventToken for the passes after the first, which
// pair another share of the tokens and check the events naming them.
func (pc *pairCheck) pairEvent(k, v []byte) {
	seq, err := record.OutboxEventSeq(k)
	if err != nil {
		return // reported by the first pass
	}
	if _, token, err := record.DecodeEvent(seq, v); err == nil && token != 0 && pc.mine(token) {
		pc.checkEventToken(hex.EncodeToString(k), seq, token)
	}
}
