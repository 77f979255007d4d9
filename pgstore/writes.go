package pgstore

import (
	"fmt"
	"time"
)

// The statements that commit an outcome (or a resolution, or an Update)
// together with an operation's writes and events. Each is one statement
// of CTEs: "rec" changes the record (a compare-and-set on its token), and
// the writes and events happen only if it changed a row, so a fenced
// holder writes nothing. Each comes in four variants (writeSQL): with or
// without the CTEs that number and store events, and with or without the
// DELETE of data keys; most operations need neither.
//
// Parameters: $1 to $5 are the data writes' (writeArgs.args): the keys
// set and their values, the writer's token, the keys deleted, and the
// commit's time; the record's own follow from $6; the events' five
// arrays come last.

// dataSQL writes the business data, stamped with the writer's token
// (token: an SQL expression). Without deletes, the DELETE is left out:
// even with an empty array it was a tenth of a small statement's cost,
// and most operations delete nothing. Its parameter keeps its place, in a
// CTE that is never run.
func dataSQL(token string, deletes bool) string {
	dels := `
dels AS (SELECT $4::bytea[])`
	if deletes {
		dels = `
dels AS (
	DELETE FROM idemkv_data WHERE k = ANY($4::bytea[]) AND EXISTS (SELECT 1 FROM rec)
)`
	}
	return `
sets AS (
	INSERT INTO idemkv_data (k, v, token)
	SELECT k, v, ` + token + ` FROM unnest($1::bytea[], $2::bytea[]) AS u(k, v)
	WHERE EXISTS (SELECT 1 FROM rec)
	ON CONFLICT (k) DO UPDATE SET v = excluded.v, token = excluded.token
),` + dels
}

// eventsSQL stores the events, whose five arrays (topics, entity keys,
// payloads, headers, ids) are the parameters from first. It ends in a
// CTE: the statement's own SELECT follows (countsSQL, for most).
//
// The events go in under one batch id, without their Seq and EntitySeq:
// the sequencer gives both once they are visible (outbox.go), so that a
// commit writes no row another commit writes too (an entity's counter),
// and two operations emitting events of one entity never conflict.
func eventsSQL(first int) string {
	return fmt.Sprintf(`,
ev AS (
	SELECT e.topic, e.entity, e.payload, e.headers, e.event_id, e.ord
	FROM unnest($%d::text[], $%d::text[], $%d::bytea[], $%d::bytea[], $%d::text[])
		WITH ORDINALITY AS e(topic, entity, payload, headers, event_id, ord)
	WHERE EXISTS (SELECT 1 FROM rec)
),
batch AS (
	SELECT nextval('idemkv_event_ids') AS id WHERE EXISTS (SELECT 1 FROM ev)
),
evs AS (
	INSERT INTO idemkv_outbox (batch, ord, event_id, topic, entity, payload, headers, created)
	SELECT batch.id, ev.ord, ev.event_id, ev.topic, ev.entity, ev.payload, ev.headers, $5::timestamptz
	FROM ev, batch
	RETURNING 1
)`,
		first, first+1, first+2, first+3, first+4)
}

// The SELECTs that end a write statement: the rows the record changed
// (one or none), the events stored, and the watchers notified (a
// SELECT's CTE runs only if the statement reads it); leanCountsSQL ends
// the variant without events, with the same columns.
const (
	countsSQL = `
SELECT (SELECT count(*) FROM rec), (SELECT count(*) FROM evs), (SELECT count(*) FROM woke)`
	leanCountsSQL = `
SELECT (SELECT count(*) FROM rec), 0::bigint, (SELECT count(*) FROM woke)`
)

// noNotifySQL is the "woke" CTE of a write that wakes no watcher. Other
// processes' relays hear of a commit's events from the notifier, after
// the commit (announceEvents), never from the commit itself.
const noNotifySQL = `SELECT 1 WHERE false`

// writeSQL is one write statement's variants, by whether the writes
// carry events and deletes: [events][deletes].
type writeSQL [2][2]string

// newWriteSQL builds the variants of a statement whose "rec" CTE is rec
// and takes record parameters $6 to $(5+recParams); woke is its "woke"
// CTE, settledSQL if rec settles a record that can be watched (and then
// returns its waiters and token), or else noNotifySQL.
func newWriteSQL(rec string, recParams int, woke string) writeSQL {
	return buildWriteSQL("WITH rec AS ("+rec+"),\nwoke AS ("+woke+"),", "$3::bigint", func(events bool) string {
		if events {
			return eventsSQL(6+recParams) + countsSQL
		}
		return leanCountsSQL
	})
}

// buildWriteSQL builds the variants of head, then dataSQL with token, then
// tail(events).
func buildWriteSQL(head, token string, tail func(events bool) string) writeSQL {
	var w writeSQL
	for ev := range 2 {
		for del := range 2 {
			w[ev][del] = head + dataSQL(token, del == 1) + tail(ev == 1)
		}
	}
	return w
}

// pick returns the variant for a's writes.
func (w *writeSQL) pick(a *writeArgs) string {
	return w[b2i(len(a.topics) > 0)][b2i(len(a.delKeys) > 0)]
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// args returns a statement's parameters: the data writes', the record's
// (record), and the events' if there are any.
func (a *writeArgs) args(token uint64, now time.Time, record ...any) []any {
	args := append([]any{a.setKeys, a.setVals, int64(token), a.delKeys, now}, record...)
	if len(a.topics) > 0 {
		args = append(args, a.topics, a.entities, a.payloads, a.headers, a.eventIDs)
	}
	return args
}
