package admin

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/idemkv/idemkv"
)

// ListQuery filters a listing of records in any state: GET
// /admin/v1/records and "idemkv list".
type ListQuery struct {
	// State is one of the States, or "" for every record.
	State string
	// Tenant, if set, lists only that tenant's records.
	Tenant string
	// OlderThan, if set, lists only records created longer ago.
	OlderThan time.Duration
	// After is the previous page's Next; Limit caps a page (0: 100, at
	// most 1000). A page may hold fewer records than Limit while Next is
	// set: the store bounds what one page reads.
	After string
	Limit int
}

// States are the states a listing can ask for. "uncertain" includes the
// escalated records and "in-progress" the abandoned ones.
var States = []string{"in-progress", "abandoned", "uncertain", "escalated", "completed"}

// ParseListQuery reads a ListQuery from a URL's query parameters: state,
// tenant, older_than (a Go duration, "36h"), after and limit.
func ParseListQuery(q url.Values) (ListQuery, error) {
	for name := range q {
		switch name {
		case "state", "tenant", "older_than", "after", "limit":
		default:
			// A misspelt filter must not list everything.
			return ListQuery{}, fmt.Errorf("%w: unknown parameter %q", idemkv.ErrInvalidArgument, name)
		}
	}
	lq := ListQuery{State: q.Get("state"), Tenant: q.Get("tenant"), After: q.Get("after")}
	if v := q.Get("older_than"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return ListQuery{}, fmt.Errorf("%w: older_than: want a duration such as 36h", idemkv.ErrInvalidArgument)
		}
		lq.OlderThan = d
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return ListQuery{}, fmt.Errorf("%w: limit: want 1 to 1000", idemkv.ErrInvalidArgument)
		}
		lq.Limit = n
	}
	return lq, lq.validate()
}

// Values is q as query parameters, for ParseListQuery.
func (q *ListQuery) Values() url.Values {
	v := url.Values{}
	set := func(name, value string) {
		if value != "" {
			v.Set(name, value)
		}
	}
	set("state", q.State)
	set("tenant", q.Tenant)
	set("after", q.After)
	if q.OlderThan > 0 {
		v.Set("older_than", q.OlderThan.String())
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	return v
}

func (q *ListQuery) validate() error {
	q.State = strings.ReplaceAll(q.State, "_", "-") // in_progress, as a JSON field would spell it
	if _, err := stateOf(q.State); err != nil {
		return err
	}
	if q.OlderThan < 0 || q.Limit < 0 || q.Limit > 1000 {
		return fmt.Errorf("%w: older_than must not be negative, limit 0 to 1000", idemkv.ErrInvalidArgument)
	}
	return nil
}

// stateOf is the store state a listing state scans.
func stateOf(s string) (idemkv.State, error) {
	switch s {
	case "":
		return 0, nil
	case "in-progress", "abandoned":
		return idemkv.StateInProgress, nil
	case "uncertain", "escalated":
		return idemkv.StateUncertain, nil
	case "completed":
		return idemkv.StateCompleted, nil
	}
	return 0, fmt.Errorf("%w: state %q: want one of %v", idemkv.ErrInvalidArgument, s, States)
}

// List returns a page of the records q asks for, as of now, from sc.
func List(ctx context.Context, sc idemkv.Scanner, q ListQuery, now time.Time) (idemkv.ScanPage, error) {
	if err := q.validate(); err != nil { // q is a copy: validate may respell its state
		return idemkv.ScanPage{}, err
	}
	state, _ := stateOf(q.State)
	req := idemkv.ScanRequest{Tenant: q.Tenant, State: state, After: q.After, Limit: q.Limit}
	if q.OlderThan > 0 {
		req.CreatedBefore = now.Add(-q.OlderThan)
	}
	page, err := sc.Scan(ctx, req)
	if err != nil {
		return idemkv.ScanPage{}, err
	}
	kept := page.Records[:0]
	for _, r := range page.Records {
		switch {
		case q.State == "abandoned" && (r.Mode != idemkv.ModeRemote || now.Before(r.LeaseExpires)):
		case q.State == "escalated" && !r.Escalated:
		default:
			kept = append(kept, r)
		}
	}
	page.Records = kept
	return page, nil
}

// records answers GET /admin/v1/records?state=S&tenant=T&older_than=D&after=C&limit=N.
func (a *api) records(w http.ResponseWriter, r *http.Request) {
	sc, ok := a.store.(idemkv.Scanner)
	if !ok {
		writeProblem(w, http.StatusNotFound, ProblemNotFound, "this store cannot list its records")
		return
	}
	q, err := ParseListQuery(r.URL.Query())
	if err != nil {
		writeProblem(w, http.StatusBadRequest, ProblemInvalidRequest, err.Error())
		return
	}
	page, err := List(r.Context(), sc, q, a.o.Now())
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, listViewOf(page.Records, page.Next))
}
