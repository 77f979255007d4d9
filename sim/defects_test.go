package sim

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestDefectPatchesApply: every defect .ci/sim-defects puts back still
// applies to the tree, so that the claim "the simulation finds it" stays
// one command away. A patch that no longer applies must be made again
// against the code it breaks.
func TestDefectPatchesApply(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, ".git")); err != nil {
		t.Skip("not a git checkout")
	}
	patches, err := filepath.Glob(filepath.Join("testdata", "defects", "*.patch"))
	if err != nil || len(patches) == 0 {
		t.Fatalf("no defect patches: %v", err)
	}
	for _, p := range patches {
		t.Run(filepath.Base(p), func(t *testing.T) {
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			// Read the files it changes here, so that go test's cache
			// runs this again when one of them changes.
			sc := bufio.NewScanner(bytes.NewReader(b))
			for sc.Scan() {
				if f, ok := strings.CutPrefix(sc.Text(), "+++ b/"); ok {
					if _, err := os.ReadFile(filepath.Join(root, f)); err != nil {
						t.Fatalf("%s changes %s: %v", p, f, err)
					}
				}
			}
			abs, _ := filepath.Abs(p)
			cmd := exec.Command("git", "apply", "--check", abs)
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s no longer applies: make it again against the code it breaks (.ci/sim-defects)\n%s", p, out)
			}
		})
	}
}
