package dns

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// dns sits between state/xds and hbone in the package table: it reads
// state and nothing above it (no proxy, hbone, inpod, admin, test helpers);
// the sockets it needs come in as functions.
func TestImportDirection(t *testing.T) {
	const mod = "github.com/ztunnel-go/ztunnel/"
	forbidden := []string{"internal/hbone", "internal/proxy", "internal/inpod", "internal/admin", "internal/nstest", "internal/cniemu", "internal/xds", "cmd"}
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
				if path == mod+bad || strings.HasPrefix(path, mod+bad+"/") {
					t.Errorf("%s imports %s", f, path)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no source files checked")
	}
}
