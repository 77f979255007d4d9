package pgstore

import (
	"context"
	"strconv"
	"sync"

	"github.com/idemkv/idemkv"
)

// Waiting across processes (idemkv.Watcher). A duplicate that finds its
// key held by another process counts itself in the record's waiters
// (watchSQL), and the statement that settles a record held under a token
// notifies idemkv_settled with that token when its waiters are more than
// none (settledSQL). Every store listens on idemkv_settled on the
// connection its outbox listens on, and wakes its watchers of the token.
//
// The count and the settling statement meet on the record's row: the
// count waits for a settling statement that holds the row's lock and
// then counts nothing (the token or the state changed), so the watcher
// learns at once that the attempt has settled; a count that commits first
// is seen by the settling statement, which notifies. A commit that
// notifies queues on a lock every notifying commit takes, which is why
// settling a record nobody waits for notifies nobody.

// watchSQL counts a waiter of the attempt holding $1-$3 under token $4.
const watchSQL = `UPDATE idemkv_records SET waiters = waiters + 1
	WHERE tenant = $1 AND endpoint = $2 AND key = $3 AND token = $4 AND state = 1`

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
	tag, err := s.pool.Exec(ctx, watchSQL, id.Tenant, id.Endpoint, id.Key, int64(token))
	if err != nil {
		stop()
		return nil, nil, s.dbErr("watch", err)
	}
	if tag.RowsAffected() == 0 {
		s.watches.wake(token) // settled already, or held under another token
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
