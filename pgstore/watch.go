package pgstore

import (
	"context"
	"strconv"
	"sync"

	"github.com/idemkv/idemkv"
)

// Waiting across processes (idemkv.Watcher). A duplicate that finds its
// key held by another process marks the record as waited for (waiters,
// 0 or 1: watchSQL), and the statement that settles a record held under a
// token notifies idemkv_settled with that token when it is marked
// (settledSQL). Every store listens on idemkv_settled on the connection
// its outbox listens on, and wakes its watchers of the token.
//
// The mark and the settling statement meet on the record's row: a mark
// waits for a settling statement that holds the row's lock and then marks
// nothing (the token or the state changed), so the watcher learns at once
// that the attempt has settled; a mark that commits first is seen by the
// settling statement, which notifies. A watcher that finds the record
// marked already writes nothing and waits: the mark it saw was committed
// before its statement began, so the settling statement sees it too. A
// commit that notifies queues on a lock every notifying commit takes,
// which is why settling a record nobody waits for notifies nobody.
//
// Only settling notifies. A takeover, an eviction or an operator's
// resolve of an attempt in progress can happen only once its lease has
// run out by the store's clock, and a watcher waits no longer than that
// (the InProgress claim's RetryAfter): by then it claims again and meets
// whatever came next, so a notification would wake it no sooner. (With
// Options.Clock set to each process's own clock, a takeover can come
// early by the clocks' skew, and the watcher learns of it that late.)
//
// Only the first watcher of an attempt writes its row: a completion that
// read business data runs SERIALIZABLE, and fails to serialize if its
// record's row changes under it, so a count that every duplicate raised
// would let a flood of duplicates fail the completion again and again.
// The mark costs it at most one run (TestWaitersCannotStarveACompletion).

// watchSQL marks the attempt holding $1-$3 under token $4 as waited for,
// unless it is already, and answers whether the attempt is still held
// and marked. The second EXISTS reads the statement's snapshot, not the
// mark: true there means a mark committed before this statement began.
const watchSQL = `WITH mark AS (
	UPDATE idemkv_records SET waiters = 1
	WHERE tenant = $1 AND endpoint = $2 AND key = $3 AND token = $4 AND state = 1 AND waiters = 0
	RETURNING 1)
SELECT EXISTS (SELECT 1 FROM mark) OR EXISTS (SELECT 1 FROM idemkv_records
	WHERE tenant = $1 AND endpoint = $2 AND key = $3 AND token = $4 AND state = 1 AND waiters > 0)`

// settledSQL is the "woke" CTE of a statement whose "rec" CTE settles a
// record and returns its waiters and token.
const settledSQL = `SELECT pg_notify('idemkv_settled', token::text) FROM rec WHERE waiters > 0`

// wakeSQL is a statement that runs upd, an UPDATE that settles a record
// and returns its waiters and token, and wakes its watchers (woke:
// settledSQL, or noNotifySQL without LISTEN). It returns the rows upd
// changed and the notifications sent.
func wakeSQL(upd, woke string) string {
	return "WITH rec AS (" + upd + "), woke AS (" + woke + `)
SELECT (SELECT count(*) FROM rec), (SELECT count(*) FROM woke)`
}

// watchers are this store's watches, by token, and whether its listener
// is listening: a watch made while it is not could miss its notification.
type watchers struct {
	mu        sync.Mutex
	listening bool
	byToken   map[uint64]*watch
}

// watch is the watches of one token: closing settled wakes them all.
type watch struct {
	settled chan struct{}
	n       int // watches not yet stopped
}

// Watch implements idemkv.Watcher. It fails with idemkv.ErrCannotWatch
// when the store has no listener (Options.NoListen) or its listener's
// connection is down: a notification sent meanwhile would be lost.
func (s *Store) Watch(ctx context.Context, id idemkv.ID, token uint64) (<-chan struct{}, func(), error) {
	if err := validateID(id); err != nil {
		return nil, nil, err
	}
	if err := s.open(); err != nil {
		return nil, nil, err
	}
	w, err := s.watches.add(token)
	if err != nil {
		return nil, nil, err
	}
	stop := func() { s.watches.remove(token, w) }
	var held bool
	if err := s.pool.QueryRow(ctx, watchSQL, id.Tenant, id.Endpoint, id.Key, int64(token)).Scan(&held); err != nil {
		stop()
		return nil, nil, s.dbErr("watch", err)
	}
	if !held {
		// Settled already, held under another token, or marked by a
		// watcher whose mark this statement did not see: the caller claims
		// again, and watches again if it must.
		s.watches.wake(token)
	}
	return w.settled, stop, nil
}

// add registers a watch of token.
func (ws *watchers) add(token uint64) (*watch, error) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if !ws.listening {
		return nil, idemkv.ErrCannotWatch
	}
	w := ws.byToken[token]
	if w == nil {
		w = &watch{settled: make(chan struct{})}
		if ws.byToken == nil {
			ws.byToken = make(map[uint64]*watch)
		}
		ws.byToken[token] = w
	}
	w.n++
	return w, nil
}

// remove ends one watch of token made by add, which returned w.
func (ws *watchers) remove(token uint64, w *watch) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	w.n--
	if w.n == 0 && ws.byToken[token] == w {
		delete(ws.byToken, token)
	}
}

// wake wakes the watches of token.
func (ws *watchers) wake(token uint64) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if w := ws.byToken[token]; w != nil {
		close(w.settled)
		delete(ws.byToken, token)
	}
}

// wakePayload wakes the watches of the token a notification names.
func (ws *watchers) wakePayload(payload string) {
	if token, err := strconv.ParseUint(payload, 10, 64); err == nil {
		ws.wake(token)
	}
}

// setListening records whether the listener listens. Either way every
// watch is woken: one that started listening missed nothing, but one that
// stops may have missed a notification, and its watchers claim again.
func (ws *watchers) setListening(on bool) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.listening = on
	for t, w := range ws.byToken {
		close(w.settled)
		delete(ws.byToken, t)
	}
}
