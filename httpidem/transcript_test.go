package httpidem_test

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fingerprint"
	"github.com/idemkv/idemkv/httpidem"
)

// TestTranscripts replays the request/response transcripts in
// testdata/transcripts: the middleware's semantics, readable in one place.
// Each file runs against a real engine on disk behind a loopback server.
// Regenerate with -rewrite after a deliberate change.
//
// Commands:
//
//	route [require] [remote] [diagnostics] [max-stored-body=N] [no-validation-failures]
//	    (re)start the server with a fresh store and this route
//	request
//	METHOD PATH
//	Header: value
//	...
//	<blank line>
//	body
//	    send it; print the status, the headers a client acts on, the body
//	calls        how many times the handler has run
//	advance D    move the store's clock
//	close-store  close the engine under the running server
//
// The handler answers 201 (200 to a GET) with {"id":"t_N"} and Location /v1/things/t_N,
// where N counts its runs. Query parameters steer it: status=S answers S
// instead, panic=1 panics, uncertain=1 reports an unknown outcome (and
// answers 504), release=1 says the operation had no effect (Op.Release),
// invalid=1 declares a validation failure (Op.Invalid), big=N writes N
// bytes. no-validation-failures turns the route's default (400 and 422
// are validation failures) off.
func TestTranscripts(t *testing.T) {
	datadriven.Walk(t, "testdata/transcripts", func(t *testing.T, path string) {
		var f *fixture
		var calls atomic.Int64
		handler := func(w http.ResponseWriter, r *http.Request) {
			n := calls.Add(1)
			q := r.URL.Query()
			if q.Get("panic") != "" {
				panic("handler failure")
			}
			if q.Get("release") != "" {
				httpidem.FromContext(r.Context()).Release()
			}
			if q.Get("invalid") != "" {
				httpidem.FromContext(r.Context()).Invalid()
			}
			if q.Get("uncertain") != "" {
				httpidem.FromContext(r.Context()).Uncertain("downstream timed out")
				w.WriteHeader(http.StatusGatewayTimeout)
				return
			}
			status := http.StatusCreated
			if r.Method == http.MethodGet {
				status = http.StatusOK
			}
			if s := q.Get("status"); s != "" {
				status, _ = strconv.Atoi(s)
			}
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Location", fmt.Sprintf("/v1/things/t_%d", n))
			w.Header().Set("X-Request-Trace", fmt.Sprint(n))
			w.WriteHeader(status)
			if big, _ := strconv.Atoi(q.Get("big")); big > 0 {
				io.WriteString(w, strings.Repeat("x", big))
				return
			}
			fmt.Fprintf(w, `{"id":"t_%d"}`, n)
		}
		datadriven.RunTest(t, path, func(t *testing.T, td *datadriven.TestData) string {
			switch td.Cmd {
			case "route":
				var rt httpidem.Route
				for _, a := range td.CmdArgs {
					switch a.Key {
					case "require":
						rt.Require = true
					case "remote":
						rt.Mode = idemkv.ModeRemote
					case "diagnostics":
						rt.Fingerprint = &fingerprint.Options{Diagnostics: true}
					case "max-stored-body":
						rt.MaxStoredBody, _ = strconv.Atoi(a.Vals[0])
					case "no-validation-failures":
						rt.ValidationFailure = func(int) bool { return false }
					default:
						t.Fatalf("%s: unknown route argument %q", td.Pos, a.Key)
					}
				}
				calls.Store(0)
				f = newFixture(t, rt, handler)
				return ""
			case "request":
				return transcriptRequest(t, f, td)
			case "calls":
				return fmt.Sprintf("%d\n", calls.Load())
			case "advance":
				d, err := time.ParseDuration(td.CmdArgs[0].Key)
				if err != nil {
					t.Fatal(err)
				}
				f.clock.Advance(d)
				return ""
			case "close-store":
				if err := f.eng.Close(); err != nil {
					t.Fatal(err)
				}
				return ""
			}
			t.Fatalf("%s: unknown command %q", td.Pos, td.Cmd)
			return ""
		})
	})
}

// shownHeaders are the response headers a transcript prints.
var shownHeaders = []string{"Content-Type", "Location", "Retry-After", httpidem.HeaderReplayed, httpidem.HeaderRetention, "X-Request-Trace"}

func transcriptRequest(t *testing.T, f *fixture, td *datadriven.TestData) string {
	head, body, _ := strings.Cut(td.Input, "\n\n")
	lines := strings.Split(head, "\n")
	method, path, ok := strings.Cut(lines[0], " ")
	if !ok {
		t.Fatalf("%s: want METHOD PATH, got %q", td.Pos, lines[0])
	}
	req, err := http.NewRequest(method, f.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range lines[1:] {
		name, value, ok := strings.Cut(l, ":")
		if !ok {
			t.Fatalf("%s: bad header line %q", td.Pos, l)
		}
		req.Header.Add(name, strings.TrimSpace(value))
	}
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	fmt.Fprintf(&out, "%s\n", resp.Status)
	names := slices.Clone(shownHeaders)
	slices.Sort(names)
	for _, name := range names {
		for _, v := range resp.Header.Values(name) {
			fmt.Fprintf(&out, "%s: %s\n", name, v)
		}
	}
	if len(b) > 0 {
		fmt.Fprintf(&out, "\n%s\n", b)
	}
	return out.String()
}
