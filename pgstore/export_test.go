package pgstore

// MigrateTo brings a database's schema to an earlier version, as an
// earlier release left it.
var MigrateTo = migrateTo
