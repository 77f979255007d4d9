package fingerprint_test

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/idemkv/idemkv/fingerprint"
	"github.com/stretchr/testify/require"
)

// The frozen vectors: requests and the fingerprint and diagnostics every
// release must compute for them. A stored fingerprint must keep matching
// its retries for as long as its record lives, across upgrades, so these
// never change. A change to the algorithm is a new version, with vectors
// of its own.
const vectorsFile = "testdata/vectors.json"

// frozenVectors is how many vectors, from the start of the file, are pinned
// by frozenDigest, so that editing an expected value in the file (rather
// than fixing the code) also needs an edit here, visible in review. New
// vectors may be appended to the file freely.
const (
	frozenVectors = 30
	frozenDigest  = 0x6614970777a6a5f4
)

var updateVectors = flag.Bool("update-vectors", false,
	"fill in the expected values of vectors that have none (never changes a filled one)")

type vectorFile struct {
	Comment []string `json:"comment"`
	Vectors []vector `json:"vectors"`
}

type vector struct {
	Name        string        `json:"name"`
	Request     vectorRequest `json:"request"`
	Options     vectorOptions `json:"options"`
	Fingerprint string        `json:"fingerprint"`
	Diagnostics string        `json:"diagnostics"`
}

type vectorRequest struct {
	Tenant string              `json:"tenant,omitempty"`
	Method string              `json:"method,omitempty"`
	Route  string              `json:"route,omitempty"`
	Params map[string]string   `json:"params,omitempty"`
	Query  map[string][]string `json:"query,omitempty"`
	Header map[string][]string `json:"header,omitempty"`
	// Body is the body as text; BodyHex, if set, is the body in hex
	// instead (for bytes that are not UTF-8).
	Body    string `json:"body,omitempty"`
	BodyHex string `json:"body_hex,omitempty"`
}

type vectorOptions struct {
	Mode    string   `json:"mode"`
	Fields  []string `json:"fields,omitempty"`
	Headers []string `json:"headers,omitempty"`
	Query   []string `json:"query,omitempty"`
	// InexactNumbers is Options.InexactNumbers: it accepts more bodies
	// and does not change the fingerprint of any.
	InexactNumbers bool `json:"inexact_numbers,omitempty"`
}

func (v vector) request(t *testing.T) fingerprint.Request {
	body := []byte(v.Request.Body)
	if v.Request.BodyHex != "" {
		var err error
		body, err = hex.DecodeString(v.Request.BodyHex)
		require.NoError(t, err, v.Name)
	}
	return fingerprint.Request{
		Tenant: v.Request.Tenant, Method: v.Request.Method, Route: v.Request.Route,
		Params: v.Request.Params, Query: v.Request.Query, Header: v.Request.Header, Body: body,
	}
}

func (v vector) options(t *testing.T, diag bool) *fingerprint.Options {
	mode, err := fingerprint.ParseMode(v.Options.Mode)
	require.NoError(t, err, v.Name)
	return &fingerprint.Options{
		Mode: mode, Fields: v.Options.Fields, Headers: v.Options.Headers, Query: v.Options.Query,
		InexactNumbers: v.Options.InexactNumbers, Diagnostics: diag,
	}
}

func TestVectors(t *testing.T) {
	raw, err := os.ReadFile(vectorsFile)
	require.NoError(t, err)
	var f vectorFile
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&f))
	require.GreaterOrEqual(t, len(f.Vectors), frozenVectors, "frozen vectors must never be removed")

	filled := false
	names := map[string]bool{}
	for i := range f.Vectors {
		v := &f.Vectors[i]
		require.False(t, names[v.Name], "two vectors named %q", v.Name)
		names[v.Name] = true

		req := v.request(t)
		fp, err := fingerprint.Compute(req, v.options(t, true))
		require.NoError(t, err, v.Name)
		gotFP, gotDiag := hex.EncodeToString(fp.Bytes), hex.EncodeToString(fp.Diagnostics)
		if v.Fingerprint == "" && v.Diagnostics == "" && *updateVectors {
			v.Fingerprint, v.Diagnostics, filled = gotFP, gotDiag, true
		}
		require.Equal(t, v.Fingerprint, gotFP, "vector %q: the fingerprint changed; stored records would stop matching their retries", v.Name)
		require.Equal(t, v.Diagnostics, gotDiag, "vector %q: the diagnostics changed", v.Name)

		// Diagnostics never change the fingerprint itself.
		plain, err := fingerprint.Compute(req, v.options(t, false))
		require.NoError(t, err, v.Name)
		require.Equal(t, fp.Bytes, plain.Bytes, v.Name)
		require.Nil(t, plain.Diagnostics, v.Name)

		stored, err := hex.DecodeString(v.Fingerprint)
		require.NoError(t, err)
		ok, err := fingerprint.Matches(stored, req, v.options(t, false))
		require.NoError(t, err, v.Name)
		require.True(t, ok, v.Name)
		storedDiag, err := hex.DecodeString(v.Diagnostics)
		require.NoError(t, err)
		diffs, err := fingerprint.Explain(storedDiag, req, v.options(t, false))
		require.NoError(t, err, v.Name)
		require.Empty(t, diffs, v.Name)
	}

	if filled {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		enc.SetIndent("", "  ")
		require.NoError(t, enc.Encode(f))
		require.NoError(t, os.WriteFile(vectorsFile, buf.Bytes(), 0o644))
		t.Logf("filled in new vectors in %s", vectorsFile)
	}

	h := xxhash.New()
	for _, v := range f.Vectors[:frozenVectors] {
		fmt.Fprintf(h, "%s\x00%s\x00%s\x00", v.Name, v.Fingerprint, v.Diagnostics)
	}
	require.Equal(t, fmt.Sprintf("%#x", uint64(frozenDigest)), fmt.Sprintf("%#x", h.Sum64()),
		"the expected values of the first %d vectors were edited: they must never change", frozenVectors)
}

// TestVectorsDistinct checks that the vectors cover what they claim: the
// ones that spell one request differently share a fingerprint, and no
// other two do.
func TestVectorsDistinct(t *testing.T) {
	raw, err := os.ReadFile(vectorsFile)
	require.NoError(t, err)
	var f vectorFile
	require.NoError(t, json.Unmarshal(raw, &f))
	same := map[string]string{ // vector -> the vector it equals
		"payment reordered and respaced":    "payment",
		"payment numbers spelled otherwise": "payment",
		"header names in any case":          "headers named, one absent",
	}
	seen := map[string]string{}
	for _, v := range f.Vectors {
		if want, ok := same[v.Name]; ok {
			require.Equal(t, want, seen[v.Fingerprint], "vector %q", v.Name)
			continue
		}
		require.Empty(t, seen[v.Fingerprint], "vectors %q and %q share a fingerprint", v.Name, seen[v.Fingerprint])
		seen[v.Fingerprint] = v.Name
	}
}
