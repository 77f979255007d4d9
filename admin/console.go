package admin

import (
	"bytes"
	"embed"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemkv/idemkv"
)

// The operator's console: the admin API's functions as web pages, served
// by the admin handler under /console/ (docs/operations.md, "The
// console"). Pages are rendered on the server from html/template, which
// escapes every value for where it lands, so a key, tenant, note or
// pointer holding markup is shown as text. The read-only pages work
// without JavaScript; the overview's script only refreshes it and draws
// its charts. Its assets are embedded in the binary.

const consolePath = "/console/"

//go:embed console
var consoleFS embed.FS

// console serves the console's pages.
type console struct {
	a        *api
	sessions sessions
	pages    map[string]*template.Template
	static   http.Handler

	// The overview's figures, and when they were read (overviewData).
	ovMu sync.Mutex
	ov   overviewData
	ovAt time.Time
}

// consolePages are the pages, each a template file under console/ that
// defines "content" for console/layout.html.
var consolePages = []string{"login", "overview", "records", "record", "unsettled", "confirm", "outbox", "sagas", "message"}

func newConsole(a *api) (*console, error) {
	c := &console{a: a, pages: make(map[string]*template.Template)}
	funcs := template.FuncMap{
		"ago":   func(t any) string { return ago(a.o.Now(), timeOf(t)) },
		"stamp": func(t any) string { return timeOf(t).UTC().Format("2006-01-02 15:04:05 UTC") },
		"q":     queryOf,
	}
	for _, p := range consolePages {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(consoleFS, "console/layout.html", "console/partials.html", "console/"+p+".html")
		if err != nil {
			return nil, err
		}
		c.pages[p] = t
	}
	static, err := fs.Sub(consoleFS, "console/static")
	if err != nil {
		return nil, err
	}
	c.static = http.StripPrefix(consolePath+"static/", http.FileServerFS(static))
	return c, nil
}

// ServeHTTP routes a console request: the login page and the assets to
// anyone, every other page to a session, every POST to a session whose
// CSRF token it carries.
func (c *console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	consoleHeaders(w.Header())
	path := strings.TrimPrefix(r.URL.Path, consolePath)
	if strings.HasPrefix(path, "static/") {
		c.static.ServeHTTP(w, r)
		return
	}
	if path == "login" {
		c.login(w, r)
		return
	}
	sess, ok := c.sessions.lookup(r, c.a.o.Now())
	if !ok {
		if r.Method == http.MethodGet {
			http.Redirect(w, r, consolePath+"login", http.StatusSeeOther)
			return
		}
		c.message(w, r, session{}, http.StatusUnauthorized, "Not signed in", "Sign in again: your session ended.")
		return
	}
	if r.Method == http.MethodPost {
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		if !sameOrigin(r) || !validCSRF(r, sess) {
			c.message(w, r, sess, http.StatusForbidden, "Refused",
				"This request did not come from the console's own page (no valid CSRF token, or another origin). Nothing was changed.")
			return
		}
	}
	page := map[string]struct {
		method string
		h      func(http.ResponseWriter, *http.Request, session)
	}{
		"":              {http.MethodGet, c.overview},
		"overview.json": {http.MethodGet, c.overviewJSON},
		"records":       {http.MethodGet, c.records},
		"record":        {http.MethodGet, c.record},
		"unsettled":     {http.MethodGet, c.unsettled},
		"confirm":       {http.MethodGet, c.confirm},
		"act":           {http.MethodPost, c.act},
		"outbox":        {http.MethodGet, c.outbox},
		"sagas":         {http.MethodGet, c.sagas},
		"logout":        {http.MethodPost, c.logout},
	}[path]
	switch {
	case page.h == nil:
		c.message(w, r, sess, http.StatusNotFound, "Not found", "The console has no such page.")
	case r.Method != page.method:
		w.Header().Set("Allow", page.method)
		c.message(w, r, sess, http.StatusMethodNotAllowed, "Wrong method", "This page takes "+page.method+".")
	default:
		page.h(w, r, sess)
	}
}

// view is what every page's template gets.
type view struct {
	Title string
	Nav   string // the navigation entry to mark current
	CSRF  string // the session's, for the page's forms
	Flash string
	Body  any
}

// render writes page with body, as the answer to r.
func (c *console) render(w http.ResponseWriter, status int, page string, v view) {
	var buf bytes.Buffer
	if err := c.pages[page].Execute(&buf, v); err != nil {
		c.a.o.Logger.Error("admin: console page failed", "page", page, "err", err)
		http.Error(w, "the console could not render this page", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// message renders a page that says only what happened.
func (c *console) message(w http.ResponseWriter, r *http.Request, sess session, status int, title, text string) {
	c.render(w, status, "message", view{Title: title, CSRF: sess.csrf, Body: text})
}

// fail renders err as the API would answer it (problemFor).
func (c *console) fail(w http.ResponseWriter, r *http.Request, sess session, err error) {
	p := problemFor(err)
	if p.log {
		c.a.o.Logger.Error("admin: console call failed", "path", r.URL.Path, "err", err)
	}
	c.message(w, r, sess, p.status, http.StatusText(p.status), p.detail)
}

// login serves the login page, and takes the admin token from its form.
func (c *console) login(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet:
		c.render(w, http.StatusOK, "login", view{Title: "Sign in"})
	case http.MethodPost:
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		if !sameOrigin(r) {
			c.render(w, http.StatusForbidden, "login", view{Title: "Sign in", Flash: "Sign in from the console's own page."})
			return
		}
		right, wait := c.a.checkToken(r, r.PostFormValue("token"))
		if wait > 0 {
			w.Header().Set("Retry-After", retryAfter(wait))
			c.render(w, http.StatusTooManyRequests, "login", view{Title: "Sign in", Flash: "Too many wrong tokens from this address: try again in " + retryAfter(wait) + " seconds."})
			return
		}
		if !right {
			c.a.o.Logger.Warn("admin: console sign-in refused", "remote", r.RemoteAddr)
			c.render(w, http.StatusUnauthorized, "login", view{Title: "Sign in", Flash: "That is not the admin token."})
			return
		}
		id, _ := c.sessions.start(c.a.o.Now())
		setSessionCookie(w, r, id, int(SessionLifetime/time.Second))
		c.a.o.Logger.Info("admin: console sign-in", "remote", r.RemoteAddr)
		http.Redirect(w, r, consolePath, http.StatusSeeOther)
	default:
		w.Header().Set("Allow", "GET, POST")
		c.message(w, r, session{}, http.StatusMethodNotAllowed, "Wrong method", "This page takes GET and POST.")
	}
}

func (c *console) logout(w http.ResponseWriter, r *http.Request, _ session) {
	c.sessions.end(r)
	setSessionCookie(w, r, "", -1)
	http.Redirect(w, r, consolePath+"login", http.StatusSeeOther)
}

// queryOf builds a page's query string from name, value pairs, leaving
// out empty values: a template writes href="records?{{q "state" .S}}"
// and the values are encoded, whatever they hold.
func queryOf(pairs ...any) template.URL {
	v := url.Values{}
	for i := 0; i+1 < len(pairs); i += 2 {
		name, _ := pairs[i].(string)
		var val string
		switch x := pairs[i+1].(type) {
		case string:
			val = x
		case uint64:
			if x != 0 {
				val = strconv.FormatUint(x, 10)
			}
		case bool:
			if x {
				val = "true"
			}
		}
		if val != "" {
			v.Set(name, val)
		}
	}
	return template.URL(v.Encode()) // encoded: safe in an attribute
}

// timeOf is a template's time argument: a time.Time, or a pointer to one
// (RecordView.LeaseExpires).
func timeOf(v any) time.Time {
	switch t := v.(type) {
	case time.Time:
		return t
	case *time.Time:
		if t != nil {
			return *t
		}
	}
	return time.Time{}
}

// ago says how long before now t was, coarsely.
func ago(now, t time.Time) string {
	if t.IsZero() {
		return ""
	}
	d := now.Sub(t)
	switch {
	case d < 0:
		return "in " + (-d).Round(time.Second).String()
	case d < time.Minute:
		return d.Round(time.Second).String() + " ago"
	case d < 48*time.Hour:
		return d.Round(time.Minute).String() + " ago"
	}
	return strconv.Itoa(int(d/(24*time.Hour))) + " days ago"
}

// recordID reads a record's identity from a page's query or form.
func recordID(v url.Values) idemkv.ID {
	return idemkv.ID{Tenant: v.Get("tenant"), Endpoint: v.Get("endpoint"), Key: v.Get("key")}
}
