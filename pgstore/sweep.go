package pgstore

import (
	"context"
	"time"

	"github.com/idemkv/idemkv/ttl"
)

// Expired records are absent to every read at once (each read checks the
// expiry); the sweeper gives their space back, deleting completed records
// past their expiry in chunks along the expiry index. PostgreSQL reuses
// the space once autovacuum has visited (docs/operations.md).

// SweepCursor implements ttl.Target. The store keeps no position: each
// chunk starts at the oldest expired record.
func (s *Store) SweepCursor() ([]byte, error) { return nil, nil }

// SweepChunk implements ttl.Target: it deletes up to n completed records
// expired at now, oldest expiry first. Unsettled records are never
// deleted. Next is non-nil while a chunk found n to delete.
func (s *Store) SweepChunk(ctx context.Context, _ []byte, n int, now time.Time) (ttl.Chunk, error) {
	if err := s.open(); err != nil {
		return ttl.Chunk{}, err
	}
	var c ttl.Chunk
	err := s.pool.QueryRow(ctx, `
WITH d AS (
	DELETE FROM idemkv_records
	WHERE (tenant, endpoint, key) IN (
		SELECT tenant, endpoint, key FROM idemkv_records
		WHERE state = 3 AND expires <= $1 ORDER BY expires LIMIT $2 FOR UPDATE SKIP LOCKED)
	AND state = 3 AND expires <= $1
	RETURNING octet_length(tenant) + octet_length(endpoint) + octet_length(key)
		+ octet_length(fingerprint) + coalesce(octet_length(body), 0) + octet_length(pointer) + 64 AS size
)
SELECT count(*), coalesce(sum(size), 0) FROM d`, now, n).Scan(&c.Deleted, &c.DeletedBytes)
	if err != nil {
		return ttl.Chunk{}, s.dbErr("sweep", err)
	}
	c.Examined = c.Deleted
	if c.Deleted == n {
		c.Next = []byte{1}
	}
	return c, nil
}

// Sweep runs one pass of the sweeper at once: every completed record
// expired now is deleted.
func (s *Store) Sweep(ctx context.Context) (ttl.Pass, error) {
	sw, err := ttl.New(s, &ttl.Options{Clock: s.opts.Clock, Rate: -1, ChunkSize: 1000})
	if err != nil {
		return ttl.Pass{}, err
	}
	return sw.Pass(ctx)
}
