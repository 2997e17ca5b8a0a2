package state_test

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// state sits below xds, proxy and the rest in the package table: it may
// import the generated protos (internal/xds/workloadpb, securitypb) and
// rbac, never internal/xds itself or anything above it.
func TestImportDirection(t *testing.T) {
	const mod = "github.com/ztunnel-go/ztunnel/internal/"
	forbidden := []string{"xds", "hbone", "proxy", "inpod", "admin", "nstest", "cniemu"}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		parsed, err := parser.ParseFile(fset, f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, imp := range parsed.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			for _, bad := range forbidden {
				if path == mod+bad || strings.HasPrefix(path, mod+bad+"/") && !strings.HasPrefix(path, mod+"xds/workloadpb") && !strings.HasPrefix(path, mod+"xds/securitypb") {
					t.Errorf("%s imports %s", f, path)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no source files checked")
	}
}
