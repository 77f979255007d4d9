package admin

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/redact"
	"github.com/idemkv/idemkv/reconcile"
	"github.com/idemkv/idemkv/saga"
)

// The console's actions: each is asked for on a confirmation page, which
// names the record and its token and takes the operator's note, and made
// by a POST from it. They call what the API's endpoints call (Resolve,
// Evict), so they are refused by the same rules and audited the same
// way.

// actionLabel names each action.
var actionLabel = map[string]string{
	"verify":    "Ask the reconciler now",
	"applied":   "Resolve as applied",
	"no-effect": "Resolve as no effect",
	"evict":     "Evict",
}

// actionHelp says what each action does.
var actionHelp = map[string]string{
	"verify": "The service's reconciler asks the downstream what became of the operation. " +
		"If it can say, the record is settled as it says (a charge it confirms is recorded; one it denies is released); " +
		"if it cannot, nothing changes.",
	"applied": "You say the operation happened. The service writes what it writes when it settles one itself " +
		"(a payment is rebuilt from its intent), and retries get that outcome.",
	"no-effect": "You say the operation provably did not happen. What it held is given back and the record goes: " +
		"a retry runs it anew.",
	"evict": "The record goes, in any state but in progress under a live lease, and the next request with its key runs anew. " +
		"Use it for a record that must not be replayed.",
}

// confirmData is the confirmation page's.
type confirmData struct {
	Action, Label, Help string
	View                RecordView
	// Since is the moment the record is judged from (Record.LastCall), sent back
	// with the form so that a record that moved meanwhile is refused.
	Since string
}

func (c *console) confirm(w http.ResponseWriter, r *http.Request, sess session) {
	q := r.URL.Query()
	act := q.Get("action")
	if actionLabel[act] == "" {
		c.message(w, r, sess, http.StatusBadRequest, "Bad request", "No such action.")
		return
	}
	id := recordID(q)
	if err := id.Validate(); err != nil {
		c.message(w, r, sess, http.StatusBadRequest, "Bad request", err.Error())
		return
	}
	rec, err := c.a.store.Get(r.Context(), id)
	if err != nil {
		c.fail(w, r, sess, err)
		return
	}
	d := confirmData{Action: act, Label: actionLabel[act], Help: actionHelp[act], View: ViewOf(&rec)}
	if at := rec.LastCall(); !at.IsZero() {
		d.Since = at.Format(time.RFC3339Nano)
	}
	c.render(w, http.StatusOK, "confirm", view{Title: d.Label, Nav: "unsettled", CSRF: sess.csrf, Body: d})
}

// act makes a confirmed action and returns to the record's page.
func (c *console) act(w http.ResponseWriter, r *http.Request, sess session) {
	act := r.PostFormValue("action")
	id := recordID(r.PostForm)
	token, err := strconv.ParseUint(r.PostFormValue("token"), 10, 64)
	var since time.Time
	if err == nil && r.PostFormValue("since") != "" {
		since, err = time.Parse(time.RFC3339Nano, r.PostFormValue("since"))
	}
	if err != nil || actionLabel[act] == "" {
		c.message(w, r, sess, http.StatusBadRequest, "Bad request", "The form names no action or token, or a bad time.")
		return
	}
	note := r.PostFormValue("note")
	var entry AuditEntry
	switch act {
	case "evict":
		if _, ok := c.a.store.(idemkv.Evicter); !ok || c.a.o.Audit == nil {
			c.message(w, r, sess, http.StatusNotFound, "Not available", "Evicting needs an evicting store and an audit log.")
			return
		}
		entry, err = Evict(r.Context(), c.a.store, c.a.o.Audit, EvictRequest{
			Tenant: id.Tenant, Endpoint: id.Endpoint, Key: id.Key, Token: token, Since: since, Reason: note})
	case "verify":
		entry, err = c.verify(r.Context(), id, token, since, note)
	default:
		entry, err = c.resolve(r.Context(), ResolveRequest{Tenant: id.Tenant, Endpoint: id.Endpoint, Key: id.Key,
			Token: token, Since: since, NoEffect: act == "no-effect", Note: note})
	}
	if err != nil {
		if errors.Is(err, errUnknownAnswer) {
			c.message(w, r, sess, http.StatusOK, "Nothing changed", err.Error())
			return
		}
		c.a.logPanic(id, err)
		c.fail(w, r, sess, err)
		return
	}
	c.a.logWrite(entry)
	done := url.Values{"tenant": {id.Tenant}, "endpoint": {id.Endpoint}, "key": {id.Key}, "done": {act}}
	if act == "evict" {
		c.message(w, r, sess, http.StatusOK, "Evicted", doneText["evict"])
		return
	}
	http.Redirect(w, r, consolePath+"record?"+done.Encode(), http.StatusSeeOther)
}

// resolve is the API's resolve.
func (c *console) resolve(ctx context.Context, req ResolveRequest) (AuditEntry, error) {
	if c.a.o.Audit == nil {
		return AuditEntry{}, fmt.Errorf("%w: resolving needs an audit log (serve --admin-audit-log)", idemkv.ErrNotFound)
	}
	return Resolve(ctx, c.a.store, c.a.o.Audit, req,
		&ResolveOptions{Settler: c.a.o.Settler, Reconciler: c.a.o.Reconciler, Timeout: c.a.o.ResolveTimeout})
}

// errUnknownAnswer: the reconciler could not say; nothing was changed.
var errUnknownAnswer = errors.New("the reconciler could not say what became of the operation; nothing was changed")

// verify asks the reconciler, then resolves as it answered, verified (so
// the downstream is asked again, and a changed answer refuses it).
func (c *console) verify(ctx context.Context, id idemkv.ID, token uint64, since time.Time, note string) (AuditEntry, error) {
	if c.a.o.Reconciler == nil {
		return AuditEntry{}, ErrNoReconciler
	}
	rec, err := c.a.store.Get(ctx, id)
	if err != nil {
		return AuditEntry{}, err
	}
	if err := unmoved(&rec, token, since); err != nil {
		return AuditEntry{}, err
	}
	since = judgedSince(&rec, since) // the question is asked of the record as read
	ans, err := (&ResolveOptions{Reconciler: c.a.o.Reconciler, Timeout: c.a.o.ResolveTimeout}).orDefault().
		call(ctx, "the reconciler", func(ctx context.Context) (reconcile.Answer, error) { return c.a.o.Reconciler.Reconcile(ctx, rec) })
	switch {
	case errors.As(err, new(*PanicError)):
		return AuditEntry{}, err
	case err != nil:
		return AuditEntry{}, fmt.Errorf("%w (%v)", errUnknownAnswer, redact.Key(err.Error(), id.Key, id.Hash()))
	case ans.Verdict == reconcile.Applied, ans.Verdict == reconcile.NotApplied:
	default:
		return AuditEntry{}, fmt.Errorf("%w (%s)", errUnknownAnswer, ans.Reason)
	}
	return c.resolve(ctx, ResolveRequest{Tenant: id.Tenant, Endpoint: id.Endpoint, Key: id.Key, Token: token, Since: since,
		NoEffect: ans.Verdict == reconcile.NotApplied, Verify: true, Note: note})
}

// sagasData is the sagas page's.
type sagasData struct {
	Names        []string
	Name         string
	Tenant, ID   string
	Asked, Found bool
	Status       saga.Status
	Steps        []sagaStep
	Error        string
}

// sagaStep is one step on a saga's timeline.
type sagaStep struct {
	Name   string
	State  string // done, current, undone, undoing, pending, skipped
	Output int    // its output's size, once done
}

func (c *console) sagas(w http.ResponseWriter, r *http.Request, sess session) {
	q := r.URL.Query()
	d := sagasData{Name: q.Get("saga"), Tenant: q.Get("tenant"), ID: q.Get("id")}
	var runner *saga.Runner
	for _, s := range c.a.o.Sagas {
		d.Names = append(d.Names, s.Name())
		if s.Name() == d.Name || (d.Name == "" && len(c.a.o.Sagas) == 1) {
			runner, d.Name = s, s.Name()
		}
	}
	if runner != nil && d.ID != "" {
		d.Asked = true
		st, err := runner.Status(r.Context(), d.Tenant, d.ID)
		switch {
		case errors.Is(err, saga.ErrNotFound):
			d.Error = "no saga " + strconv.Quote(d.ID) + " of tenant " + strconv.Quote(d.Tenant)
		case err != nil && problemFor(err).status < 500:
			d.Error = problemFor(err).detail
		case err != nil:
			c.fail(w, r, sess, err)
			return
		default:
			d.Found, d.Status, d.Steps = true, st, timeline(runner, st)
		}
	}
	c.render(w, http.StatusOK, "sagas", view{Title: "Sagas", Nav: "sagas", CSRF: sess.csrf, Body: d})
}

// timeline places each step of st's saga: done, the current one, still
// to run; or, compensating, undone, being undone, the one that failed, and
// those it never ran.
func timeline(r *saga.Runner, st saga.Status) []sagaStep {
	names, undoable := r.Steps()
	steps := make([]sagaStep, len(names))
	cur, failed := -1, -1
	for i, n := range names {
		steps[i].Name = n
		if n == st.Step {
			cur = i
		}
		if _, done := st.Outputs[n]; !done && failed < 0 {
			failed = i
		}
	}
	compensating := st.Compensating || st.Phase == saga.Compensated
	for i := range steps {
		out, done := st.Outputs[steps[i].Name]
		switch {
		case compensating && done && i == cur:
			steps[i].State = "undoing"
		case compensating && done && undoable[i] && (cur < 0 || i > cur):
			steps[i].State = "undone"
		case done:
			steps[i].State, steps[i].Output = "done", len(out)
		case compensating && i == failed:
			steps[i].State = "failed"
		case compensating:
			steps[i].State = "skipped"
		case i == cur:
			steps[i].State = "current"
		default:
			steps[i].State = "pending"
		}
	}
	return steps
}
