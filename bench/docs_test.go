package bench

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReportFieldsDocumented checks that every exported, JSON-tagged field
// of a type declared in bench/ and its measurements has a doc or line
// comment: the reports' JSON is read by docs and scripts, and these
// comments are its field reference (what each figure is, and its unit).
func TestReportFieldsDocumented(t *testing.T) {
	fset := token.NewFileSet()
	var fields int
	var missing []string
	types := map[string]bool{}
	// check checks the fields of the struct types in the declaration of
	// typ, anonymous ones included.
	check := func(typ string, ts *ast.TypeSpec) {
		ast.Inspect(ts, func(n ast.Node) bool {
			st, ok := n.(*ast.StructType)
			if !ok {
				return true
			}
			for _, fld := range st.Fields.List {
				if fld.Tag == nil {
					continue
				}
				tag, _ := strconv.Unquote(fld.Tag.Value)
				if name, _, _ := strings.Cut(reflect.StructTag(tag).Get("json"), ","); name == "" || name == "-" {
					continue
				}
				for _, id := range fld.Names {
					if !id.IsExported() {
						continue
					}
					fields++
					types[typ] = true
					if strings.TrimSpace(fld.Doc.Text()+fld.Comment.Text()) == "" {
						missing = append(missing, fset.Position(id.Pos()).String()+": "+typ+"."+id.Name)
					}
				}
			}
			return true
		})
	}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		// Package-level type declarations; not the structs of function
		// bodies, which are no report.
		for _, d := range f.Decls {
			if gd, ok := d.(*ast.GenDecl); ok && gd.Tok == token.TYPE {
				for _, spec := range gd.Specs {
					ts := spec.(*ast.TypeSpec)
					check(f.Name.Name+"."+ts.Name.Name, ts)
				}
			}
		}
		return nil
	})
	require.NoError(t, err)
	for _, want := range []string{"bench.Meta", "bench.Latency", "bench.CommitFigures", "workloads.Point",
		"workloads.Sizing", "httpoverhead.Target", "httpoverhead.RuntimeFigures", "retention.Steady", "retention.SweepCost"} {
		require.True(t, types[want], "no JSON field found in %s: the walk missed it", want)
	}
	require.Greater(t, fields, 150)
	require.Empty(t, missing, "JSON fields without a doc comment")
}
