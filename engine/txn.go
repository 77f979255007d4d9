package engine

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine/internal/record"
)

// Transactions on business data: optimistic concurrency, checked in the
// committer. An apply function's reads remember the version (the token
// its value is stamped with, 0 for absent) of each data key they saw.
// When the writes are enqueued for commit, under the committer's mutex,
// every key read must still have that version, counting the writes of
// groups enqueued but not yet committed (committer.mu.pending); else the
// writes are refused with errConflict, nothing is written, and the caller
// runs the apply function again. Versions are tokens, unique for the
// life of the store, so a key rewritten since it was read never shows the
// version read (no ABA).
//
// Reads see those pending writes too. That is safe because groups commit
// in the order they are enqueued and no commit follows a failed one
// (failstop.go): a transaction that read a pending write commits in the
// same group as that write or a later one, so it is never durable without
// it. And it keeps a hot key moving: a run that read a pending value
// conflicts only with a write enqueued after its read, not with every
// write of the groups still committing, and its retry need not wait for
// them.
//
// The same mutex numbers the outbox: events get their sequence, and
// their entity's next sequence, in the order their writes are enqueued,
// which is the order groups commit in.

// maxConflictRuns bounds how many times one call runs an apply function
// whose reads conflict.
const maxConflictRuns = 16

// errConflict is the committer's refusal of writes whose reads are stale.
var errConflict = errors.New("engine: data read has changed")

// readVersion is a data key an apply function read and the version it
// saw (with its value, if it came from a pending group), or a key a
// transaction writes, the version it writes and its value (nil for a
// delete).
type readVersion struct {
	key     []byte
	token   uint64
	value   []byte
	pending bool
}

// txn is what the committer checks and numbers for one batch.
type txn struct {
	reads  []readVersion
	writes []readVersion
	// events are encoded events (record.AppendEvent), each with the
	// outbox key of its entity.
	events   [][]byte
	entities [][]byte
	// seqs are the entities' last sequences as prefetchEntities read
	// them, at epoch (entityseq.go).
	seqs  []uint64
	epoch uint64
}

// txn returns what the committer must check and number for the writes
// and events of w, committed with token at now; nil if none.
func (w *effectBuf) txn(token uint64, now time.Time) *txn {
	if len(w.reads) == 0 && len(w.ops) == 0 && len(w.events) == 0 {
		return nil
	}
	t := &txn{reads: w.reads}
	for _, op := range w.ops {
		wr := readVersion{key: dataKey(w.arena[op.key:op.keyEnd])}
		if op.val >= 0 {
			wr.token, wr.value = token, w.arena[op.val:op.valEnd]
		}
		t.writes = append(t.writes, wr)
	}
	for i := range w.events {
		ev := &w.events[i]
		var id [16]byte
		binary.BigEndian.PutUint64(id[:8], rand.Uint64())
		binary.BigEndian.PutUint64(id[8:], rand.Uint64())
		t.events = append(t.events, record.AppendEvent(make([]byte, 0, record.EventSize(ev)), ev, token, now, id))
		t.entities = append(t.entities, record.OutboxEntityKey(ev.Topic, ev.Key))
	}
	return t
}

// pendingWrite is the version and value a group not yet committed writes
// to a key (for an outbox entity key, the entity's last sequence, and no
// value).
type pendingWrite struct {
	version uint64
	value   []byte
	g       *commitGroup
}

// checkReadsLocked fails with errConflict if a key t read has changed.
// REQUIRES: c.mu held.
func (c *committer) checkReadsLocked(t *txn) error {
	for _, r := range t.reads {
		v, ok := c.mu.pending[string(r.key)]
		cur := v.version
		if !ok {
			var err error
			if cur, _, err = readStamped(c.db, r.key); err != nil {
				return err
			}
		}
		if cur != r.token {
			return errConflict
		}
	}
	return nil
}

// entitySeqsLocked returns the entity sequence each of t's events takes,
// after the last its entity has (committed, or pending in a group) and
// those of t's events before it. REQUIRES: c.mu held.
func (c *committer) entitySeqsLocked(t *txn) ([]uint64, error) {
	if len(t.events) == 0 {
		return nil, nil
	}
	seqs := make([]uint64, len(t.events))
	// The last sequence given to each entity of t so far: looked up
	// among t's earlier events while they are few (most commits emit one
	// or two), in a map past that.
	var last map[string]uint64
	if len(t.events) > smallEventCount {
		last = make(map[string]uint64, len(t.events))
	}
	for i := range t.events {
		n, seen := uint64(0), false
		if last != nil {
			n, seen = last[string(t.entities[i])]
		} else {
			for j := i - 1; j >= 0 && !seen; j-- {
				if bytes.Equal(t.entities[j], t.entities[i]) {
					n, seen = seqs[j], true
				}
			}
		}
		if !seen {
			var err error
			if n, err = c.entitySeqLocked(t, i); err != nil {
				return nil, err
			}
		}
		seqs[i] = n + 1
		if last != nil {
			last[string(t.entities[i])] = n + 1
		}
	}
	return seqs, nil
}

// smallEventCount is the most events a commit numbers without a map.
const smallEventCount = 8

// addLocked records t's writes as pending in g, and adds t's events to
// g's batch, numbered seqs (entitySeqsLocked). REQUIRES: c.mu held; g
// open.
func (c *committer) addLocked(g *commitGroup, t *txn, seqs []uint64) error {
	for _, w := range t.writes {
		c.pendLocked(g, w.key, w.token, w.value)
	}
	for i, ev := range t.events {
		ek := t.entities[i]
		n := seqs[i]
		if n == 1 {
			c.entityFilter.add(ek) // before any later prefetch looks for it
		}
		binary.BigEndian.PutUint64(ev[record.EventEntitySeqOffset:], n)
		c.pendLocked(g, ek, n, nil)
		if err := g.b.Set(ek, binary.BigEndian.AppendUint64(nil, n), nil); err != nil {
			return err
		}
		c.mu.outboxSeq++
		if err := g.b.Set(record.OutboxEventKey(c.mu.outboxSeq), ev, nil); err != nil {
			return err
		}
		g.events++
		g.lastEvent = c.mu.outboxSeq
	}
	return nil
}

func (c *committer) pendLocked(g *commitGroup, k []byte, v uint64, value []byte) {
	if c.mu.pending == nil {
		c.mu.pending = make(map[string]pendingWrite)
	}
	c.mu.pending[string(k)] = pendingWrite{version: v, value: value, g: g}
	g.keys = append(g.keys, string(k))
}

// pendingRead returns the version and value that a group not yet
// committed writes to the data key dk, if one does (version 0: it
// deletes dk). The value is shared: copy it.
func (c *committer) pendingRead(dk []byte) (uint64, []byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.mu.pending[string(dk)]
	return p.version, p.value, ok
}

// committedLocked forgets the pending writes of g, now committed and
// visible to reads. REQUIRES: c.mu held.
func (c *committer) committedLocked(g *commitGroup) {
	if g.events > 0 && g.err == nil {
		c.entitiesCommittedLocked(g)
	}
	for _, k := range g.keys {
		if p := c.mu.pending[k]; p.g == g {
			delete(c.mu.pending, k)
		}
	}
	if g.events > 0 && g.err == nil {
		c.mu.outboxCommitted = g.lastEvent
		select {
		case c.outboxReady <- struct{}{}:
		default:
		}
	}
}

// validateEvent checks an event against the contract's limits and the
// engine's (e nil: the defaults).
func validateEvent(ev *idemkv.Event, e *Engine) error {
	limit := idemkv.DefaultMaxEventSize
	if e != nil {
		limit = e.opts.MaxEventSize
	}
	if err := ev.Validate(); err != nil {
		return err
	}
	if n := record.EventSize(ev); n > limit {
		return fmt.Errorf("%w: event of %d bytes, limit %d (Options.MaxEventSize)", idemkv.ErrInvalidArgument, n, limit)
	}
	return nil
}
