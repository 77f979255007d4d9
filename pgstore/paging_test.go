package pgstore_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv/pgstore"
)

// TestPagesAreIndexRanges: the generic plan of each statement that reads a
// page of a scan (the store's connections force generic plans) starts
// where the page starts, along an index: its bounds are the index
// condition, not a filter over the index from its start, which would make
// a whole scan read the table once per page.
func TestPagesAreIndexRanges(t *testing.T) {
	_, dsn := reviewStore(t, nil)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	for _, set := range []string{"SET plan_cache_mode = force_generic_plan", "SET enable_seqscan = off", "SET enable_bitmapscan = off"} {
		_, err := conn.Exec(ctx, set)
		require.NoError(t, err)
	}
	sqls, args := pgstore.PageStatements(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	for i, want := range [][]string{
		{"k > $1", "k < $2"},
		{"tenant = $2", "ROW(tenant, endpoint, key) > ROW($3, $4, $5)"},
		{"escalated = $1", "ROW(created, tenant, endpoint, key) > ROW($4, $5, $6, $7)"},
	} {
		name := fmt.Sprint("q", i)
		_, err := conn.Exec(ctx, "PREPARE "+name+" AS "+sqls[i])
		require.NoError(t, err, sqls[i])
		lits := make([]string, len(args[i]))
		for j, a := range args[i] {
			lits[j] = literal(a)
		}
		rows, err := conn.Query(ctx, "EXPLAIN EXECUTE "+name+"("+strings.Join(lits, ", ")+")")
		require.NoError(t, err)
		plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		cond := ""
		for _, line := range plan {
			if c, ok := strings.CutPrefix(strings.TrimLeft(line, " ->"), "Index Cond: "); ok {
				cond = c
			}
		}
		for _, w := range want {
			require.Contains(t, cond, w, "%s\n%s", strings.Join(plan, "\n"), sqls[i])
		}
	}
}

// literal spells v as an SQL literal.
func literal(v any) string {
	switch v := v.(type) {
	case string:
		return "'" + strings.ReplaceAll(v, "'", "''") + "'"
	case []byte:
		return fmt.Sprintf(`'\x%x'::bytea`, v)
	case time.Time:
		return "'" + v.Format(time.RFC3339Nano) + "'::timestamptz"
	}
	return fmt.Sprint(v)
}
