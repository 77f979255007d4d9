package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	fprint "github.com/idemkv/idemkv/fingerprint"
	"github.com/stretchr/testify/require"
)

// runFingerprint runs "idemkv fingerprint ARGS" in process and returns its
// exit status and output lines, keyed by their first word.
func runFingerprint(t *testing.T, args ...string) (int, map[string][]string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), append([]string{"fingerprint"}, args...), &stdout, &stderr)
	lines := map[string][]string{}
	for _, l := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		k, v, _ := strings.Cut(l, " ")
		lines[k] = append(lines[k], strings.TrimSpace(v))
	}
	return code, lines, stderr.String()
}

func writeBody(t *testing.T, body string) string {
	t.Helper()
	name := filepath.Join(t.TempDir(), "body.json")
	require.NoError(t, os.WriteFile(name, []byte(body), 0o644))
	return name
}

func TestFingerprintCommand(t *testing.T) {
	file := writeBody(t, "{ \"currency\": \"USD\",\n  \"amount\": 5e3, \"card\": \"tok_\\u0031\\u00323\" }\n")
	req := fprint.Request{
		Tenant: "acct_42", Method: "POST", Route: "/v1/accounts/{acct}/payments",
		Params: map[string]string{"acct": "a_1"},
		Header: map[string][]string{"Api-Version": {"2026-01-01", "beta"}},
		Query:  map[string][]string{"dry_run": {"false"}},
		Body:   []byte(`{"amount":5000,"card":"tok_123","currency":"USD"}`),
	}
	opts := &fprint.Options{Headers: []string{"Api-Version", "X-Absent"}, Query: []string{"dry_run"}, Diagnostics: true}
	want, err := fprint.Compute(req, opts)
	require.NoError(t, err)

	args := []string{"--tenant", "acct_42", "--method", "POST", "--route", "/v1/accounts/{acct}/payments",
		"--param", "acct=a_1", "--header", "Api-Version: 2026-01-01", "--header", "api-version:beta",
		"--header", "X-Absent", "--query", "dry_run=false", "--diagnostics"}
	code, out, stderr := runFingerprint(t, append(args, file)...)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, []string{"json"}, out["mode"])
	require.Equal(t, []string{`{"amount":5000,"card":"tok_123","currency":"USD"}`}, out["body"])
	require.Equal(t, []string{want.String()}, out["fingerprint"])
	require.Len(t, out["diagnostics"], 1)
	diag := out["diagnostics"][0]

	// Checking a retry against what the store holds.
	code, out, stderr = runFingerprint(t, append(args, "--stored", want.String(), file)...)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, []string{want.String() + " (version 1) matches: a retry of the stored request"}, out["stored"])

	other := writeBody(t, `{"amount":6000,"card":"tok_123","currency":"USD"}`)
	code, out, stderr = runFingerprint(t, append(args, "--stored", want.String(), "--stored-diagnostics", diag, other)...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out["stored"][0], "does not match")
	require.Equal(t, []string{"body /amount: changed"}, out["differs"])

	code, out, stderr = runFingerprint(t, append(args, "--stored-diagnostics", diag, file)...)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, []string{"nothing"}, out["differs"])
}

func TestFingerprintCommandModes(t *testing.T) {
	file := writeBody(t, `{"amount":5000, "ts":"2026-01-01", "meta":{"ref":null}}`)
	code, out, stderr := runFingerprint(t, "--mode", "fields", "--field", "/meta/ref", "--field", "/amount", "--field", "/note", file)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, []string{"5000"}, out["/amount"])
	require.Equal(t, []string{"null"}, out["/meta/ref"])
	require.Equal(t, []string{"(absent)"}, out["/note"])
	want, err := fprint.Compute(fprint.Request{Body: []byte(`{"amount":5000.0,"meta":{"ref":null}}`)},
		&fprint.Options{Mode: fprint.ModeFields, Fields: []string{"/amount", "/meta/ref", "/note"}})
	require.NoError(t, err)
	require.Equal(t, []string{want.String()}, out["fingerprint"])

	raw := writeBody(t, "a\xffb")
	code, out, stderr = runFingerprint(t, "--mode", "raw", raw)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, []string{`"a\xffb"`}, out["body"])

	code, out, stderr = runFingerprint(t, writeBody(t, ""))
	require.Equal(t, 0, code, stderr)
	require.Equal(t, []string{"(empty)"}, out["body"])
}

// TestFingerprintExitStatus runs the binary (the test binary standing in
// for it, see TestMain) for its exit status, stdin and stderr.
func TestFingerprintExitStatus(t *testing.T) {
	good := writeBody(t, `{"a":1}`)
	for _, tc := range []struct {
		name       string
		args       []string
		stdin      string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{"stdin", nil, `{"b":[1.0],"a":true}`, 0, `{"a":true,"b":[1]}`, ""},
		{"file", []string{good}, "", 0, `{"a":1}`, ""},
		{"malformed", nil, `{"a":1,}`, 1, "", "fingerprint: malformed JSON at offset 7"},
		{"duplicate", nil, `{"a":1,"a":1}`, 1, "", `duplicate member name at offset 7: "a"`},
		{"too large", []string{"--max-body", "3"}, `[1,2]`, 1, "", "body too large"},
		{"too deep", []string{"--max-depth", "2"}, `[[[1]]]`, 1, "", "nested too deeply"},
		{"missing file", []string{"/nonexistent/body.json"}, "", 1, "", "no such file"},
		{"stored, wrong length", []string{"--stored", "0102"}, `{}`, 1, "", "--stored: fingerprint: invalid stored value"},
		{"stored, unknown version", []string{"--stored", "090102030405060708"}, `{}`, 1, "", "unknown version"},
		{"unknown mode", []string{"--mode", "xml"}, "", 2, "", `unknown mode "xml"`},
		{"field without fields mode", []string{"--field", "/a"}, "", 2, "", "--field needs --mode fields"},
		{"fields mode without a field", []string{"--mode", "fields"}, "", 2, "", "needs at least one --field"},
		{"bad pointer", []string{"--mode", "fields", "--field", "a"}, "", 2, "", "is not a JSON Pointer"},
		{"bad header name", []string{"--header", "Bad Name: v"}, "", 2, "", "is not a header name"},
		{"bad param", []string{"--param", "novalue"}, "", 2, "", `"novalue" is not K=V`},
		{"bad hex", []string{"--stored", "zz"}, "", 2, "", `"zz" is not hex`},
		{"negative limit", []string{"--max-body", "-1"}, "", 2, "", "must be positive"},
		{"two files", []string{good, good}, "", 2, "", "unexpected argument"},
		{"flag after file", []string{good, "--mode", "raw"}, "", 2, "", "flags go before arguments"},
		{"help", []string{"-h"}, "", 0, "Usage: idemkv fingerprint", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], append([]string{"fingerprint"}, tc.args...)...)
			cmd.Env = append(os.Environ(), "IDEMKV_TEST_AS_MAIN=1")
			cmd.Stdin = strings.NewReader(tc.stdin)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			code := 0
			var exitErr *exec.ExitError
			if errors.As(err, &exitErr) {
				code = exitErr.ExitCode()
			} else {
				require.NoError(t, err)
			}
			require.Equal(t, tc.wantCode, code, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
			require.Contains(t, stdout.String(), tc.wantStdout)
			require.Contains(t, stderr.String(), tc.wantStderr)
			if code != 0 {
				require.Empty(t, stdout.String(), "nothing is printed for a request that fails")
			}
			if code == 2 {
				require.Contains(t, stderr.String(), "Usage: idemkv fingerprint")
			}
		})
	}
}
