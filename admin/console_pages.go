package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/saga"
)

// The console's read-only pages. Each reads a bounded amount: a page of a
// listing, a record, the first events of the outbox; nothing loads every
// record.

// pendingCap bounds the unsettled records the overview counts.
const pendingCap = 10000

// overviewData is the overview page's, and overview.json's.
type overviewData struct {
	Now     time.Time      `json:"now"`
	Health  string         `json:"health"` // "ok", or why not
	Counts  *idemkv.Counts `json:"counts,omitempty"`
	Pending pendingSummary `json:"pending"`
	Outbox  *outboxSummary `json:"outbox,omitempty"`
	Stats   []statRow      `json:"-"`
}

// pendingSummary counts what awaits settling, up to pendingCap of each.
type pendingSummary struct {
	Abandoned int       `json:"abandoned"`
	Uncertain int       `json:"uncertain"`
	Escalated int       `json:"escalated"`
	More      bool      `json:"more,omitempty"` // a count reached pendingCap
	Oldest    time.Time `json:"oldest,omitzero"`
}

// outboxSummary is where the outbox stands.
type outboxSummary struct {
	Acked      uint64    `json:"acked"`
	Last       uint64    `json:"last"`
	LagEvents  uint64    `json:"lag_events"`
	LagSeconds float64   `json:"lag_seconds"`
	Oldest     time.Time `json:"oldest,omitzero"` // the oldest unpublished event's commit
}

type statRow struct{ Name, Value string }

// overviewFresh is how long the overview's figures are served again
// before they are read anew: every open overview polls every 2 s, and
// counting what awaits settling reads up to 20,000 records.
const overviewFresh = 2 * time.Second

// overviewData returns the overview's figures, read at most once every
// overviewFresh.
func (c *console) overviewData(ctx context.Context) (overviewData, error) {
	c.ovMu.Lock()
	defer c.ovMu.Unlock()
	if !c.ovAt.IsZero() && time.Since(c.ovAt) < overviewFresh {
		return c.ov, nil
	}
	d, err := c.readOverview(ctx)
	if err != nil {
		return d, err
	}
	c.ov, c.ovAt = d, time.Now()
	return d, nil
}

func (c *console) readOverview(ctx context.Context) (overviewData, error) {
	a := c.a
	d := overviewData{Now: a.o.Now(), Health: "ok"}
	if h, ok := a.store.(interface{ Health(context.Context) error }); ok {
		if err := h.Health(ctx); err != nil {
			d.Health = err.Error()
		}
	}
	if cs, ok := a.store.(interface{ Counts() idemkv.Counts }); ok {
		n := cs.Counts()
		d.Counts = &n
	}
	if err := c.countPending(ctx, &d.Pending); err != nil {
		return d, err
	}
	if ob, ok := a.store.(idemkv.Outbox); ok {
		s, err := outboxNow(ctx, ob, d.Now)
		if err != nil {
			return d, err
		}
		d.Outbox = &s
	}
	return d, nil
}

// countPending counts the records awaiting reconciliation and the
// escalated ones, oldest first, page by page.
func (c *console) countPending(ctx context.Context, p *pendingSummary) error {
	for _, escalated := range []bool{false, true} {
		req := idemkv.ListRequest{Escalated: escalated, Limit: 1000}
		n := 0
		for {
			page, err := c.a.store.List(ctx, req)
			if err != nil {
				return err
			}
			for _, r := range page.Records {
				switch {
				case escalated:
					p.Escalated++
				case r.State == idemkv.StateInProgress:
					p.Abandoned++
				default:
					p.Uncertain++
				}
				if p.Oldest.IsZero() || r.Created.Before(p.Oldest) {
					p.Oldest = r.Created
				}
			}
			n += len(page.Records)
			if page.Next == "" {
				break
			}
			if n >= pendingCap {
				p.More = true
				break
			}
			req.After = page.Next
		}
	}
	return nil
}

func outboxNow(ctx context.Context, ob idemkv.Outbox, now time.Time) (outboxSummary, error) {
	acked, last, err := ob.OutboxCursor(ctx)
	if err != nil {
		return outboxSummary{}, err
	}
	s := outboxSummary{Acked: acked, Last: last}
	if last > acked {
		s.LagEvents = last - acked
		evs, err := peekOutbox(ctx, ob, acked, 1)
		if err != nil {
			return outboxSummary{}, err
		}
		if len(evs) > 0 {
			s.Oldest = evs[0].Created
			s.LagSeconds = max(0, now.Sub(s.Oldest).Seconds())
		}
	}
	return s, nil
}

// outboxPeeker is an Outbox whose ReadOutbox does more than read
// (pgstore's holds the outbox for its relay, which stops the relays of
// other processes), and which can also just read.
type outboxPeeker interface {
	PeekOutbox(ctx context.Context, after uint64, limit int) ([]idemkv.StoredEvent, error)
}

// peekOutbox reads events without side effects on the relays.
func peekOutbox(ctx context.Context, ob idemkv.Outbox, after uint64, limit int) ([]idemkv.StoredEvent, error) {
	if p, ok := ob.(outboxPeeker); ok {
		return p.PeekOutbox(ctx, after, limit)
	}
	return ob.ReadOutbox(ctx, after, limit)
}

// flatten turns the store's figures (Options.Stats, any JSON) into rows.
func flatten(v any) []statRow {
	b, err := json.Marshal(v)
	if err != nil {
		return nil
	}
	var m any
	if json.Unmarshal(b, &m) != nil {
		return nil
	}
	var rows []statRow
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch x := v.(type) {
		case map[string]any:
			keys := make([]string, 0, len(x))
			for k := range x {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				name := k
				if prefix != "" {
					name = prefix + "." + k
				}
				walk(name, x[k])
			}
		case []any:
			b, _ := json.Marshal(x)
			rows = append(rows, statRow{prefix, string(b)})
		case float64:
			rows = append(rows, statRow{prefix, strconv.FormatFloat(x, 'f', -1, 64)})
		default:
			rows = append(rows, statRow{prefix, fmt.Sprint(x)})
		}
	}
	walk("", m)
	return rows
}

func (c *console) overview(w http.ResponseWriter, r *http.Request, sess session) {
	d, err := c.overviewData(r.Context())
	if err != nil {
		c.fail(w, r, sess, err)
		return
	}
	if c.a.o.Stats != nil {
		if st, err := c.a.o.Stats(r.Context()); err == nil {
			d.Stats = flatten(st)
		}
	}
	c.render(w, http.StatusOK, "overview", view{Title: "Overview", Nav: "overview", CSRF: sess.csrf, Body: d})
}

// overviewJSON is what the overview's script polls.
func (c *console) overviewJSON(w http.ResponseWriter, r *http.Request, _ session) {
	d, err := c.overviewData(r.Context())
	if err != nil {
		c.a.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, d)
}

// recordsData is the records page's.
type recordsData struct {
	Query   ListQuery
	States  []string
	Records []RecordView
	Next    string
	Error   string
	Listed  bool // a listing was asked for
}

func (c *console) records(w http.ResponseWriter, r *http.Request, sess session) {
	d := recordsData{States: States}
	q := r.URL.Query()
	if q.Has("list") {
		q.Del("list")
		d.Listed = true
		lq, err := ParseListQuery(q)
		d.Query = lq
		sc, ok := c.a.store.(idemkv.Scanner)
		switch {
		case err != nil:
			d.Error = err.Error()
		case !ok:
			d.Error = "this store cannot list records"
		default:
			if lq.Limit == 0 {
				lq.Limit = 50
			}
			page, err := List(r.Context(), sc, lq, c.a.o.Now())
			if err != nil {
				if p := problemFor(err); p.status >= 500 {
					c.fail(w, r, sess, err)
					return
				}
				d.Error = problemFor(err).detail
			}
			d.Records, d.Next = listViewOf(page.Records, page.Next).Records, page.Next
		}
	}
	c.render(w, http.StatusOK, "records", view{Title: "Records", Nav: "records", CSRF: sess.csrf, Body: d})
}

// recordData is the record page's.
type recordData struct {
	View      RecordView
	Steps     []stepKey
	History   []AuditEntry
	Actions   []string // what the confirm page may be asked for
	Done      string
	Unsettled bool
}

type stepKey struct{ Step, Key string }

// doneText says what an action did, for the page it returns to.
var doneText = map[string]string{
	"applied":   "Resolved as applied; the audit log has the entry.",
	"no-effect": "Resolved as having had no effect; the audit log has the entry.",
	"verify":    "The reconciler answered, and the record was settled as it said; the audit log has the entry.",
	"evict":     "Evicted; the audit log has the entry.",
}

// maxHashScan bounds the records a search by key hash reads.
const maxHashScan = 100000

func (c *console) record(w http.ResponseWriter, r *http.Request, sess session) {
	q := r.URL.Query()
	id := recordID(q)
	if h := q.Get("hash"); h != "" {
		found, err := c.findByHash(r.Context(), q.Get("tenant"), h)
		if err != nil {
			c.fail(w, r, sess, err)
			return
		}
		if found == nil {
			c.message(w, r, sess, http.StatusNotFound, "Not found",
				fmt.Sprintf("No record with key hash %s among the first %d records%s.", h, maxHashScan,
					map[bool]string{true: " of the tenant", false: "; give its tenant to search further"}[q.Get("tenant") != ""]))
			return
		}
		id = *found
	}
	if err := id.Validate(); err != nil {
		c.message(w, r, sess, http.StatusBadRequest, "Bad request", err.Error())
		return
	}
	rec, err := c.a.store.Get(r.Context(), id)
	if err != nil && !errors.Is(err, idemkv.ErrNotFound) {
		c.fail(w, r, sess, err)
		return
	}
	var history []AuditEntry
	if c.a.o.Audit != nil {
		if history, err = c.a.o.Audit.History(id); err != nil {
			c.fail(w, r, sess, err)
			return
		}
	}
	if rec.State == 0 {
		text := "No such record."
		if n := len(history); n > 0 {
			last := history[n-1]
			text = fmt.Sprintf("No such record. The audit log's last entry for its key: %s %s %s (%s): %s",
				last.Time.Format(time.RFC3339), last.Action, last.Phase, last.Outcome, last.Note)
		}
		c.message(w, r, sess, http.StatusNotFound, "Not found", text)
		return
	}
	d := recordData{View: ViewOf(&rec), History: history, Done: doneText[q.Get("done")]}
	if rec.Mode == idemkv.ModeRemote {
		for _, s := range c.a.o.Steps {
			d.Steps = append(d.Steps, stepKey{s, rec.OperationID.StepKey(s)})
		}
	}
	d.Unsettled = rec.State == idemkv.StateUncertain ||
		rec.State == idemkv.StateInProgress && rec.Mode == idemkv.ModeRemote && !c.a.o.Now().Before(rec.LeaseExpires)
	d.Actions = c.actions(&rec, d.Unsettled, c.a.o.Now())
	c.render(w, http.StatusOK, "record", view{Title: "Record", Nav: "records", CSRF: sess.csrf, Body: d})
}

// findByHash scans for the record whose key hash is hash (a tenant's, if
// given), up to maxHashScan records.
func (c *console) findByHash(ctx context.Context, tenant, hash string) (*idemkv.ID, error) {
	sc, ok := c.a.store.(idemkv.Scanner)
	if !ok {
		return nil, fmt.Errorf("%w: this store cannot list records, so it cannot search by hash", idemkv.ErrInvalidArgument)
	}
	req := idemkv.ScanRequest{Tenant: tenant, Limit: 1000}
	for n := 0; n < maxHashScan; {
		page, err := sc.Scan(ctx, req)
		if err != nil {
			return nil, err
		}
		for _, r := range page.Records {
			if r.ID.Hash() == hash {
				return &r.ID, nil
			}
		}
		n += len(page.Records)
		if page.Next == "" {
			break
		}
		req.After = page.Next
	}
	return nil, nil
}

// actions are the settling actions the record page offers: those the API
// would take, given what the service configured.
func (c *console) actions(rec *idemkv.Record, unsettled bool, now time.Time) []string {
	if c.a.o.Audit == nil {
		return nil
	}
	// A saga's records hold its outputs, not HTTP responses: an action's
	// is settled by the reconciler's answer or released, never with an
	// HTTP outcome typed here; the saga's own is taken over by its
	// runner, and is an operator's only once escalated.
	sagaRec := strings.HasPrefix(rec.ID.Endpoint, saga.EndpointPrefix)
	sagaOwn := sagaRec && !strings.Contains(strings.TrimPrefix(rec.ID.Endpoint, saga.EndpointPrefix), "/")
	if sagaOwn && !rec.Escalated {
		return nil
	}
	var acts []string
	if unsettled {
		if c.a.o.Reconciler != nil && !sagaOwn {
			acts = append(acts, "verify")
		}
		if !sagaRec {
			acts = append(acts, "applied")
		}
		acts = append(acts, "no-effect")
	}
	// Both stores evict an in-progress record only once it is abandoned:
	// a remote one whose lease ran out (a local one is taken over).
	held := rec.State == idemkv.StateInProgress && (rec.Mode != idemkv.ModeRemote || now.Before(rec.LeaseExpires))
	if _, ok := c.a.store.(idemkv.Evicter); ok && !held {
		acts = append(acts, "evict")
	}
	return acts
}

// unsettledData is the unsettled page's: a page of the queue.
type unsettledData struct {
	Escalated bool
	Tenant    string
	Records   []unsettledRow
	Next      string
	// Asks: the service said when its reconciler asks (NextQuestion).
	Asks bool
}

// unsettledRow is a record of the queue, with when the reconciler next
// asks about it.
type unsettledRow struct {
	RecordView
	Due      *time.Time // nil: at its next pass, or not (Asked)
	Unknowns int
	Asked    bool // the reconciler asks about it (a saga's steps are the saga's)
}

func (c *console) unsettled(w http.ResponseWriter, r *http.Request, sess session) {
	q := r.URL.Query()
	req := idemkv.ListRequest{Escalated: q.Get("escalated") == "true", Tenant: q.Get("tenant"), After: q.Get("after"), Limit: 50}
	page, err := c.a.store.List(r.Context(), req)
	if err != nil {
		c.fail(w, r, sess, err)
		return
	}
	d := unsettledData{Escalated: req.Escalated, Tenant: req.Tenant, Next: page.Next,
		Asks: c.a.o.NextQuestion != nil && !req.Escalated}
	for i := range page.Records {
		row := unsettledRow{RecordView: ViewOf(&page.Records[i])}
		if d.Asks {
			at, n, asks := c.a.o.NextQuestion(page.Records[i])
			if asks && !at.IsZero() {
				row.Due = &at
			}
			row.Unknowns, row.Asked = n, asks
		}
		d.Records = append(d.Records, row)
	}
	c.render(w, http.StatusOK, "unsettled", view{Title: "Unsettled", Nav: "unsettled", CSRF: sess.csrf, Body: d})
}

// outboxData is the outbox page's.
type outboxData struct {
	Summary   outboxSummary
	Topics    []statRow
	Events    []idemkv.StoredEvent
	Read      int  // unpublished events read for the topic counts
	More      bool // more than were read
	Positions []ConsumerPosition
	PosError  string
}

// outboxRead bounds the unpublished events the outbox page reads.
const outboxRead = 10000

func (c *console) outbox(w http.ResponseWriter, r *http.Request, sess session) {
	ob, ok := c.a.store.(idemkv.Outbox)
	if !ok {
		c.message(w, r, sess, http.StatusNotFound, "No outbox", "This store keeps no outbox.")
		return
	}
	s, err := outboxNow(r.Context(), ob, c.a.o.Now())
	if err != nil {
		c.fail(w, r, sess, err)
		return
	}
	d := outboxData{Summary: s}
	topics := map[string]int{}
	for after := s.Acked; d.Read < outboxRead; {
		evs, err := peekOutbox(r.Context(), ob, after, 1000)
		if err != nil {
			c.fail(w, r, sess, err)
			return
		}
		for _, ev := range evs {
			topics[ev.Topic]++
			if len(d.Events) < 20 {
				d.Events = append(d.Events, ev)
			}
		}
		d.Read += len(evs)
		if len(evs) < 1000 {
			break
		}
		after = evs[len(evs)-1].Seq
		d.More = d.Read >= outboxRead
	}
	for t, n := range topics {
		d.Topics = append(d.Topics, statRow{t, strconv.Itoa(n)})
	}
	slices.SortFunc(d.Topics, func(a, b statRow) int {
		if a.Name < b.Name {
			return -1
		}
		return 1
	})
	if c.a.o.Positions != nil {
		if d.Positions, err = c.a.o.Positions(r.Context()); err != nil {
			d.PosError = err.Error()
		}
	}
	c.render(w, http.StatusOK, "outbox", view{Title: "Outbox and inbox", Nav: "outbox", CSRF: sess.csrf, Body: d})
}
