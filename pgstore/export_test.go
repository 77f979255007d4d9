package pgstore

// MigrateTo brings a database's schema to an earlier version, as an
// earlier release left it.
var MigrateTo = migrateTo

// Secret returns the store's secret, as read at Open.
func Secret(s *Store) []byte { return s.secret }
