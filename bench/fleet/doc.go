// Package fleet measures the PostgreSQL store (package pgstore) on the
// unique workload against a naive SQL baseline on the same server, with
// the Pebble engine beside them, and the bytes each keeps per completed
// key (`idemkv bench postgres`, docs/benchmarks.md).
//
// The unique workload: every request a new key, claimed in local mode, a
// 16-byte effect, completed with a status and a pointer. Closed-loop
// clients run it against each store in turn, for the same time, point by
// point, alternating which goes first.
//
// The naive baseline is what a service writes by hand without idemkv's
// design: insert the key if absent, then write the effect, then mark the
// record completed, each statement its own transaction (so its effect
// and outcome do not even commit together), on tables of the same shape.
// Beside it, the same request without an effect is measured by pgstore
// (RunLocal, and Claim and Complete) and by a baseline of two statements,
// a claim's INSERT ... ON CONFLICT DO NOTHING and a completion's UPDATE:
// the least a hand-written service does.
package fleet
