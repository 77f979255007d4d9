package pgstore

import "time"

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
