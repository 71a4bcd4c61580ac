package pglock_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The examples are there to be copied: a program outside this module cannot import
// its internal packages, so no package under example/, its tests included, imports one.
func TestExamplesImportNoInternalPackage(t *testing.T) {
	t.Parallel()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command to list the examples' imports with: %v", err)
	}
	out, err := exec.Command(goTool, "list", "-json=ImportPath,Imports,TestImports,XTestImports", "./example/...").Output()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		t.Fatalf("go list ./example/...: %v\n%s", err, exit.Stderr)
	}
	require.NoError(t, err)
	var pkgs []string
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var raw struct {
			ImportPath                         string
			Imports, TestImports, XTestImports []string
		}
		if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
			break
		} else {
			require.NoError(t, err)
		}
		pkgs = append(pkgs, raw.ImportPath)
		for _, imp := range slices.Concat(raw.Imports, raw.TestImports, raw.XTestImports) {
			require.False(t, slices.Contains(strings.Split(imp, "/"), "internal"),
				"%s imports %s: a program that copies it outside the module cannot", raw.ImportPath, imp)
		}
	}
	require.Subset(t, pkgs, []string{
		"github.com/pgfence/pglock/example/quickstart",
		"github.com/pgfence/pglock/example/shop",
		"github.com/pgfence/pglock/example/shop/cmd/shop",
		"github.com/pgfence/pglock/example/tryit",
		"github.com/pgfence/pglock/example/payments",
	})
}
