package logtest

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// Log is a log kept in memory for a test: a logger from [New] (or any
// other writer) writes it, from any goroutine, while the test reads it.
// Its zero value is an empty Log, ready for use.
type Log struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// New returns a new Log and a logger writing JSON records into it, the
// records below level left out.
func New(level slog.Level) (*Log, *slog.Logger) {
	l := &Log{}
	return l, slog.New(slog.NewJSONHandler(l, &slog.HandlerOptions{Level: level}))
}

// Write appends p to the log. It is safe for concurrent use.
func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// String returns everything written so far (less what [Log.Take] took).
func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// Records returns the log's records, one a line, each decoded from JSON
// into its attributes; empty lines are skipped, and a line that is not a
// JSON object fails the test.
func (l *Log) Records(t testing.TB) []map[string]any {
	t.Helper()
	return decode(t, l.String())
}

// Take is [Log.Records] of what was written since the last Take, and
// empties the log: the next String, Records or Take starts after it.
func (l *Log) Take(t testing.TB) []map[string]any {
	t.Helper()
	l.mu.Lock()
	s := l.buf.String()
	l.buf.Reset()
	l.mu.Unlock()
	return decode(t, s)
}

// decode returns the JSON object of each non-empty line of s.
func decode(t testing.TB, s string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		out = append(out, m)
	}
	return out
}
