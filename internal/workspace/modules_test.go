package workspace_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv/internal/tier"
)

// systemTime bounds what the system tier of every module takes on two
// cores from a cold build cache (about four minutes with a warm one).
const systemTime = 15 * time.Minute

// TestModules runs the tests of every module of the workspace but the
// root one (which `go test ./...` runs itself).
func TestModules(t *testing.T) {
	if os.Getenv("IDEMKV_MODULES") == "separate" {
		t.Skip("IDEMKV_MODULES=separate: each module is tested on its own")
	}
	if d, ok := t.Deadline(); ok && tier.System() && time.Until(d) < systemTime {
		t.Fatalf("the system tier runs every module's process tests, for longer than go test's default timeout: run it with -timeout %v", 2*systemTime)
	}
	root, mods := workspaceModules(t)
	for _, name := range readTree(t, root) {
		os.Getenv(name)
	}
	args := []string{"test"}
	if tier.System() {
		args = append(args, "-tags", "system")
	}
	if testing.Short() {
		args = append(args, "-short")
	}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, "./...")
	for _, dir := range mods {
		rel, _ := filepath.Rel(root, dir)
		t.Run(filepath.ToSlash(rel), func(t *testing.T) {
			start := time.Now()
			cmd := exec.Command("go", args...)
			cmd.Dir = dir
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("go %s in %s: %v\n%s", strings.Join(args, " "), rel, err, out)
			}
			t.Logf("go %s in %s: ok, %v\n%s", strings.Join(args, " "), rel, time.Since(start).Round(time.Second), summary(out))
		})
	}
}

// workspaceModules returns the workspace's root directory and the
// directories of its modules other than the root module.
func workspaceModules(t *testing.T) (string, []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	gowork, err := exec.CommandContext(ctx, "go", "env", "GOWORK").Output()
	if err != nil {
		t.Fatalf("go env GOWORK: %v", err)
	}
	work := strings.TrimSpace(string(gowork))
	switch work {
	case "off":
		t.Skip("GOWORK=off: the other modules are not in reach")
	case "":
		t.Fatal("go.work is missing: `go test ./...` at the root would test the library's module only")
	}
	out, err := exec.CommandContext(ctx, "go", "work", "edit", "-json", work).Output()
	if err != nil {
		t.Fatalf("go work edit -json: %v", err)
	}
	var w struct{ Use []struct{ DiskPath string } }
	if err := json.Unmarshal(out, &w); err != nil {
		t.Fatalf("go work edit -json: %v", err)
	}
	root := filepath.Dir(work)
	var mods []string
	for _, u := range w.Use {
		dir := filepath.Join(root, u.DiskPath)
		if dir != root {
			mods = append(mods, dir)
		}
	}
	if len(mods) == 0 {
		t.Fatalf("%s uses no module but the root", work)
	}
	return root, mods
}

// readTree reads every file under dir (the whole workspace: the root
// module's code is what the others test against), so that go test records
// them as inputs of this test and runs it again when one changes. It
// returns the names of the IDEMKV_ variables the files mention: the test
// reads them too, with the variables of the go command, so that setting
// one runs it again.
func readTree(t *testing.T, dir string) []string {
	t.Helper()
	names := map[string]bool{"PATH": true, "GOFLAGS": true, "GOWORK": true, "GOTOOLCHAIN": true, "CGO_ENABLED": true}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != dir && (strings.HasPrefix(name, ".") || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		b, err := os.ReadFile(path)
		for _, name := range envName.FindAll(b, -1) {
			names[string(name)] = true
		}
		return err
	})
	if err != nil {
		t.Fatalf("reading %s: %v", dir, err)
	}
	return slices.Sorted(maps.Keys(names))
}

// envName matches the name of one of the project's environment variables.
var envName = regexp.MustCompile(`IDEMKV_[A-Z0-9_]*[A-Z0-9]`)

// summary keeps go test's per-package result lines.
func summary(out []byte) []byte {
	var b bytes.Buffer
	for _, line := range bytes.Split(out, []byte("\n")) {
		if bytes.HasPrefix(line, []byte("ok ")) || bytes.HasPrefix(line, []byte("FAIL")) || bytes.HasPrefix(line, []byte("?")) {
			b.Write(line)
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}
