package pgstore

import (
	"context"
	"fmt"
	"time"
)

// CheckReport is what Check found: counts of what is stored, and every
// broken invariant.
type CheckReport struct {
	// Records counts the stored records, by state; Expired counts the
	// completed ones past their expiry that the sweeper has not yet
	// deleted.
	Records    int `json:"records"`
	InProgress int `json:"in_progress"`
	Uncertain  int `json:"uncertain"`
	Completed  int `json:"completed"`
	Expired    int `json:"expired"`
	// Effects counts the values written through Effects; EffectsPaired
	// those whose writer's outcome is stored, EffectsStandalone those
	// written by Update. The rest outlived their writer's record (swept
	// or evicted): a value keeps only its writer's token, not the
	// record's expiry, so Check cannot tell them from values whose record
	// was lost, as the engine's check does.
	Effects           int `json:"effects"`
	EffectsPaired     int `json:"effects_paired"`
	EffectsStandalone int `json:"effects_standalone"`
	// Events counts the outbox's events not yet acknowledged (Unsequenced
	// of them not yet numbered); OutboxAcked and OutboxLast are its
	// cursor.
	Events      int    `json:"events"`
	Unsequenced int    `json:"unsequenced"`
	OutboxAcked uint64 `json:"outbox_acked"`
	OutboxLast  uint64 `json:"outbox_last"`
	// ProblemCount counts the broken invariants; Problems describes them.
	ProblemCount int      `json:"problem_count"`
	Problems     []string `json:"problems,omitempty"`
}

// checks are the invariants Check verifies: each query counts the rows
// that break one.
var checks = []struct{ what, query string }{
	{"records in no known state or mode", `SELECT count(*) FROM idemkv_records WHERE state NOT IN (1, 2, 3) OR mode NOT IN (0, 1)`},
	{"records in progress without a lease, or settled with one", `SELECT count(*) FROM idemkv_records
		WHERE (state = 1) <> (lease_expires IS NOT NULL)`},
	{"records with no token or attempt, or a token the sequence has not issued", `SELECT count(*) FROM idemkv_records
		WHERE token <= 0 OR attempt < 1 OR token > (SELECT last_value FROM pg_sequences
			WHERE schemaname = current_schema() AND sequencename = 'idemkv_tokens')`}, // (readable with USAGE alone)
	{"remote records without an operation id", `SELECT count(*) FROM idemkv_records
		WHERE mode = 1 AND (operation_id IS NULL OR octet_length(operation_id) <> 16)`},
	{"escalated records that are not uncertain", `SELECT count(*) FROM idemkv_records WHERE escalated AND state <> 2`},
	{"completed records with a status out of range", `SELECT count(*) FROM idemkv_records WHERE state = 3 AND (status < 0 OR status > 65535)`},
	{"effects written under the token of a record that has no outcome", `SELECT count(*) FROM idemkv_data d
		JOIN idemkv_records r ON r.token = d.token WHERE r.state <> 3`},
	{"acknowledged events still in the outbox", `SELECT count(*) FROM idemkv_outbox
		WHERE seq <= (SELECT acked FROM idemkv_outbox_cursor WHERE id = 1)`},
	{"gaps in the outbox's numbering", `SELECT (SELECT last - acked FROM idemkv_outbox_cursor WHERE id = 1)
		- (SELECT count(*) FROM idemkv_outbox WHERE seq IS NOT NULL)`},
	{"events numbered past the cursor", `SELECT count(*) FROM idemkv_outbox
		WHERE seq > (SELECT last FROM idemkv_outbox_cursor WHERE id = 1)`},
	{"events out of their entity's order", `SELECT count(*) FROM (
		SELECT entity_seq, lag(entity_seq) OVER (PARTITION BY topic, entity ORDER BY seq) AS prev
		FROM idemkv_outbox WHERE seq IS NOT NULL) x WHERE prev IS NOT NULL AND entity_seq <> prev + 1`},
	{"events past their entity's last sequence", `SELECT count(*) FROM idemkv_outbox o
		LEFT JOIN idemkv_entities n ON n.topic = o.topic AND n.entity = o.entity
		WHERE o.seq IS NOT NULL AND (n.seq IS NULL OR o.entity_seq IS NULL OR o.entity_seq > n.seq)`},
}

// Check reads the whole store and verifies its invariants: the records'
// states, effects never stored without their outcome, and the outbox's
// numbering and entity order. It reads while other processes write: run
// it on a quiet store for an exact answer.
func (s *Store) Check(ctx context.Context) (CheckReport, error) {
	var r CheckReport
	if err := s.open(); err != nil {
		return r, err
	}
	err := s.pool.QueryRow(ctx, `SELECT
		count(*),
		count(*) FILTER (WHERE state = 1),
		count(*) FILTER (WHERE state = 2),
		count(*) FILTER (WHERE state = 3),
		count(*) FILTER (WHERE state = 3 AND expires <= $1)
		FROM idemkv_records`, s.now()).Scan(&r.Records, &r.InProgress, &r.Uncertain, &r.Completed, &r.Expired)
	if err != nil {
		return r, s.dbErr("check", err)
	}
	err = s.pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM idemkv_data),
		(SELECT count(*) FROM idemkv_data d JOIN idemkv_records r ON r.token = d.token AND r.state = 3),
		(SELECT count(*) FROM idemkv_data WHERE token = 0),
		(SELECT count(*) FROM idemkv_outbox),
		(SELECT count(*) FROM idemkv_outbox WHERE seq IS NULL),
		acked, last FROM idemkv_outbox_cursor WHERE id = 1`).Scan(&r.Effects, &r.EffectsPaired, &r.EffectsStandalone,
		&r.Events, &r.Unsequenced, &r.OutboxAcked, &r.OutboxLast)
	if err != nil {
		return r, s.dbErr("check", err)
	}
	for _, c := range checks {
		var n int64
		if err := s.pool.QueryRow(ctx, c.query).Scan(&n); err != nil {
			return r, s.dbErr("check: "+c.what, err)
		}
		if n != 0 {
			r.ProblemCount++
			r.Problems = append(r.Problems, fmt.Sprintf("%s: %d", c.what, n))
		}
	}
	return r, nil
}

// Unsettled counts the records that await settling, read along the index
// List pages through (cheap while they are few, as they should be).
type Unsettled struct {
	// Uncertain records not escalated, and escalated ones.
	Uncertain, Escalated int
	// Abandoned: remote records in progress past their lease.
	Abandoned int
	// Oldest is when the oldest of them was created (zero if none).
	Oldest time.Time
}

// Unsettled reads the counts of the records that await settling.
func (s *Store) Unsettled(ctx context.Context) (Unsettled, error) {
	var u Unsettled
	if err := s.open(); err != nil {
		return u, err
	}
	var oldest *time.Time
	err := s.pool.QueryRow(ctx, `SELECT
		count(*) FILTER (WHERE state = 2 AND NOT escalated),
		count(*) FILTER (WHERE escalated),
		count(*) FILTER (WHERE state = 1 AND lease_expires <= $1),
		min(created) FILTER (WHERE state = 2 OR lease_expires <= $1)
		FROM idemkv_records WHERE state = 2 OR (state = 1 AND mode = 1)`, s.now()).Scan(&u.Uncertain, &u.Escalated, &u.Abandoned, &oldest)
	if err != nil {
		return u, s.dbErr("unsettled", err)
	}
	if oldest != nil {
		u.Oldest = oldest.UTC()
	}
	return u, nil
}
