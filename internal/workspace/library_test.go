package workspace_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

// libraryRequires are the direct requirements of the library's module,
// and why each is there. A service that imports the library takes them
// all into its module graph, so a new one is a decision: add it here with
// its reason, or put the code that needs it in a module of its own.
var libraryRequires = map[string]string{
	"github.com/cockroachdb/pebble/v2":    "engine: the store",
	"github.com/cespare/xxhash/v2":        "engine, fingerprint: key hashes",
	"github.com/bits-and-blooms/bloom/v3": "engine: the claim filter",
	"github.com/coocood/freecache":        "engine: the replay cache",
	"github.com/prometheus/client_golang": "engine/engineprom (Pebble requires it too)",
	"go.opentelemetry.io/otel":            "httpidem: spans",
	"go.opentelemetry.io/otel/trace":      "httpidem: spans",
	"golang.org/x/sys":                    "engine/lowprio: compactions at a low OS priority",
	"golang.org/x/time":                   "ttl: the sweeper's rate limit",
	"github.com/cenkalti/backoff/v5":      "client: retry backoff",
	"github.com/anishathalye/porcupine":   "storetest: the linearizability check",
	"pgregory.net/rapid":                  "storetest: the state machine",
	"github.com/stretchr/testify":         "storetest, and tests",
	"github.com/cockroachdb/datadriven":   "tests: the datadriven transcripts",
	"github.com/prometheus/client_model":  "tests of engineprom",
	"go.opentelemetry.io/otel/sdk":        "tests of httpidem's spans",
	"go.uber.org/goleak":                  "tests: goroutine leaks",
}

// TestLibraryRequirements keeps the library's module to the requirements
// above: no driver, broker, plotting or browser module may come back into
// it through an import and a go mod tidy.
func TestLibraryRequirements(t *testing.T) {
	gomod := filepath.Join("..", "..", "go.mod")
	// Read here, so that go test's cache notices a change to it.
	if _, err := os.ReadFile(gomod); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "mod", "edit", "-json", gomod)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go mod edit -json: %v", err)
	}
	var mod struct {
		Require []struct {
			Path     string
			Indirect bool
		}
	}
	if err := json.Unmarshal(out, &mod); err != nil {
		t.Fatalf("go mod edit -json: %v", err)
	}
	var direct []string
	for _, r := range mod.Require {
		if r.Indirect {
			continue
		}
		direct = append(direct, r.Path)
		if _, ok := libraryRequires[r.Path]; !ok {
			t.Errorf("the library's module requires %s: add it to libraryRequires with its reason, or move what needs it to a module of its own", r.Path)
		}
	}
	for path := range libraryRequires {
		if !slices.Contains(direct, path) {
			t.Errorf("the library's module no longer requires %s: take it out of libraryRequires", path)
		}
	}
}
