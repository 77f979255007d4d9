package payments

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv/engine"
)

// TestTranscripts replays the request/response transcripts in
// testdata/transcripts against the service on a real engine behind
// loopback HTTP: what a client, honest or not, sees. Regenerate with
// -rewrite after a deliberate change, and read the diff.
//
// Commands:
//
//	service
//	[SECRET ACCOUNT lines]
//	    (re)start the service on a fresh store; with lines, callers
//	    authenticate with those API keys, without, in demo mode
//	request
//	METHOD PATH
//	Header: value
//	...
//	<blank line>
//	body
//	    send it; print the status, the headers a client acts on, the body
//	charges      how many charges the processor has made
//
// Payment and charge ids are random: a transcript shows them as pay_1,
// ch_1, ... in order of appearance, and a request may name them so.
func TestTranscripts(t *testing.T) {
	datadriven.Walk(t, "testdata/transcripts", func(t *testing.T, path string) {
		var (
			srv *httptest.Server
			p   *Provider
			ids = &idNames{}
		)
		datadriven.RunTest(t, path, func(t *testing.T, td *datadriven.TestData) string {
			switch td.Cmd {
			case "service":
				if srv != nil {
					srv.Close()
				}
				var keys *APIKeys
				if strings.TrimSpace(td.Input) != "" {
					var err error
					keys, err = ParseAPIKeys(strings.NewReader(td.Input))
					require.NoError(t, err)
				}
				srv, p = transcriptService(t, keys)
				return ""
			case "request":
				return ids.name(transcriptRequest(t, srv, ids.real(td.Input), td))
			case "charges":
				return fmt.Sprintf("%d\n", p.Stats().Charges)
			}
			t.Fatalf("%s: unknown command %q", td.Pos, td.Cmd)
			return ""
		})
		if srv != nil {
			srv.Close()
		}
	})
}

func transcriptService(t *testing.T, keys *APIKeys) (*httptest.Server, *Provider) {
	eng, err := engine.Open(t.TempDir(), &engine.Options{NoBackgroundSweep: true})
	require.NoError(t, err)
	t.Cleanup(func() { eng.Close() })
	clock := newTicking()
	p := NewProvider(ProviderOptions{Rand: rand.New(rand.NewPCG(1, 2)), Clock: clock.still()})
	svc, err := New(Config{Store: eng, Processor: p, APIKeys: keys, Clock: clock})
	require.NoError(t, err)
	return httptest.NewServer(svc.Handler()), p
}

// shownHeaders are the response headers a transcript prints.
var shownHeaders = []string{"Allow", "Content-Type", "Idempotent-Replayed", "Location", "Retry-After", "WWW-Authenticate"}

func transcriptRequest(t *testing.T, srv *httptest.Server, input string, td *datadriven.TestData) string {
	head, body, _ := strings.Cut(input, "\n\n")
	lines := strings.Split(head, "\n")
	method, path, ok := strings.Cut(lines[0], " ")
	if !ok {
		t.Fatalf("%s: want METHOD PATH, got %q", td.Pos, lines[0])
	}
	req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	require.NoError(t, err)
	for _, l := range lines[1:] {
		name, value, ok := strings.Cut(l, ":")
		if !ok {
			t.Fatalf("%s: bad header line %q", td.Pos, l)
		}
		req.Header.Add(name, strings.TrimSpace(value))
	}
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out strings.Builder
	fmt.Fprintf(&out, "%s\n", resp.Status)
	for _, h := range shownHeaders {
		if v := resp.Header.Get(h); v != "" {
			fmt.Fprintf(&out, "%s: %s\n", h, v)
		}
	}
	if len(b) > 0 {
		fmt.Fprintf(&out, "\n%s\n", strings.TrimRight(string(b), "\n"))
	}
	return out.String()
}

// idNames names random ids by order of appearance, and back.
type idNames struct {
	toName, toReal map[string]string
	n              map[string]int
}

var (
	randomID = regexp.MustCompile(`\b(pay|ch)_[0-9a-f]{16,24}\b`)
	namedID  = regexp.MustCompile(`\b(pay|ch)_[0-9]+\b`)
)

func (m *idNames) name(s string) string {
	if m.toName == nil {
		m.toName, m.toReal, m.n = map[string]string{}, map[string]string{}, map[string]int{}
	}
	return randomID.ReplaceAllStringFunc(s, func(id string) string {
		if n, ok := m.toName[id]; ok {
			return n
		}
		prefix, _, _ := strings.Cut(id, "_")
		m.n[prefix]++
		n := fmt.Sprintf("%s_%d", prefix, m.n[prefix])
		m.toName[id], m.toReal[n] = n, id
		return n
	})
}

func (m *idNames) real(s string) string {
	return namedID.ReplaceAllStringFunc(s, func(n string) string {
		if id, ok := m.toReal[n]; ok {
			return id
		}
		return n
	})
}
