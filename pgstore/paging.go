package pgstore

import (
	"strconv"
	"time"

	"github.com/idemkv/idemkv"
)

// pageStmt builds the statement of one page of a scan from the bounds the
// scan has, each a plain comparison with a parameter of its own. The
// store's connections force generic plans (plan_cache_mode), and a
// generic plan cannot turn a condition such as "$2 = ” OR tenant = $2"
// into a range of an index: each page would read the index from its start
// and filter, so a whole scan would read the table over and over.
type pageStmt struct {
	sql  string
	args []any
}

// arg adds v as the next parameter and returns its placeholder.
func (q *pageStmt) arg(v any) string {
	q.args = append(q.args, v)
	return "$" + strconv.Itoa(len(q.args))
}

// scanDataStmt is the page of data keys from lower (after it, if strict;
// empty: from the first) to before upper (nil: no bound).
func scanDataStmt(lower, upper []byte, strict bool) pageStmt {
	var q pageStmt
	op := ">="
	if strict {
		op = ">"
	}
	q.sql = `SELECT k, v FROM idemkv_data WHERE true`
	if len(lower) > 0 || strict {
		q.sql += ` AND k ` + op + ` ` + q.arg(lower)
	}
	if upper != nil {
		q.sql += ` AND k < ` + q.arg(upper)
	}
	q.sql += ` ORDER BY k LIMIT ` + q.arg(scanPage)
	return q
}

// scanStmt is a page of the live records in primary-key order, of
// req's tenant, state and age (each if set), after the cursor after (if
// set), at now.
func scanStmt(req *idemkv.ScanRequest, after *[3]string, now time.Time, limit int) pageStmt {
	var q pageStmt
	q.sql = `SELECT tenant, endpoint, key, ` + recordColumns + ` FROM idemkv_records
WHERE NOT (state = 3 AND expires <= ` + q.arg(now) + `)`
	if req.Tenant != "" {
		q.sql += ` AND tenant = ` + q.arg(req.Tenant)
	}
	if req.State != 0 {
		q.sql += ` AND state = ` + q.arg(int16(req.State))
	}
	if !req.CreatedBefore.IsZero() {
		q.sql += ` AND created < ` + q.arg(req.CreatedBefore)
	}
	if after != nil {
		q.sql += ` AND (tenant, endpoint, key) > (` + q.arg(after[0]) + `, ` + q.arg(after[1]) + `, ` + q.arg(after[2]) + `)`
	}
	q.sql += ` ORDER BY tenant, endpoint, key LIMIT ` + q.arg(limit)
	return q
}

// listStmt is a page of the records that need settling, along the index
// idemkv_records_unsettled: escalated or not as req says, of req's tenant
// (if set), after the cursor after (if set), at now.
func listStmt(req *idemkv.ListRequest, after *listCursor, now time.Time, limit int) pageStmt {
	var q pageStmt
	q.sql = `SELECT tenant, endpoint, key, ` + recordColumns + ` FROM idemkv_records
WHERE (state = 2 OR (state = 1 AND mode = 1)) AND escalated = ` + q.arg(req.Escalated) + `
	AND (state = 2 OR lease_expires <= ` + q.arg(now) + `)`
	if req.Tenant != "" {
		q.sql += ` AND tenant = ` + q.arg(req.Tenant)
	}
	if after != nil {
		q.sql += ` AND (created, tenant, endpoint, key) > (` + q.arg(time.UnixMicro(after.Created)) + `, ` +
			q.arg(after.Tenant) + `, ` + q.arg(after.Endpoint) + `, ` + q.arg(after.Key) + `)`
	}
	q.sql += ` ORDER BY escalated, created, tenant, endpoint, key LIMIT ` + q.arg(limit)
	return q
}
