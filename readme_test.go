package pglock_test

import (
	"bufio"
	"bytes"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// readmeBlock is a ```go block of README.md.
type readmeBlock struct {
	line int // of the block's first line of code
	code string
}

// readmeEnv is what the README's text gives a block that is not a whole file: the
// block is the body of a function with these parameters, returning an error.
const readmeEnv = `ctx context.Context, databaseURL string, pool *pgxpool.Pool, client *pglock.Client,
	scheduler gocron.Scheduler, reconcile func(ctx context.Context) error,
	feed interface{ Subscribe(ctx context.Context) error }`

// readmeImports are the packages a block that is not a whole file may use, by name.
var readmeImports = map[string]string{
	"context":       "context",
	"errors":        "errors",
	"fmt":           "fmt",
	"gocron":        "github.com/go-co-op/gocron/v2",
	"log":           "log",
	"os":            "os",
	"pglock":        "github.com/pgfence/pglock",
	"pglockmetrics": "github.com/pgfence/pglock/metrics",
	"pglocktest":    "github.com/pgfence/pglock/pglocktest",
	"pgx":           "github.com/jackc/pgx/v5",
	"pgxpool":       "github.com/jackc/pgx/v5/pgxpool",
	"slog":          "log/slog",
	"time":          "time",
}

// TestReadmeGoBlocksCompile builds and vets every ```go block of README.md, each as a
// package of its own in a temporary directory of the module. A block that starts with
// "package" is a whole file, and must be gofmt'ed; any other block is the body of a
// function with readmeEnv's variables, importing the readmeImports it uses. Errors
// point at README.md's lines.
func TestReadmeGoBlocksCompile(t *testing.T) {
	t.Parallel()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command to build README.md's blocks with: %v", err)
	}
	readme, err := filepath.Abs("README.md") // the //line directives name it, for errors
	require.NoError(t, err)
	blocks := readmeGoBlocks(t, readme)
	require.NotEmpty(t, blocks, "README.md has no ```go block")

	// Inside the module, so that the blocks import this pglock; "_" hides the directory
	// from ./... patterns.
	dir, err := os.MkdirTemp(".", "_readme_blocks_")
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, os.RemoveAll(dir)) })
	args := []string{"vet"}
	for i, b := range blocks {
		var src string
		if strings.HasPrefix(b.code, "package ") {
			formatted, err := format.Source([]byte(b.code))
			require.NoError(t, err, "%s:%d", readme, b.line)
			require.Equal(t, string(formatted), b.code, "%s:%d: the block is not gofmt'ed", readme, b.line)
			src = fmt.Sprintf("//line %s:%d\n%s", readme, b.line, b.code)
		} else {
			src = readmeFunc(readme, b)
		}
		pkg := filepath.Join(dir, fmt.Sprintf("block%d", i+1))
		require.NoError(t, os.Mkdir(pkg, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(pkg, "main.go"), []byte(src), 0o644))
		args = append(args, "./"+filepath.ToSlash(pkg))
	}
	out, err := exec.Command(goTool, args...).CombinedOutput()
	require.NoError(t, err, "README.md's Go blocks do not compile:\n%s", out)
}

// readmeGoBlocks returns the ```go blocks of the Markdown file path, indented or not.
func readmeGoBlocks(t *testing.T, path string) []readmeBlock {
	t.Helper()
	text, err := os.ReadFile(path)
	require.NoError(t, err)
	var blocks []readmeBlock
	var cur *readmeBlock
	indent := ""
	sc := bufio.NewScanner(bytes.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case cur == nil && trimmed == "```go":
			cur = &readmeBlock{line: n + 1}
			indent = line[:strings.Index(line, "```")]
		case cur != nil && trimmed == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.code += strings.TrimPrefix(line, indent) + "\n"
		}
	}
	require.NoError(t, sc.Err())
	require.Nil(t, cur, "%s: a ```go block is not closed", path)
	return blocks
}

// readmeFunc makes a block that is not a whole file a package main: the block is the
// body of a function with readmeEnv's parameters.
func readmeFunc(readme string, b readmeBlock) string {
	body := fmt.Sprintf("//line %s:%d\n%s\treturn nil\n", readme, b.line, b.code)
	used := map[string]bool{"context": true, "gocron": true, "pglock": true, "pgxpool": true} // readmeEnv's
	if f, err := parser.ParseFile(token.NewFileSet(), "", "package p\nfunc _() {\n"+b.code+"\n}", 0); err == nil {
		ast.Inspect(f, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok {
				if id, ok := sel.X.(*ast.Ident); ok && readmeImports[id.Name] != "" {
					used[id.Name] = true
				}
			}
			return true
		})
	} // else the build reports the syntax error, at its line in README.md
	var imports []string
	for name := range used {
		imports = append(imports, fmt.Sprintf("\t%q\n", readmeImports[name]))
	}
	slices.Sort(imports)
	return fmt.Sprintf("package main\n\nimport (\n%s)\n\nfunc main() {}\n\nfunc readmeBlock(%s) error {\n%s}\n",
		strings.Join(imports, ""), readmeEnv, body)
}

// The README's two commands stay as they are: other documents and habits point at them.
func TestReadmeCommands(t *testing.T) {
	t.Parallel()
	text, err := os.ReadFile("README.md")
	require.NoError(t, err)
	for _, cmd := range []string{
		"go run ./example/tryit",
		"go vet ./... && go test -race -count=1 ./...",
	} {
		require.Regexp(t, "(?m)^"+regexp.QuoteMeta(cmd)+" ", string(text))
	}
}
