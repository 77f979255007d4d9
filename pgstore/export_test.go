package pgstore

import (
	"time"

	"github.com/idemkv/idemkv"
)

// MigrateTo brings a database's schema to an earlier version, as an
// earlier release left it.
var MigrateTo = migrateTo

// Secret returns the store's secret, as read at Open.
func Secret(s *Store) []byte { return s.secret }

// WithLocalSkew returns a copy of o whose process clock, under the
// database's, runs skew ahead of this machine's (behind if negative): a
// process of the fleet whose wall clock is wrong.
func WithLocalSkew(o *Options, skew time.Duration) *Options {
	c := *o
	c.local = func() time.Time { return time.Now().Add(skew) }
	return &c
}

// WithReadCommittedData makes o's store write data keys that read nothing
// at READ COMMITTED, outside the serializable check (the gap
// serial.go closes).
func WithReadCommittedData(o *Options) *Options {
	o.readCommittedData = true
	return o
}

// WithListenCheck makes o's listener check its connection after d
// without a notification (listenCheck).
func WithListenCheck(o *Options, d time.Duration) *Options {
	o.listenCheck = d
	return o
}

// PageStatements returns the statements (and their arguments) of a page
// of ScanDataAfter (after a key, within a prefix), of Scan (one tenant,
// after a cursor) and of List (one tenant, after a cursor).
func PageStatements(now time.Time) (sqls [3]string, args [3][]any) {
	qs := [3]pageStmt{
		scanDataStmt([]byte("p/0001"), []byte("p0"), true),
		scanStmt(&idemkv.ScanRequest{Tenant: "t"}, &[3]string{"t", "e", "k"}, now, 100),
		listStmt(&idemkv.ListRequest{Tenant: "t"}, &listCursor{Created: now.UnixMicro(), Tenant: "t", Endpoint: "e", Key: "k"}, now, 100),
	}
	for i, q := range qs {
		sqls[i], args[i] = q.sql, q.args
	}
	return sqls, args
}
