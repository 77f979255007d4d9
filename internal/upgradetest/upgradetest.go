// Package upgradetest reads a store kept as test data from an earlier
// layout, with the requests that wrote it. The engine's, the middleware's
// and the command's upgrade tests share it; package replay sends the
// requests again through the current middleware.
//
// A fixture is a directory (engine/testdata/layout3) holding store/, the
// Pebble directory the earlier code closed cleanly, and requests.json,
// what was sent and answered; generate.go beside them says how they were
// written. A test copies the store first: the fixture stays as the
// earlier code left it.
package upgradetest

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/ttl"
)

// Outcomes a request left in the store (Request.Outcome).
const (
	// Completed: the outcome is stored; a retry replays it.
	Completed = "completed"
	// Uncertain: the handler could not tell whether its effect happened.
	Uncertain = "uncertain"
	// Abandoned: a remote claim in progress when its process stopped.
	Abandoned = "abandoned"
	// Released: the middleware released the key (the handler called the
	// request invalid); the store holds nothing for it.
	Released = "released"
)

// Fixture is requests.json and where it lies.
type Fixture struct {
	// Dir is the fixture's directory.
	Dir string `json:"-"`
	// Layout is the layout the store was written in.
	Layout int `json:"layout"`
	// Commit is the commit whose code wrote it.
	Commit string `json:"commit"`
	// Start and End are the writer's clock at the first request and when
	// the store closed. Records expire relative to them.
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	// LeaseSeconds is the engine's default lease.
	LeaseSeconds int `json:"lease_seconds"`
	// RetentionSeconds maps each retention class ("" the default) to its
	// window.
	RetentionSeconds map[string]int `json:"retention_seconds"`
	Routes           []Route        `json:"routes"`
	Requests         []Request      `json:"requests"`
	// Effects are the store's effects (data keys and values) at End.
	Effects map[string]string `json:"effects"`
}

// Route is how one handler was protected.
type Route struct {
	Name         string   `json:"name"`
	Method       string   `json:"method"`
	Pattern      string   `json:"pattern"`
	Remote       bool     `json:"remote"`
	Resumable    bool     `json:"resumable"`
	Retention    string   `json:"retention"`
	LeaseSeconds int      `json:"lease_seconds"`
	BodyMode     string   `json:"body_mode"` // json, raw or fields
	Fields       []string `json:"fields,omitempty"`
	Headers      []string `json:"headers,omitempty"`
}

// Request is one request sent, and its answer.
type Request struct {
	Route   string            `json:"route"`
	Method  string            `json:"method"`
	Path    string            `json:"path"`
	Tenant  string            `json:"tenant"`
	Key     string            `json:"key"`
	Headers map[string]string `json:"headers,omitempty"`
	Body    string            `json:"body"`
	// Outcome is what the store holds for the key.
	Outcome      string `json:"outcome"`
	Status       int    `json:"status"`
	ContentType  string `json:"content_type,omitempty"`
	Location     string `json:"location,omitempty"`
	ResponseBody string `json:"response_body"`
}

// Claim is the claim the middleware makes for q on its route, with the
// fingerprint fp (a test takes the stored one: it computes none).
func (f *Fixture) Claim(q Request, fp []byte) idemkv.ClaimRequest {
	req := idemkv.ClaimRequest{ID: f.ID(q), Fingerprint: fp}
	for _, rt := range f.Routes {
		if rt.Name == q.Route {
			req.Resumable, req.Retention = rt.Resumable, rt.Retention
			req.Lease = time.Duration(rt.LeaseSeconds) * time.Second
			if rt.Remote {
				req.Mode = idemkv.ModeRemote
			}
		}
	}
	return req
}

// ID is the record q claimed: the middleware scopes a key by tenant and
// by method and route pattern.
func (f *Fixture) ID(q Request) idemkv.ID {
	for _, rt := range f.Routes {
		if rt.Name == q.Route {
			return idemkv.ID{Tenant: q.Tenant, Endpoint: q.Method + " " + rt.Pattern, Key: q.Key}
		}
	}
	panic("upgradetest: request of no route " + q.Route)
}

// Load reads the fixture in dir.
func Load(t testing.TB, dir string) *Fixture {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "requests.json"))
	require.NoError(t, err)
	f := &Fixture{Dir: dir}
	require.NoError(t, json.Unmarshal(b, f))
	require.NotEmpty(t, f.Requests)
	return f
}

// Lease is the engine's default lease when the store was written.
func (f *Fixture) Lease() time.Duration { return time.Duration(f.LeaseSeconds) * time.Second }

// Retention is the default class's window.
func (f *Fixture) Retention() time.Duration {
	return time.Duration(f.RetentionSeconds[""]) * time.Second
}

// Classes are the other retention classes.
func (f *Fixture) Classes() ttl.Classes {
	c := ttl.Classes{}
	for name, s := range f.RetentionSeconds {
		if name != "" {
			c[name] = time.Duration(s) * time.Second
		}
	}
	return c
}

// Keys returns the requests whose outcome is o.
func (f *Fixture) Keys(o string) []Request {
	var qs []Request
	for _, q := range f.Requests {
		if q.Outcome == o {
			qs = append(qs, q)
		}
	}
	return qs
}

// CopyStore copies the fixture's store into a new directory under
// t.TempDir and returns it.
func (f *Fixture) CopyStore(t testing.TB) string {
	t.Helper()
	from := filepath.Join(f.Dir, "store")
	to := filepath.Join(t.TempDir(), "store")
	err := filepath.WalkDir(from, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(from, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(to, rel), 0o755)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(to, rel), b, 0o644)
	})
	require.NoError(t, err)
	return to
}
