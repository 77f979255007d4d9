package main

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

var metricName = regexp.MustCompile(`idemkv_[a-z0-9_]+`)

// TestMonitoringFiles: the alert rules and the dashboard under
// docs/monitoring parse, every metric they name is one the code
// registers, and every alert has its runbook entry in docs/operations.md.
func TestMonitoringFiles(t *testing.T) {
	root := filepath.Join("..", "..")
	known := map[string]bool{}
	require.NoError(t, filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		b, err := os.ReadFile(path)
		for _, m := range regexp.MustCompile(`"(idemkv_[a-z0-9_]+)"`).FindAllSubmatch(b, -1) {
			known[string(m[1])] = true
		}
		return err
	}))
	requireKnown := func(file, text string) {
		for _, name := range metricName.FindAllString(text, -1) {
			base := strings.TrimSuffix(name, "_bucket")
			require.True(t, known[base], "%s names %s, which no code registers", file, name)
		}
	}

	rulesFile := filepath.Join(root, "docs", "monitoring", "idemkv-alerts.yml")
	b, err := os.ReadFile(rulesFile)
	require.NoError(t, err)
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert, Expr string
				Annotations map[string]string
			}
		}
	}
	require.NoError(t, yaml.Unmarshal(b, &rules))
	ops, err := os.ReadFile(filepath.Join(root, "docs", "operations.md"))
	require.NoError(t, err)
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			require.NotEmpty(t, r.Expr, r.Alert)
			requireKnown(rulesFile, r.Expr)
			require.Equal(t, "docs/operations.md#"+strings.ToLower(r.Alert), r.Annotations["runbook"])
			require.True(t, strings.Contains(string(ops), "\n### "+r.Alert+"\n"), "the runbook has no entry for %s", r.Alert)
		}
	}
	require.Positive(t, n)

	dashFile := filepath.Join(root, "docs", "monitoring", "idemkv-dashboard.json")
	b, err = os.ReadFile(dashFile)
	require.NoError(t, err)
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	require.NoError(t, json.Unmarshal(b, &dash))
	require.NotEmpty(t, dash.Panels)
	for _, p := range dash.Panels {
		require.NotEmpty(t, p.Targets, p.Title)
		for _, tg := range p.Targets {
			requireKnown(dashFile, tg.Expr)
		}
	}
}
